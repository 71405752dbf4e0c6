#!/usr/bin/env python
"""Generation speed and decoding-state size: talk_hf models (fixed-size recurrent state) vs transformers models of
the same size (a key/value cache that grows with every token), in one process.

Rows (randomly initialised models: speed does not depend on the weights; every run generates exactly the asked
number of tokens, `min_new_tokens = max_new_tokens`):
  lm           TaLK causal LM vs GPT-2: `--lm_tokens` new tokens after a 16-token prompt, at each batch size of
               `--lm_batch` (at batch 1 a step of either model is mostly its weights and generate()'s own work; with
               more rows the key/value cache that GPT-2 reads at every step grows with each of them).
  translation  TaLK and DynamicConv encoder-decoders vs Marian: greedy and beam-4 translation of `--sentences`
               sources of 24 tokens and </s> in batches of 32, 32 new tokens each.
  document     RFA-doc vs Marian at document windows (`--windows`): sources (then </s>) and outputs of 24 tokens per
               sentence, batches of 8, greedy.
  paper        the RFA paper's decoding-speed setting (Peng et al., ICLR 2021, appendix A.3 and Table 3): RFA-doc vs
               Marian with 6+6 layers, d_model 512, 8 heads, FFN 2048; windows of L sentences (`--paper_windows`,
               the paper's 1, 2, 3, 4, 5, 10, 15) of 20 source (then </s>) and 23 new tokens each, at the paper's
               batch size for L (1024, 512, 512, 256, 256, 128, 96) times `--batch_scale` (the paper's machine was
               a server; 1/8 suits 2 CPU cores); greedy and beam 4. `--speedup_plot` draws the speed-up against L
               (the paper's Figure 4). Windows 30 and 60 go past the paper's (batch 48 and 24: the tokens per batch
               of L = 15). `--int8` also times both models with their Linear layers int8 (`int8_copy`).
               `--ctranslate2 FOLDER` also times the same Marian converted to CTranslate2, the CPU engine for fast
               transformer decoding (fp32 and int8, the same sources and token counts).
  streaming    document translation of one document of `--stream_sentences` sentences (20 source and 23 new
               tokens each) with the paper's model size, batch 1, greedy: RFA-doc streaming (its decoder state
               carried across the document, `translate_document_streaming`) against sliding windows of
               `--stream_window` sentences (`translate_documents`: the forced prefix re-run for every sentence) with
               RFA-doc and with Marian; tokens/s over the first and over the last tenth of the document show whether
               a token's cost grows with the document.
Every translation source ends with </s>, as Marian's tokenizer (and talk_hf's) ends it: each model, CTranslate2's
included, reads the same source tokens. Reported: new tokens per second (median of `--repeats` runs; each streaming
figure the median of its own over the runs), the ratio talk_hf / transformers, and the bytes of the decoding cache at
the end of generation. On a GPU each timed run ends with torch.cuda.synchronize().

With `--compile`, every greedy row is run a second time with both models compiled the way transformers compiles a
decoding step (`cache_implementation="static"` and a `CompileConfig`: CUDA graphs on a GPU, inductor code on a
CPU; the baselines get their static key/value cache). Compilation happens in the untimed warm-up call.

    python benchmarks/benchmark_generation.py --device cpu --lm_tokens 1024 4096 --windows 1 4 8 15
Writes --output (JSON) and prints a markdown table. `--from_results A.json B.json ...` measures nothing: it prints
the table of rows saved by earlier runs and draws --plot / --speedup_plot from them (e.g. the paper's windows and
the longer ones in one plot).
"""

import argparse
import hashlib
import importlib.util
import json
import statistics
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer, pre_tokenizers, processors
from tokenizers import models as token_models
from transformers import (
    CompileConfig,
    GPT2Config,
    GPT2LMHeadModel,
    MarianConfig,
    MarianMTModel,
    PreTrainedTokenizerFast,
)

from talk_hf import (
    DynamicConvConfig,
    DynamicConvForConditionalGeneration,
    RfaDocConfig,
    RfaDocForConditionalGeneration,
    TalkConfig,
    TalkForCausalLM,
    TalkForConditionalGeneration,
    TalkLMConfig,
    translate_document_streaming,
    translate_documents,
)
from talk_hf.training.plot import pyplot, save_figure
from talk_hf.training.tables import markdown_table
from timing import environment, require_at_least, require_positive, save_results
from talk_hf.versions import CACHE_NAME

VOCAB, D, LAYERS, HEADS = 8000, 256, 3, 4
PAPER_BATCH = {1: 1024, 2: 512, 3: 512, 4: 256, 5: 256, 10: 128, 15: 96}  # the RFA paper's batch size per window
# windows past the paper's, with the batch halved for each doubling of the window (tokens per batch as at L = 15)
LONGER_BATCH = {30: 48, 60: 24}
PAPER_SIZE = dict(d_model=512, layers=6, heads=8, ffn=2048)
PAPER_SOURCE, PAPER_TARGET = 20, 23  # tokens per sentence
IDS = dict(vocab_size=VOCAB, pad_token_id=1, bos_token_id=0, eos_token_id=2)
EOS = IDS["eos_token_id"]
SEQ2SEQ = dict(d_model=D, encoder_layers=LAYERS, decoder_layers=LAYERS, encoder_ffn_dim=4 * D, decoder_ffn_dim=4 * D,
               decoder_attention_heads=HEADS, dropout=0.0, decoder_start_token_id=2, **IDS)


def models(kind):
    """(talk_hf model, transformers baseline) of about the same size, in eval mode."""
    if kind == "lm":
        talk = TalkForCausalLM(TalkLMConfig(d_model=D, decoder_layers=LAYERS, decoder_ffn_dim=4 * D,
                                            decoder_heads=HEADS,
                                            decoder_max_offsets=[3, 7, 15, 31, 31, 31][:LAYERS], final_layer_norm=True,
                                            **IDS))
        base = GPT2LMHeadModel(GPT2Config(n_embd=D, n_layer=LAYERS, n_head=HEADS, n_inner=3 * D, n_positions=16384,
                                          **IDS))
    elif kind == "translation":
        talk = TalkForConditionalGeneration(TalkConfig(encoder_heads=HEADS, decoder_heads=HEADS,
                                                       encoder_max_offsets=[3] * LAYERS,
                                                       decoder_max_offsets=[3] * LAYERS, **SEQ2SEQ))
        base = marian()
    elif kind == "dynamic_conv":
        talk = DynamicConvForConditionalGeneration(DynamicConvConfig(encoder_conv_heads=HEADS, decoder_conv_heads=HEADS,
                                                                     **SEQ2SEQ))
        base = marian()
    elif kind == "paper":
        size = PAPER_SIZE
        values = dict(SEQ2SEQ, d_model=size["d_model"], encoder_layers=size["layers"], decoder_layers=size["layers"],
                      encoder_ffn_dim=size["ffn"], decoder_ffn_dim=size["ffn"], decoder_attention_heads=size["heads"])
        talk = RfaDocForConditionalGeneration(RfaDocConfig(encoder_attention_heads=size["heads"], **values))
        base = marian(values, size["heads"])
    else:
        talk = RfaDocForConditionalGeneration(RfaDocConfig(encoder_attention_heads=HEADS, **SEQ2SEQ))
        base = marian()
    return talk.eval(), base.eval()


def marian(values=None, heads=None):
    values = dict(values or SEQ2SEQ, encoder_attention_heads=heads or HEADS, max_position_embeddings=4096,
                  share_encoder_decoder_embeddings=True)
    return MarianMTModel(MarianConfig(**values))


def cache_bytes(cache):
    """Bytes of every distinct tensor reachable from a cache object (keys/values, recurrent states)."""
    seen, total = set(), 0

    def walk(obj, depth):
        nonlocal total
        if isinstance(obj, torch.Tensor):
            if id(obj) not in seen:
                seen.add(id(obj))
                total += obj.numel() * obj.element_size()
        elif depth < 5 and isinstance(obj, (list, tuple)):
            for item in obj:
                walk(item, depth + 1)
        elif depth < 5 and isinstance(obj, dict):
            for item in obj.values():
                walk(item, depth + 1)
        elif depth < 5 and hasattr(obj, "__dict__"):
            for item in vars(obj).values():
                walk(item, depth + 1)

    walk(cache, 0)
    return total


def synchronize(device):
    """Wait for the device's queued work (CUDA kernels run asynchronously): a clock read after this sees it done."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def timed_generate(model, batches, new_tokens, repeats, **kwargs):
    """(median over `repeats` of new tokens per second over all `batches` (input dicts), cache bytes at the end of
    the first batch). The untimed warm-up runs one batch of each input shape: a compiled decoding step is compiled
    again for a new batch size (a last, partial batch), which the timed runs must not include."""
    args = [dict(inputs, min_new_tokens=new_tokens, max_new_tokens=new_tokens, do_sample=False,
                 return_dict_in_generate=True, **kwargs) for inputs in batches]
    out = model.generate(**args[0])  # warm-up, and the cache size
    shapes = {tuple(a["input_ids"].shape): a for a in args}
    shapes.pop(tuple(args[0]["input_ids"].shape))
    for a in shapes.values():
        model.generate(**a)
    rows = sum(inputs["input_ids"].shape[0] for inputs in batches)
    times = []
    for _ in range(repeats):
        synchronize(model.device)
        start = time.perf_counter()
        for a in args:
            model.generate(**a)
        synchronize(model.device)
        times.append(time.perf_counter() - start)
    return rows * new_tokens / statistics.median(times), cache_bytes(getattr(out, CACHE_NAME))


def compiled_decoding(device):
    """generate() arguments under which transformers compiles the decoding step (and captures it in a CUDA graph on
    a GPU: mode "reduce-overhead"); on other devices `_compile_all_devices` asks it to compile anyway."""
    config = CompileConfig(fullgraph=True, mode="reduce-overhead" if device.type == "cuda" else "default")
    config._compile_all_devices = True
    return {"cache_implementation": "static", "compile_config": config}


def compare(name, kind, batches, new_tokens, repeats, talk, base, compiled=False, **kwargs):
    if compiled:
        name, kwargs = f"{name}, compiled", dict(kwargs, **compiled_decoding(talk.device))
        # transformers sizes a static cache for the longest generate() call so far (to avoid recompiling): each row
        # gets one for its own length, or a baseline would attend over the padding of an earlier, longer row
        for model in (talk, base):
            model.__dict__.pop("_previous_max_cache_length", None)
        # every transformers forward (talk_hf's and the baselines') is entered through the same decorator code
        # (can_return_tuple, deprecate_kwarg), and dynamo caps the graphs per code object (recompile_limit, 8):
        # each row starts from no compiled graphs
        torch._dynamo.reset()
    talk_tps, talk_bytes = timed_generate(talk, batches, new_tokens, repeats, **kwargs)
    base_tps, base_bytes = timed_generate(base, batches, new_tokens, repeats, **kwargs)
    row = {"row": name, "kind": kind, "compiled": compiled, "new_tokens": new_tokens, "talk_hf_tokens_per_s": talk_tps,
           "baseline_tokens_per_s": base_tps, "speedup": talk_tps / base_tps, "talk_hf_cache_MB": talk_bytes / 2**20,
           "baseline_cache_MB": base_bytes / 2**20}
    print(f"{name}: {talk_tps:.0f} vs {base_tps:.0f} tokens/s ({row['speedup']:.2f}x), cache "
          f"{row['talk_hf_cache_MB']:.2f} vs {row['baseline_cache_MB']:.2f} MB", flush=True)
    return row


def source(batch, length, device, generator, eos=True):
    """`batch` random rows of `length` word tokens, then </s> (a translation source, ended as Marian's tokenizer
    ends it and as CTranslate2 reads it); eos=False: a language-model prompt, the words alone."""
    ids = torch.randint(5, VOCAB, (batch, length), generator=generator)
    if eos:
        ids = torch.cat([ids, torch.full((batch, 1), EOS)], dim=1)
    ids = ids.to(device)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def run(args):
    device = torch.device(args.device)
    g = torch.Generator().manual_seed(0)
    rows = []
    variants = (False, True) if args.compile else (False,)  # transformers compiles greedy/sampling steps only
    talk, base = (m.to(device) for m in models("lm"))
    for batch in args.lm_batch if "lm" in args.rows else ():
        for n in args.lm_tokens:
            prompt = [source(batch, 16, device, g, eos=False)]
            for compiled in variants:
                rows.append(compare(f"LM {n} new tokens, batch {batch} (TaLK LM vs GPT-2)", "lm", prompt, n,
                                    args.repeats, talk, base, compiled))
    sources = [source(min(32, args.sentences - i), 24, device, g) for i in range(0, args.sentences, 32)]
    for kind, name in (("translation", "TaLK"), ("dynamic_conv", "DynamicConv")) if "translation" in args.rows else ():
        talk, base = (m.to(device) for m in models(kind))
        for beams, compiled in [(1, c) for c in variants] + [(4, False)]:
            rows.append(compare(f"translation of {args.sentences} sentences, beam {beams}, batches of 32 ({name} vs "
                                f"Marian)", "translation", sources, 32, args.repeats, talk, base, compiled,
                                num_beams=beams))
    talk, base = (m.to(device) for m in models("document"))
    for w in args.windows if "document" in args.rows else ():
        document = [source(8, 24 * w, device, g)]
        for compiled in variants:
            rows.append(compare(f"document window {w}, batch 8 (RFA-doc vs Marian)", "document", document, 24 * w,
                                args.repeats, talk, base, compiled))
    if "paper" in args.rows:
        rows += paper_rows(args, device, g, variants)
    if "streaming" in args.rows:
        rows += streaming_rows(args, device, g)
    return rows


def model_fingerprint(model):
    """SHA-256 of a model's config and weights (hex): the same for the same model, different for other weights.
    The config's entries that `save_pretrained` fills in (architectures, dtype, ...) are left out: the tensors'
    dtypes and shapes are hashed with them."""
    config = {k: v for k, v in model.config.to_dict().items()
              if k not in ("architectures", "_name_or_path", "transformers_version", "dtype", "torch_dtype")}
    digest = hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode())
    for name, tensor in model.state_dict().items():
        digest.update(f"{name} {tensor.dtype} {tuple(tensor.shape)}".encode())
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def ctranslate2_translator(marian, folder, compute_type):
    """The benchmark's Marian converted by CTranslate2's own converter (`TransformersConverter`, with the word
    tokenizer's vocabulary, <pad> last: one output row fewer) into FOLDER/ct2-<compute_type>, and loaded on the CPU
    with torch's thread count. A conversion already there is reused only when the fingerprint saved beside it
    (FOLDER/ct2-<compute_type>.sha256, `model_fingerprint`) is this model's: one of an earlier run's other weights is
    converted again. marian None: load the conversion already in FOLDER."""
    import ctranslate2

    folder = Path(folder)
    hf_folder, ct2_folder = folder / "marian", folder / f"ct2-{compute_type}"
    stamp = folder / f"ct2-{compute_type}.sha256"
    if marian is not None:
        fingerprint = model_fingerprint(marian)
        if not (ct2_folder.exists() and stamp.exists() and stamp.read_text() == fingerprint):
            stamp.unlink(missing_ok=True)  # no stamp until the new conversion is complete
            marian.save_pretrained(hf_folder)
            word_tokenizer(pad_last=True).save_pretrained(hf_folder)
            ctranslate2.converters.TransformersConverter(str(hf_folder)).convert(
                str(ct2_folder), quantization=None if compute_type == "float32" else compute_type, force=True)
            stamp.write_text(fingerprint)
    elif not stamp.exists():
        raise FileNotFoundError(f"no complete CTranslate2 conversion in {ct2_folder}")
    return ctranslate2.Translator(str(ct2_folder), device="cpu", compute_type=compute_type, inter_threads=1,
                                  intra_threads=torch.get_num_threads())


def ctranslate2_tokens_per_s(translator, inputs, new_tokens, repeats, num_beams):
    """New tokens per second of CTranslate2 on the same sources (as tokens, </s> included), exactly `new_tokens`
    each (median)."""
    sources = ctranslate2_sources(inputs)
    kwargs = dict(beam_size=num_beams, min_decoding_length=new_tokens, max_decoding_length=new_tokens,
                  max_batch_size=len(sources))
    translator.translate_batch(sources, **kwargs)  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        translator.translate_batch(sources, **kwargs)
        times.append(time.perf_counter() - start)
    return len(sources) * new_tokens / statistics.median(times)


def ctranslate2_sources(inputs):
    """The rows of `inputs` (a `source` dict) as CTranslate2 tokens: the same tokens, </s> ending each."""
    sources = [["</s>" if i == EOS else f"w{i}" for i in row] for row in inputs["input_ids"].tolist()]
    if any(row[-1] != "</s>" for row in sources):
        raise ValueError("a translation source must end with </s> (source(..., eos=True))")
    return sources


def int8_copy(model):
    """A copy of `model` whose nn.Linear layers are int8 (torch's `quantize_dynamic`: int8 weights, activations
    quantized per call; CPU only); the model itself is left as it is."""
    return torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)


def paper_rows(args, device, generator, variants):
    """The RFA paper's setting at each window of `--paper_windows`, with each beam size of `--paper_beams` (greedy
    also compiled with --compile); with --int8, each decoding also with both models' Linear layers int8."""
    talk, base = (m.to(device) for m in models("paper"))
    translators = {c: ctranslate2_translator(base, args.ctranslate2, c) for c in ("float32", "int8")} if \
        args.ctranslate2 else {}
    pairs = [(False, talk, base)] + ([(True, int8_copy(talk), int8_copy(base))] if args.int8 else [])
    rows = []
    for w in args.paper_windows:
        batch = max(1, round({**PAPER_BATCH, **LONGER_BATCH}[w] * args.batch_scale))
        window = [source(batch, PAPER_SOURCE * w, device, generator)]
        greedy = [(1, c) for c in variants] if 1 in args.paper_beams else []
        for beams, compiled in greedy + [(b, False) for b in args.paper_beams if b != 1]:
            for int8, talk_model, base_model in pairs if not compiled else pairs[:1]:
                rows.append(paper_row(args, w, batch, window, beams, compiled, int8, talk_model, base_model,
                                      {} if int8 else translators))
    return rows


def paper_row(args, w, batch, window, beams, compiled, int8, talk, base, translators):
    """One paper row: RFA-doc vs Marian (both int8 with `int8`) at window `w`, and CTranslate2's `translators`."""
    row = compare(f"paper window {w}, batch {batch}, beam {beams}{', int8' if int8 else ''} (RFA-doc vs Marian)",
                  "paper", window, PAPER_TARGET * w, args.repeats, talk, base, compiled, num_beams=beams)
    row.update(window=w, batch=batch, num_beams=beams, int8=int8)
    for compute_type, translator in translators.items() if not compiled else ():
        tps = ctranslate2_tokens_per_s(translator, window[0], PAPER_TARGET * w, args.repeats, beams)
        row[f"ctranslate2_{compute_type}_tokens_per_s"] = tps
        print(f"  CTranslate2 {compute_type}: {tps:.0f} tokens/s (RFA-doc {row['talk_hf_tokens_per_s'] / tps:.2f}x)",
              flush=True)
    return row


def word_tokenizer(pad_last=False):
    """A tokenizer of the benchmark's vocabulary: the talk_hf special tokens (ids 0-4, <sep> 4), then words w5 ..
    w<VOCAB - 1>, split on spaces, </s> appended. `pad_last`: <pad> is the last id instead of w<VOCAB - 1> (and id 1
    <blank>), the layout of Marian's own vocabularies that CTranslate2's converter expects (it drops that row)."""
    vocab = {t: i for i, t in enumerate(["<s>", "<blank>" if pad_last else "<pad>", "</s>", "<unk>", "<sep>"])}
    vocab.update({f"w{i}": i for i in range(5, VOCAB)})
    if pad_last:
        vocab["<pad>"] = vocab.pop(f"w{VOCAB - 1}")
    backend = Tokenizer(token_models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 2)])
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", pad_token="<pad>", eos_token="</s>",
                                   unk_token="<unk>", additional_special_tokens=["<sep>"])


def streaming_rows(args, device, generator):
    """One document of --stream_sentences sentences: RFA-doc streaming vs sliding windows (RFA-doc, Marian), the
    models on `device`."""
    talk, base = (m.to(device) for m in models("paper"))
    tokenizer = word_tokenizer()
    words = torch.randint(5, VOCAB, (args.stream_sentences, PAPER_SOURCE), generator=generator).tolist()
    document = [" ".join(f"w{i}" for i in sentence) for sentence in words]
    kwargs = dict(min_new_tokens=PAPER_TARGET, max_new_tokens=PAPER_TARGET)
    tenth = max(1, len(document) // 10)
    window = args.stream_window
    runs = [  # (row name, model, how it translates one document)
        ("RFA-doc streaming", talk, lambda doc: translate_document_streaming(talk, tokenizer, doc, window, **kwargs)),
        (f"RFA-doc sliding windows of {window}", talk,
         lambda doc: translate_documents(talk, tokenizer, [doc], window, **kwargs)),
        (f"Marian sliding windows of {window}", base,
         lambda doc: translate_documents(base, tokenizer, [doc], window, **kwargs)),
    ]
    rows = []
    for name, model, run_document in runs:
        run_document(document[:2])  # warm-up
        runs_seconds = [_sentence_times(model, lambda: run_document(document)) for _ in range(args.repeats)]
        row = {"row": f"{name}, {len(document)} sentences", "kind": "streaming", "sentences": len(document),
               "repeats": len(runs_seconds),  # each figure: its median over the runs
               "tokens_per_s": statistics.median(len(document) * PAPER_TARGET / sum(s) for s in runs_seconds),
               "first_tenth_tokens_per_s": statistics.median(tenth * PAPER_TARGET / sum(s[:tenth])
                                                             for s in runs_seconds),
               "last_tenth_tokens_per_s": statistics.median(tenth * PAPER_TARGET / sum(s[-tenth:])
                                                            for s in runs_seconds)}
        print(f"{row['row']}: {row['tokens_per_s']:.0f} tokens/s (first tenth {row['first_tenth_tokens_per_s']:.0f}, "
              f"last tenth {row['last_tenth_tokens_per_s']:.0f})", flush=True)
        rows.append(row)
    return rows


def _sentence_times(model, run):
    """Run `run()` and return the seconds of each `model.generate` call it made (one per sentence of a single
    document, streaming or sliding), the device synchronized before each clock read."""
    seconds, generate = [], model.generate

    def timed_generate(*args, **kwargs):
        synchronize(model.device)
        start = time.perf_counter()
        out = generate(*args, **kwargs)
        synchronize(model.device)
        seconds.append(time.perf_counter() - start)
        return out

    model.generate = timed_generate
    try:
        run()
    finally:
        del model.generate  # back to the class's method
    return seconds


def speedup_plot(rows, path):
    """RFA-doc's speed-up over Marian against the window L, one line per decoding (the RFA paper's Figure 4)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    lines = [((1, False, False), "greedy"), ((1, True, False), "greedy, compiled"), ((4, False, False), "beam 4"),
             ((1, False, True), "greedy, int8"), ((4, False, True), "beam 4, int8")]
    for (beams, compiled, int8), label in lines:
        line = [r for r in rows if r["kind"] == "paper" and r["num_beams"] == beams and r["compiled"] == compiled
                and r.get("int8", False) == int8]
        if line:
            ax.plot([r["window"] for r in line], [r["speedup"] for r in line], marker="o", label=label)
    ax.axhline(1.0, color="gray", linewidth=0.8)
    ax.set_xlabel("window L (sentences)")
    ax.set_ylabel("RFA-doc tokens/s / Marian tokens/s")
    ax.legend()
    save_figure(fig, path)


COMPARED = [
    ("row", lambda r: r["row"]),
    ("new tokens", lambda r: str(r["new_tokens"])),
    ("talk_hf tokens/s", lambda r: f"{r['talk_hf_tokens_per_s']:.0f}"),
    ("transformers tokens/s", lambda r: f"{r['baseline_tokens_per_s']:.0f}"),
    ("speed-up", lambda r: f"{r['speedup']:.2f}x"),
    ("cache MB (talk_hf / transformers)", lambda r: f"{r['talk_hf_cache_MB']:.2f} / {r['baseline_cache_MB']:.2f}"),
]
STREAMED = [
    ("row", lambda r: r["row"]),
    ("new tokens", lambda r: str(r["sentences"] * PAPER_TARGET)),
    ("tokens/s", lambda r: f"{r['tokens_per_s']:.0f}"),
    ("first tenth", lambda r: f"{r['first_tenth_tokens_per_s']:.0f}"),
    ("last tenth", lambda r: f"{r['last_tenth_tokens_per_s']:.0f}"),
]
CTRANSLATE2 = [
    ("row", lambda r: r["row"]),
    ("CTranslate2 tokens/s, fp32 / int8",
     lambda r: f"{r['ctranslate2_float32_tokens_per_s']:.0f} / {r['ctranslate2_int8_tokens_per_s']:.0f}"),
    ("talk_hf / CTranslate2 fp32",
     lambda r: f"{r['talk_hf_tokens_per_s'] / r['ctranslate2_float32_tokens_per_s']:.2f}x"),
]


def table(rows):
    """The compared rows, then the streaming rows and the CTranslate2 timings when there are any."""
    tables = [(COMPARED, [r for r in rows if r["kind"] != "streaming"]),
              (STREAMED, [r for r in rows if r["kind"] == "streaming"]),
              (CTRANSLATE2, [r for r in rows if "ctranslate2_float32_tokens_per_s" in r])]
    return "\n\n".join(markdown_table(part, columns) for columns, part in tables if part)


def plot(rows, path):
    """New tokens/s of each row: the talk_hf model beside its transformers baseline."""
    rows = [r for r in rows if r["kind"] != "streaming"]
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 4.5))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["talk_hf_tokens_per_s"] for r in rows], width=0.4, label="talk_hf")
    ax.bar([x + 0.2 for x in xs], [r["baseline_tokens_per_s"] for r in rows], width=0.4, label="transformers")
    ax.set_xticks(list(xs), [r["row"].split(" (")[0] for r in rows], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("new tokens / s")
    ax.legend()
    save_figure(fig, path)


def saved_rows(paths):
    """The rows of the --output files `paths`, in order."""
    rows = []
    for path in paths:
        with open(path) as f:
            rows.extend(json.load(f)["rows"])
    return rows


def check_options(parser, args):
    """A usage error (exit status 2) for a count, size or scale out of range, and for options that do not go
    together, before any model is built."""
    if args.from_results and args.output:
        parser.error("--from_results measures nothing: there is no new --output to write")
    if args.ctranslate2 and importlib.util.find_spec("ctranslate2") is None:
        parser.error("--ctranslate2 needs the ctranslate2 package: pip install ctranslate2")
    require_at_least(parser, args, 1, "lm_tokens", "lm_batch", "windows", "sentences", "paper_beams",
                     "stream_sentences", "stream_window", "repeats")
    require_positive(parser, args, "batch_scale")
    if args.int8 and torch.device(args.device).type != "cpu":
        parser.error(f"--int8 quantizes with torch's quantize_dynamic, which runs on the CPU only (--device "
                     f"{args.device})")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rows", nargs="+", choices=["lm", "translation", "document", "paper", "streaming"],
                        default=["lm", "translation", "document"])
    parser.add_argument("--lm_tokens", type=int, nargs="+", default=[1024])
    parser.add_argument("--lm_batch", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--windows", type=int, nargs="+", default=[1, 4, 8, 15])
    parser.add_argument("--sentences", type=int, default=32, help="sources translated per translation row, in "
                        "batches of 32")
    parser.add_argument("--paper_windows", type=int, nargs="+", default=sorted(PAPER_BATCH),
                        choices=sorted({**PAPER_BATCH, **LONGER_BATCH}),
                        help="windows L of the paper rows: the paper's, or 30 and 60 (batch 48 and 24 before scaling)")
    parser.add_argument("--batch_scale", type=float, default=1.0, help="the paper rows' batch sizes times this")
    parser.add_argument("--paper_beams", type=int, nargs="+", default=[1, 4], help="beam sizes of the paper rows")
    parser.add_argument("--ctranslate2", default=None, metavar="FOLDER",
                        help="also time the paper rows' Marian converted to CTranslate2 (fp32 and int8; `pip install "
                             "ctranslate2`), converted into FOLDER")
    parser.add_argument("--int8", action="store_true",
                        help="also run the paper rows (not compiled) with both models' Linear layers int8 (CPU)")
    parser.add_argument("--speedup_plot", default=None, help="PNG path for the paper rows' speed-up against L")
    parser.add_argument("--stream_sentences", type=int, default=200, help="sentences of the streaming row's document")
    parser.add_argument("--stream_window", type=int, default=4, help="the sliding windows' length in the streaming row")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each row (the median is reported)")
    parser.add_argument("--compile", action="store_true", help="also run the greedy rows with compiled decoding")
    parser.add_argument("--output", default=None)
    parser.add_argument("--plot", default=None, help="PNG path for a plot of the rows")
    parser.add_argument("--from_results", nargs="+", default=None, metavar="JSON",
                        help="measure nothing: the table and plots of the rows saved in these --output files")
    args = parser.parse_args(argv)
    check_options(parser, args)
    if args.from_results:
        rows = saved_rows(args.from_results)
    else:
        torch.manual_seed(0)
        rows = run(args)
    print(table(rows))
    if args.plot:
        plot(rows, args.plot)
    if args.speedup_plot:
        speedup_plot(rows, args.speedup_plot)
    if args.output:
        save_results(args.output, environment(args.device, args), rows)
    return rows


if __name__ == "__main__":
    main()
