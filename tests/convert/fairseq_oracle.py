"""fairseq itself (PyPI fairseq-fixed 0.12.3.1) as the oracle of the checkpoint converter.

`make install` installs it into .venv/fairseq-0.12.3.1 (a --target folder, outside the venv's site-packages, so its
pins (hydra-core, omegaconf) and its pytest plugin stay out of the venv); `import_fairseq()` puts that folder at the
end of sys.path. Reference models are the released architectures scaled down (same structure: GLU on and off,
lightweight and dynamic kernels, the embedding sharing of each release, the IWSLT and WMT variants), trained for a few
steps on Multi30k so that they end their outputs, and saved with fairseq's own checkpoint code.
"""

import argparse
import gzip
import importlib
import io
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
FAIRSEQ_DIR = Path(sys.prefix) / "fairseq-0.12.3.1"
MULTI30K = ROOT / "data" / "multi30k"
SOURCE_LANG, TARGET_LANG = "de", "en"

# scaled-down released architectures: name -> (fairseq arch, its flags)
DECODER_KERNELS = [3, 5]
TINY = ["--encoder-embed-dim", "16", "--decoder-embed-dim", "16", "--encoder-layers", "3", "--decoder-layers", "2",
        "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32", "--encoder-attention-heads", "2",
        "--decoder-attention-heads", "2", "--encoder-kernel-size-list", "[3,5,7]",
        "--decoder-kernel-size-list", str(DECODER_KERNELS).replace(" ", "")]
LIGHT = ["--encoder-conv-type", "lightweight", "--decoder-conv-type", "lightweight"]
DYNAMIC = ["--encoder-conv-type", "dynamic", "--decoder-conv-type", "dynamic"]
NO_GLU, GLU = ["--encoder-glu", "0", "--decoder-glu", "0"], ["--encoder-glu", "1", "--decoder-glu", "1"]
VARIANTS = {
    "lightconv.no_glu.iwslt14": ("lightconv_iwslt_de_en", LIGHT + NO_GLU, False),
    "dynamicconv.no_glu.iwslt14": ("lightconv_iwslt_de_en", DYNAMIC + NO_GLU, False),
    "lightconv.no_glu.wmt16": ("lightconv_wmt_en_de_big", LIGHT + NO_GLU + ["--share-all-embeddings"], True),
    "dynamicconv.glu.wmt16": ("lightconv_wmt_en_de_big", DYNAMIC + GLU + ["--share-all-embeddings"], True),
    "lightconv.glu.wmt14.en-fr": ("lightconv_wmt_en_fr_big", LIGHT + GLU + ["--share-all-embeddings"], True),
    "dynamicconv.glu.wmt17.zh-en": (
        "lightconv_wmt_zh_en_big", DYNAMIC + GLU + ["--share-decoder-input-output-embed"], False,
    ),
    "dynamicconv.glu.prenorm": (
        "lightconv_wmt_en_de", DYNAMIC + GLU + ["--encoder-normalize-before", "--decoder-normalize-before"], False,
    ),
}


def import_fairseq():
    """fairseq's modules, or None when it is not installed (the tests then skip)."""
    if str(FAIRSEQ_DIR) not in sys.path and FAIRSEQ_DIR.is_dir():
        sys.path.append(str(FAIRSEQ_DIR))
    try:
        return importlib.import_module("fairseq")
    except ImportError:
        return None


def read_lines(lang, count, split="val"):
    with gzip.open(MULTI30K / f"{split}.{lang}.gz", "rt", encoding="utf-8") as handle:
        return [next(handle).strip() for _ in range(count)]


def moses_tokenize(lines, lang):
    from fairseq.data.encoders.moses_tokenizer import MosesTokenizer, MosesTokenizerConfig

    tok = MosesTokenizer(MosesTokenizerConfig(source_lang=lang, target_lang=lang))
    return [tok.encode(line) for line in lines]


def learn_bpecodes(path, tokenized_lines, merges=300):
    """Joint subword-nmt codes learned from the tokenised text, written to path."""
    from subword_nmt.learn_bpe import learn_bpe

    with open(path, "w", encoding="utf-8") as out:
        learn_bpe(io.StringIO("\n".join(tokenized_lines) + "\n"), out, merges)


def apply_bpe(codes, lines):
    from fairseq.data.encoders.subword_nmt_bpe import SubwordNMTBPE, SubwordNMTBPEConfig

    bpe = SubwordNMTBPE(SubwordNMTBPEConfig(bpe_codes=str(codes)))
    return [bpe.encode(line) for line in lines]


def build_dictionary(lines):
    """A fairseq Dictionary of the BPE'd lines, padded to a multiple of 8 (madeupwords) as fairseq-preprocess does."""
    from fairseq.data import Dictionary

    d = Dictionary()
    for line in lines:
        for word in line.split():
            d.add_symbol(word)
    d.finalize(padding_factor=8)
    return d


class Corpus:
    """Multi30k validation sentences, tokenised, BPE'd (tiny joint codes) and the dictionaries of both sides."""

    def __init__(self, folder, count=300):
        self.folder = Path(folder)
        self.raw = {lang: read_lines(lang, count) for lang in (SOURCE_LANG, TARGET_LANG)}
        tokenized = {lang: moses_tokenize(lines, lang) for lang, lines in self.raw.items()}
        self.codes = self.folder / "bpecodes"
        learn_bpecodes(self.codes, tokenized[SOURCE_LANG] + tokenized[TARGET_LANG])
        self.bpe = {lang: apply_bpe(self.codes, lines) for lang, lines in tokenized.items()}
        self.dicts = {lang: build_dictionary(lines) for lang, lines in self.bpe.items()}
        self.joined = build_dictionary(self.bpe[SOURCE_LANG] + self.bpe[TARGET_LANG])

    def write_release(self, folder, joined):
        """dict.de.txt, dict.en.txt and bpecodes, as the release archives hold them."""
        folder.mkdir(parents=True, exist_ok=True)
        for lang in (SOURCE_LANG, TARGET_LANG):
            (self.joined if joined else self.dicts[lang]).save(str(folder / f"dict.{lang}.txt"))
        (folder / "bpecodes").write_bytes(self.codes.read_bytes())


def parse_args(folder, arch, flags):
    """fairseq-train's argument parsing of a translation run on `folder` -> (args Namespace, cfg)."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    parser = options.get_training_parser()
    argv = [str(folder), "--task", "translation", "-s", SOURCE_LANG, "-t", TARGET_LANG, "--arch", arch, *TINY, *flags,
            "--optimizer", "adam", "--lr", "0.003", "--criterion", "cross_entropy", "--cpu", "--seed", "1",
            "--save-dir", str(folder / "checkpoints")]
    args = options.parse_args_and_arch(parser, argv)
    return args, convert_namespace_to_omegaconf(args)


def encode(dictionary, bpe_lines):
    """BPE'd lines -> list of 1-D id tensors ending in </s> (fairseq's encode_line)."""
    return [dictionary.encode_line(line, add_if_not_exist=False).long() for line in bpe_lines]


def collate(sequences, pad, left_pad):
    """list of 1-D tensors -> (B, T) padded batch, lengths."""
    width = max(len(s) for s in sequences)
    batch = torch.full((len(sequences), width), pad, dtype=torch.long)
    for i, s in enumerate(sequences):
        if left_pad:
            batch[i, width - len(s):] = s
        else:
            batch[i, : len(s)] = s
    return batch, torch.tensor([len(s) for s in sequences])


def shift_right(targets, eos, pad):
    """fairseq's prev_output_tokens: </s> then the target without its last token (right-padded)."""
    prev = [torch.cat([torch.tensor([eos]), t[:-1]]) for t in targets]
    return collate(prev, pad, left_pad=False)[0]


def train_briefly(model, task, corpus, steps=150, batch=16, max_tokens=14):
    """A few Adam steps of teacher-forced cross-entropy on short Multi30k pairs, so that outputs end in </s>."""
    src_dict, tgt_dict = task.source_dictionary, task.target_dictionary
    sources, targets = encode(src_dict, corpus.bpe[SOURCE_LANG]), encode(tgt_dict, corpus.bpe[TARGET_LANG])
    pairs = [(s, t) for s, t in zip(sources, targets) if len(s) <= max_tokens and len(t) <= max_tokens]
    generator = torch.Generator().manual_seed(0)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        chosen = [pairs[i] for i in torch.randint(len(pairs), (batch,), generator=generator)]
        src, lengths = collate([s for s, _ in chosen], src_dict.pad(), left_pad=True)
        targets = collate([t for _, t in chosen], tgt_dict.pad(), left_pad=False)[0]
        logits = model(src, lengths, shift_right([t for _, t in chosen], tgt_dict.eos(), tgt_dict.pad()))[0]
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=tgt_dict.pad())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


def save_trainer_checkpoint(path, cfg, task, model):
    """The checkpoint fairseq-train writes (Trainer.save_checkpoint: cfg as plain containers, model, optimizer and
    extra state)."""
    from fairseq.trainer import Trainer

    trainer = Trainer(cfg, task, model, task.build_criterion(cfg.criterion))
    trainer.consolidate_optimizer()
    trainer.save_checkpoint(str(path), {"train_iterator": {"epoch": 1, "iterations_in_epoch": 150}, "val_loss": 3.0})


# The parameter names of the 2019 release (fairseq 0.6): encoder norms in a ModuleList, the decoder's unshared output
# matrix as a bare parameter, cross-attention q/k/v stacked in one in_proj.
def legacy_state_dict(state):
    old = {}
    for key, value in state.items():
        key = key.replace(".layer_norm1.", ".layer_norms.0.").replace(".layer_norm2.", ".layer_norms.1.")
        key = "decoder.embed_out" if key == "decoder.output_projection.weight" else key
        old[key] = value
    for prefix in {k.rsplit(".", 2)[0] for k in old if ".encoder_attn.q_proj." in k}:
        for kind in ("weight", "bias"):
            parts = [old.pop(f"{prefix}.{p}_proj.{kind}") for p in "qkv"]
            old[f"{prefix}.in_proj_{kind}"] = torch.cat(parts, 0)
    return old


def save_legacy_checkpoint(path, args, model, old_names=True):
    """An args-style checkpoint as fairseq 0.6's save_state wrote it (args Namespace, model, optimizer history,
    extra state, optimizer state), with the 2019 parameter names (or today's: a checkpoint fairseq 0.12 loads),
    written by fairseq's torch_persistent_save."""
    from fairseq import checkpoint_utils

    optimizer = torch.optim.Adam(model.parameters())
    state = {
        "args": argparse.Namespace(**vars(args)),
        "model": legacy_state_dict(model.state_dict()) if old_names else model.state_dict(),
        "optimizer_history": [{"criterion_name": "CrossEntropyCriterion", "optimizer_name": "FairseqAdam",
                               "lr_scheduler_state": {"best": 3.0}, "num_updates": 150}],
        "last_optimizer_state": optimizer.state_dict(),
        "extra_state": {"train_iterator": {"epoch": 1}, "val_loss": 3.0},
    }
    checkpoint_utils.torch_persistent_save(state, str(path))


def build_release(corpus, folder, name, legacy=False, old_names=True):
    """A scaled-down release folder for VARIANTS[name] -> (folder, fairseq model (eval), task, args); legacy: an
    args checkpoint (old_names: with the 2019 parameter names) instead of fairseq-train's cfg checkpoint."""
    from fairseq import tasks

    arch, flags, joined = VARIANTS[name]
    corpus.write_release(folder, joined)
    args, cfg = parse_args(folder, arch, flags)
    task = tasks.setup_task(cfg.task)
    torch.manual_seed(0)
    model = train_briefly(task.build_model(cfg.model), task, corpus)
    if legacy:
        save_legacy_checkpoint(folder / "model.pt", args, model, old_names)
    else:
        save_trainer_checkpoint(folder / "model.pt", cfg, task, model)
    return folder, model, task, args


def sequence_generator(model, task, beam):
    """fairseq-generate's search with its defaults (max_len_b 200, min_len 1, lenpen 1)."""
    from fairseq.sequence_generator import SequenceGenerator

    return SequenceGenerator([model], task.target_dictionary, beam_size=beam)


def fairseq_generate(model, task, sources, beam):
    """Left-padded source id tensors -> the best hypothesis of each (token list ending in </s>)."""
    src, lengths = collate(sources, task.source_dictionary.pad(), left_pad=True)
    generator = sequence_generator(model, task, beam)
    with torch.no_grad():
        hypos = generator.generate([model], {"net_input": {"src_tokens": src, "src_lengths": lengths}})
    return [h[0]["tokens"].tolist() for h in hypos]


def fairseq_step_logits(model, src, lengths, prev_output_tokens):
    """fairseq's incremental decoding (what its generator runs): the logits of every prefix, one step at a time."""
    encoder_out = model.encoder(src, lengths)
    state = torch.jit.annotate(dict, {})
    steps = []
    for t in range(prev_output_tokens.shape[1]):
        logits, _ = model.decoder(prev_output_tokens[:, : t + 1], encoder_out=encoder_out, incremental_state=state)
        steps.append(logits[:, -1])
    return torch.stack(steps, 1)
