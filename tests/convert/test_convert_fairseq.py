"""The fairseq LightConv/DynamicConv converter against fairseq itself (tests/convert/fairseq_oracle.py): scaled-down
releases of every released family, saved with fairseq's checkpoint code, converted, and compared: logits, greedy and
beam search outputs, the text pipeline, loading through the Auto classes and pipelines (with and without talk_hf),
and the refusals (unknown architecture, unsupported option, a pickle naming a global outside the allowlist)."""

import argparse
import json
import logging
import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from . import fairseq_oracle as oracle

fairseq = oracle.import_fairseq()
pytestmark = pytest.mark.skipif(
    fairseq is None, reason=f"fairseq is not installed (`make install` puts it in {oracle.FAIRSEQ_DIR})"
)

ROOT = Path(__file__).resolve().parents[2]
FP64_TOLERANCE = 1e-6  # fairseq softmaxes attention (and LightConv kernels) in float32 even in a float64 model
FP32_TOLERANCE = 1e-4
SENTENCES = 8


@contextmanager
def one_thread():
    """The tiny models run fastest on one thread (and do not fight the other tests for the cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return oracle.Corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def releases(corpus, tmp_path_factory):
    """name -> (release folder, fairseq model, fairseq task, converted folder), for every variant."""
    from talk_hf.convert_fairseq import convert_fairseq_checkpoint

    built = {}
    with one_thread():
        for name in oracle.VARIANTS:
            folder, model, task, _ = oracle.build_release(corpus, tmp_path_factory.mktemp(name) / "release", name)
            built[name] = (folder, model, task, convert_fairseq_checkpoint(folder, folder.parent / "converted"))
    return built


def load_converted(folder, dtype):
    from transformers import AutoModelForSeq2SeqLM

    return AutoModelForSeq2SeqLM.from_pretrained(folder).eval().to(dtype)


def batch(corpus, task, first=0, count=SENTENCES):
    """Real Multi30k pairs in the release's dictionaries: left-padded sources, lengths, targets."""
    sources = oracle.encode(task.source_dictionary, corpus.bpe[oracle.SOURCE_LANG][first:first + count])
    targets = oracle.encode(task.target_dictionary, corpus.bpe[oracle.TARGET_LANG][first:first + count])
    return sources, targets


def relative_error(reference, result, mask):
    """max over real positions of |result - reference| / |reference| (norms over the vocabulary)."""
    return ((result - reference).norm(dim=-1) / reference.norm(dim=-1))[mask].max().item()


def teacher_forced(model, ours, sources, targets, pad=1, eos=2):
    src, lengths = oracle.collate(sources, pad, left_pad=True)
    prev = oracle.shift_right(targets, eos, pad)
    with torch.no_grad():
        reference = model(src, lengths, prev)[0]
        result = ours(input_ids=src, attention_mask=(src != pad).long(), decoder_input_ids=prev).logits
    mask = oracle.collate(targets, pad, left_pad=False)[0] != pad
    return reference, result, mask


@pytest.mark.parametrize("name", list(oracle.VARIANTS))
def test_logits_equal_fairseq_in_float64_and_float32(releases, corpus, name):
    folder, model, task, converted = releases[name]
    sources, targets = batch(corpus, task)
    # fairseq's teacher-forced DynamicConv decoder normalises short targets differently (T < K, docs/converting.md)
    assert max(len(t) for t in targets) >= oracle.DECODER_KERNELS[-1]
    errors = {}
    with one_thread():
        for dtype in (torch.float64, torch.float32):
            errors[dtype] = relative_error(*teacher_forced(model.to(dtype), load_converted(converted, dtype),
                                                           sources, targets))
    model.float()
    print(f"{name}: max relative logit error fp64 {errors[torch.float64]:.2e}, fp32 {errors[torch.float32]:.2e}")
    assert errors[torch.float64] < FP64_TOLERANCE and errors[torch.float32] < FP32_TOLERANCE


@pytest.mark.parametrize("name", ["dynamicconv.glu.wmt16", "lightconv.no_glu.iwslt14"])
def test_short_targets_follow_fairseqs_decoding_steps(releases, corpus, name):
    """For targets shorter than a decoder kernel the converted model gives the logits of fairseq's incremental
    decoding (what fairseq-generate runs)."""
    folder, model, task, converted = releases[name]
    sources, targets = batch(corpus, task)
    targets = [t[:3] for t in targets]  # T = 3 < K of the second decoder layer
    src, lengths = oracle.collate(sources, 1, left_pad=True)
    prev = oracle.shift_right(targets, 2, 1)
    with one_thread(), torch.no_grad():
        model.double()
        steps = oracle.fairseq_step_logits(model, src, lengths, prev)
        ours = load_converted(converted, torch.float64)
        result = ours(input_ids=src, attention_mask=(src != 1).long(), decoder_input_ids=prev).logits
        model.float()
    assert relative_error(steps, result, torch.ones(prev.shape, dtype=torch.bool)) < FP64_TOLERANCE


def generate_both(model, task, ours, sources, beam):
    reference = oracle.fairseq_generate(model, task, sources, beam)
    src, _ = oracle.collate(sources, 1, left_pad=True)
    with torch.no_grad():
        out = ours.generate(input_ids=src, attention_mask=(src != 1).long(), num_beams=beam)
    return reference, [[t for t in row[1:].tolist() if t != 1] for row in out]


@pytest.mark.parametrize("name", list(oracle.VARIANTS))
def test_greedy_and_beam_search_outputs_equal_fairseqs(releases, corpus, name):
    """fairseq's SequenceGenerator (its defaults: max_len_b 200, min_len 1, lenpen 1) against generate() with the
    converted generation config, on the same sources: identical token sequences."""
    folder, model, task, converted = releases[name]
    sources, _ = batch(corpus, task, first=100)
    with one_thread():
        model.double()
        ours = load_converted(converted, torch.float64)
        results = {beam: generate_both(model, task, ours, sources, beam) for beam in (1, 4)}
        model.float()
    for beam, (reference, result) in results.items():
        same = sum(a == b for a, b in zip(reference, result))
        print(f"{name}: beam {beam}: {same}/{len(reference)} identical")
        assert all(r[-1] == 2 for r in reference), "the reference outputs should end in </s> before the limit"
        assert result == reference


def test_generation_config_holds_fairseqs_defaults(releases):
    from transformers import GenerationConfig

    gen = GenerationConfig.from_pretrained(releases["dynamicconv.glu.wmt16"][3])
    assert (gen.num_beams, gen.length_penalty, gen.early_stopping) == (5, 1.0, True)
    assert (gen.max_length, gen.min_length, gen.forced_eos_token_id) == (202, 2, 2)  # with the decoder start
    assert gen.max_new_tokens is None and gen.min_new_tokens is None
    assert gen.suppress_tokens == [1] and gen.decoder_start_token_id == 2


def test_a_max_length_given_per_call_limits_the_output(releases):
    """As for any transformers model (the converted defaults do not take precedence over it)."""
    converted = releases["dynamicconv.glu.wmt16"][3]
    model = load_converted(converted, torch.float32)
    src = torch.tensor([[5, 6, 7, 8, 2]])
    with torch.no_grad():
        out = model.generate(input_ids=src, num_beams=1, max_length=5, bad_words_ids=[[2]])
    assert out.shape[1] == 5


def test_config_follows_each_releases_embedding_sharing(releases):
    from transformers import AutoConfig

    expected = {
        "lightconv.no_glu.iwslt14": (False, False), "dynamicconv.glu.wmt16": (True, True),
        "dynamicconv.glu.wmt17.zh-en": (True, False),
    }
    for name, ties in expected.items():
        folder, model, task, converted = releases[name]
        config = AutoConfig.from_pretrained(converted)
        assert (config.tie_word_embeddings, config.tie_encoder_embeddings) == ties
        assert config.encoder_vocab_size == len(task.source_dictionary)
        assert config.vocab_size == len(task.target_dictionary)
        assert config.position_offset == 2
        assert config.conv_type == ("lightweight" if name.startswith("lightconv") else "dynamic")


def test_legacy_args_checkpoint_with_2019_parameter_names(corpus, tmp_path):
    """An args-style checkpoint (fairseq 0.6's layout: layer_norms.N, embed_out, in_proj_weight) converts to the same
    function as the fairseq model it was saved from."""
    from talk_hf.convert_fairseq import convert_fairseq_checkpoint

    with one_thread():
        folder, model, task, args = oracle.build_release(corpus, tmp_path / "release", "dynamicconv.no_glu.iwslt14",
                                                         legacy=True)
        state = torch.load(folder / "model.pt", weights_only=False)
        assert "decoder.embed_out" in state["model"] and state.get("cfg") is None
        assert any(k.endswith("in_proj_weight") for k in state["model"])
        converted = convert_fairseq_checkpoint(folder, tmp_path / "converted")
        sources, targets = batch(corpus, task)
        error = relative_error(*teacher_forced(model.double(), load_converted(converted, torch.float64), sources,
                                               targets))
    assert error < FP64_TOLERANCE


# ---------------------------------------------------------------------------------------------------------------
# The text pipeline


def hub_interface(folder):
    """fairseq's hub interface on a release folder (its torch.load runs weights-only on torch >= 2.6: the checkpoint's
    Namespace is allowed as the converter allows it)."""
    from fairseq.models.lightconv import LightConvModel

    with torch.serialization.safe_globals([argparse.Namespace]):
        hub = LightConvModel.from_pretrained(
            str(folder), checkpoint_file="model.pt", data_name_or_path=str(folder), tokenizer="moses",
            bpe="subword_nmt", bpe_codes=str(folder / "bpecodes"),
        )
    return hub.eval()


# sentences that Moses tokenises differently in German and English (a numeral's full stop, an apostrophe)
LANGUAGE_SENSITIVE = ["Er kam am 3. Oktober zurück.", "Der Mann, der's weiß, lacht."]


def check_tokenizer_against_hub(hub, tokenizer, task):
    """Encoding (source and text_target) and decoding of Multi30k sentences the BPE codes were not learned on."""
    sources = oracle.read_lines(oracle.SOURCE_LANG, 340)[300:] + LANGUAGE_SENSITIVE
    targets = oracle.read_lines(oracle.TARGET_LANG, 340)[300:]
    for text in sources:
        assert tokenizer(text)["input_ids"] == hub.encode(text).tolist()
    # targets as fairseq's data pipeline prepares them: its Moses encoder in the target language, then the hub's BPE
    target_ids = [task.target_dictionary.encode_line(hub.apply_bpe(t), add_if_not_exist=False)
                  for t in oracle.moses_tokenize(targets, tokenizer.target_lang)]
    assert tokenizer(text_target=targets)["input_ids"] == [ids.tolist() for ids in target_ids]
    assert any(task.target_dictionary.unk() in ids.tolist() for ids in target_ids)  # <unk> is printed, not dropped
    decoded = [tokenizer.decode(ids, skip_special_tokens=True) for ids in target_ids]
    assert decoded == [hub.decode(ids) for ids in target_ids]


@pytest.mark.parametrize("name", ["dynamicconv.glu.wmt16", "lightconv.no_glu.iwslt14"])
def test_tokenizer_reproduces_fairseqs_hub_encode_and_decode(releases, name):
    """cfg checkpoints (fairseq-train's today): the hub's Moses runs with its defaults, English on both sides."""
    from transformers import AutoTokenizer

    folder, model, task, converted = releases[name]
    hub = hub_interface(folder)
    assert (hub.tokenizer.tok.lang, hub.tokenizer.detok.lang) == ("en", "en")
    check_tokenizer_against_hub(hub, AutoTokenizer.from_pretrained(converted), task)


def test_tokenizer_of_an_args_checkpoint_uses_its_languages_as_the_hub_does(corpus, tmp_path):
    """args checkpoints (the released models' layout): fairseq's hub tokenises the source with Moses in the source
    language and detokenises in the target language; so does the converted tokenizer."""
    from talk_hf.convert_fairseq import convert_fairseq_checkpoint
    from transformers import AutoTokenizer

    with one_thread():
        folder, model, task, args = oracle.build_release(corpus, tmp_path / "release", "lightconv.no_glu.iwslt14",
                                                         legacy=True, old_names=False)
    hub = hub_interface(folder)
    assert (hub.tokenizer.tok.lang, hub.tokenizer.detok.lang) == (oracle.SOURCE_LANG, oracle.TARGET_LANG)
    tokenizer = AutoTokenizer.from_pretrained(convert_fairseq_checkpoint(folder, tmp_path / "converted"))
    assert (tokenizer.source_lang, tokenizer.target_lang) == (oracle.SOURCE_LANG, oracle.TARGET_LANG)
    english = [tokenizer.moses_tokenize(text, "en") for text in LANGUAGE_SENSITIVE]
    assert english != [tokenizer.moses_tokenize(text, oracle.SOURCE_LANG) for text in LANGUAGE_SENSITIVE]
    check_tokenizer_against_hub(hub, tokenizer, task)


def test_pipeline_translates_as_fairseqs_hub_interface(releases):
    from transformers import pipeline

    folder, model, task, converted = releases["dynamicconv.glu.wmt16"]
    sources = oracle.read_lines(oracle.SOURCE_LANG, 310)[300:]
    expected = hub_interface(folder).translate(sources, beam=4)
    translator = pipeline("translation", model=str(converted))
    assert [r["translation_text"] for r in translator(sources, num_beams=4)] == expected


def test_without_bpecodes_the_tokenizer_takes_bpe_text_and_says_so(releases, corpus, tmp_path, caplog):
    from talk_hf.convert_fairseq import convert_fairseq_checkpoint
    from transformers import AutoTokenizer

    folder = releases["lightconv.no_glu.iwslt14"][0]
    bare = tmp_path / "release"
    bare.mkdir()
    for name in ("model.pt", "dict.de.txt", "dict.en.txt"):
        (bare / name).write_bytes((folder / name).read_bytes())
    with caplog.at_level(logging.WARNING, logger="talk_hf.convert_fairseq"):
        out = convert_fairseq_checkpoint(bare, tmp_path / "converted")
    assert "no bpecodes" in caplog.text and "already Moses-tokenised and BPE'd" in (out / "README.md").read_text()
    tokenizer = AutoTokenizer.from_pretrained(out)
    task = releases["lightconv.no_glu.iwslt14"][2]
    source, target = corpus.bpe[oracle.SOURCE_LANG][0], corpus.bpe[oracle.TARGET_LANG][0]
    assert "@@ " in source and "@@ " in target
    assert tokenizer(source)["input_ids"] == task.source_dictionary.encode_line(source, add_if_not_exist=False).tolist()
    target_ids = task.target_dictionary.encode_line(target, add_if_not_exist=False)
    assert tokenizer.decode(target_ids, skip_special_tokens=True) == task.target_dictionary.string(target_ids, "@@ ")


# ---------------------------------------------------------------------------------------------------------------
# Loading with and without the package, the CLI

CHILD = """
import json, sys
spec = json.loads(sys.argv[1])
if spec["block_talk_hf"]:
    sys.modules["talk_hf"] = None  # a user without the package
else:
    import talk_hf  # noqa: F401
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, pipeline
kwargs = {"trust_remote_code": True} if spec["block_talk_hf"] else {}
model = AutoModelForSeq2SeqLM.from_pretrained(spec["folder"], **kwargs)
tokenizer = AutoTokenizer.from_pretrained(spec["folder"], **kwargs)
batch = tokenizer(spec["sources"], return_tensors="pt", padding=True)
ids = model.generate(**batch, num_beams=4).tolist()
translator = pipeline("translation", model=spec["folder"], **kwargs)
texts = [r["translation_text"] for r in translator(spec["sources"], num_beams=4)]
print(json.dumps({"class": type(model).__module__ + "." + type(model).__name__, "tokenizer": type(tokenizer).__name__,
                  "ids": ids, "texts": texts}))
"""


def run_child(folder, sources, block_talk_hf, tmp_path):
    spec = json.dumps({"folder": str(folder), "sources": sources, "block_talk_hf": block_talk_hf})
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", CHILD, spec], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_cli_output_loads_with_and_without_talk_hf(releases, tmp_path):
    """scripts/convert_fairseq_checkpoint.py writes a folder that AutoModelForSeq2SeqLM, AutoTokenizer and
    pipeline("translation") load with talk_hf imported and, as remote code, without it: same outputs both ways, and
    the same as fairseq's hub interface."""
    folder = releases["dynamicconv.glu.wmt17.zh-en"][0]
    out = tmp_path / "converted"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "convert_fairseq_checkpoint.py"), str(folder), str(out)],
                   check=True, capture_output=True, timeout=300)
    sources = oracle.read_lines(oracle.SOURCE_LANG, 304)[300:]
    local = run_child(out, sources, False, tmp_path)
    remote = run_child(out, sources, True, tmp_path)
    assert local["class"] == "talk_hf.modeling_dynamic_conv.DynamicConvForConditionalGeneration"
    assert remote["class"].endswith("modeling_dynamic_conv.DynamicConvForConditionalGeneration")
    assert not remote["class"].startswith("talk_hf.")
    assert local["tokenizer"] == remote["tokenizer"] == "FairseqMosesBpeTokenizer"
    assert local["ids"] == remote["ids"] and local["texts"] == remote["texts"]
    assert local["texts"] == hub_interface(folder).translate(sources, beam=4)


# ---------------------------------------------------------------------------------------------------------------
# Refusals


def copy_release(folder, tmp_path):
    """A copy of the release folder's files in tmp_path/release."""
    copy = tmp_path / "release"
    copy.mkdir()
    for path in folder.iterdir():
        if path.is_file():
            (copy / path.name).write_bytes(path.read_bytes())
    return copy


def rewrite_checkpoint(folder, tmp_path, change):
    """A copy of the release folder whose checkpoint's args were changed by change(args) (saved with torch.save)."""
    copy = copy_release(folder, tmp_path)
    state = torch.load(folder / "model.pt", weights_only=False)
    args = argparse.Namespace(**vars(state["cfg"]["model"]))
    change(args)
    state["cfg"]["model"] = args
    torch.save(state, copy / "model.pt")
    return copy


def test_unknown_architecture_is_refused_by_name(releases, tmp_path):
    from talk_hf.convert_fairseq import convert_fairseq_checkpoint

    copy = rewrite_checkpoint(releases["dynamicconv.glu.wmt16"][0], tmp_path,
                              lambda a: setattr(a, "arch", "transformer_wmt_en_de"))
    with pytest.raises(ValueError, match="cannot convert fairseq architecture 'transformer_wmt_en_de'"):
        convert_fairseq_checkpoint(copy, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_unsupported_option_is_refused_by_name(releases, tmp_path):
    from talk_hf.convert_fairseq import convert_fairseq_checkpoint

    copy = rewrite_checkpoint(releases["dynamicconv.glu.wmt16"][0], tmp_path,
                              lambda a: setattr(a, "decoder_learned_pos", True))
    with pytest.raises(ValueError, match="decoder_learned_pos=True is not supported"):
        convert_fairseq_checkpoint(copy, tmp_path / "out")


def test_a_used_output_folder_is_refused(releases, tmp_path):
    """Converting into a folder with files would mix them with the new ones (a release without bpecodes converted
    where one with bpecodes was: the stale codes would BPE the input the new tokenizer expects as BPE'd text)."""
    from talk_hf.convert_fairseq import convert_fairseq_checkpoint

    out = tmp_path / "out"
    out.mkdir()
    (out / "bpecodes").write_text("stale\n")
    with pytest.raises(FileExistsError, match="exists and is not empty: convert into a new folder"):
        convert_fairseq_checkpoint(releases["lightconv.no_glu.iwslt14"][0], out)
    assert [p.name for p in out.iterdir()] == ["bpecodes"]


@pytest.mark.parametrize("section,value,match", [
    ("tokenizer", {"_name": "space"}, "tokenizer is 'space'"),
    ("tokenizer", {"_name": "moses", "source_lang": "de", "moses_no_escape": True}, r"sets \['moses_no_escape'\]"),
    ("bpe", {"_name": "sentencepiece"}, "BPE is 'sentencepiece'"),
    ("bpe", {"_name": "subword_nmt", "bpe_separator": "##"}, "separator '##'"),
])
def test_a_text_pipeline_the_tokenizer_would_not_reproduce_is_refused(releases, tmp_path, section, value, match):
    from talk_hf.convert_fairseq import convert_fairseq_checkpoint

    folder = releases["dynamicconv.glu.wmt16"][0]
    copy = copy_release(folder, tmp_path)
    state = torch.load(folder / "model.pt", weights_only=False)
    state["cfg"][section] = value
    torch.save(state, copy / "model.pt")
    with pytest.raises(ValueError, match=match):
        convert_fairseq_checkpoint(copy, tmp_path / "out")


def test_shared_embeddings_with_two_different_dictionaries_are_refused(releases, tmp_path):
    """share_all_embeddings needs one dictionary (fairseq refuses to build the model otherwise): the converter does
    not make one tokenizer map two dictionaries into one embedding."""
    from talk_hf.convert_fairseq import convert_fairseq_checkpoint

    folder = releases["dynamicconv.glu.wmt16"][0]
    copy = copy_release(folder, tmp_path)
    target = next(p for p in sorted(copy.glob("dict.*.txt")) if p.name != "dict.de.txt")
    lines = target.read_text(encoding="utf-8").splitlines()
    target.write_text("\n".join([lines[1], lines[0], *lines[2:]]) + "\n", encoding="utf-8")  # two ids swapped
    with pytest.raises(ValueError, match="share_all_embeddings=True needs one dictionary for both sides"):
        convert_fairseq_checkpoint(copy, tmp_path / "out")


def test_special_token_text_is_tokenised_as_fairseq_does(releases):
    """fairseq's encode_line runs Moses over all of the text: "</s>", "<s>" or "<unk>" written in a sentence are
    escaped text, not control ids."""
    from transformers import AutoTokenizer

    folder, _, _, converted = releases["lightconv.no_glu.iwslt14"]
    hub, tokenizer = hub_interface(folder), AutoTokenizer.from_pretrained(converted)
    for text in ("A </s> B <s> C <pad>", "Ein Hund <unk> rennt.", "<s>Durchgestrichen</s> bleibt Text."):
        assert tokenizer(text)["input_ids"] == hub.encode(text).tolist()
    tokenizer.add_tokens(["<neu>"])  # a token added for fine-tuning stays whole
    ids = tokenizer("Ein <neu> Hund")["input_ids"]
    added = tokenizer.convert_tokens_to_ids("<neu>")
    assert ids == [*hub.encode("Ein").tolist()[:-1], added, *hub.encode("Hund").tolist()] and added > 4


def test_split_special_tokens_reads_added_tokens_as_fairseq_reads_text(releases):
    """split_special_tokens=True (per call, or set on the tokenizer) reads a special token written in the text as
    text: Moses and BPE over it, as fairseq's encode_line reads any text; a token added as no special one stays
    whole, as transformers' tokenizers keep it."""
    from transformers import AutoTokenizer

    folder, _, _, converted = releases["lightconv.no_glu.iwslt14"]
    hub, tokenizer = hub_interface(folder), AutoTokenizer.from_pretrained(converted)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<2en>"]})
    tag = tokenizer.convert_tokens_to_ids("<2en>")
    as_text = hub.encode("<2en> Ein Hund").tolist()
    assert tokenizer("<2en> Ein Hund", split_special_tokens=True)["input_ids"] == as_text and tag not in as_text
    assert tokenizer("<2en> Ein Hund")["input_ids"] == [tag, *hub.encode("Ein Hund").tolist()]
    tokenizer.split_special_tokens = True
    assert tokenizer("<2en> Ein Hund")["input_ids"] == as_text
    tokenizer.add_tokens(["<neu>"])  # not special: still one token
    neu = tokenizer.convert_tokens_to_ids("<neu>")
    assert tokenizer("<2en> Ein <neu> Hund")["input_ids"] == [*as_text[:-2], neu, *as_text[-2:]]


def test_an_overwritten_dictionary_entry_takes_a_new_id_as_in_fairseq(tmp_path):
    from fairseq.data import Dictionary

    from talk_hf.tokenization_fairseq import load_fairseq_dictionary

    path = tmp_path / "dict.txt"
    path.write_text("a 5\nb 4\na 3 #fairseq:overwrite\nc 2\n", encoding="utf-8")
    reference = Dictionary.load(str(path))
    symbols, indices = load_fairseq_dictionary(path)
    assert symbols == reference.symbols and indices == reference.indices and len(symbols) == len(reference) == 8


class RunsCode:
    """Unpickling this runs a shell command (pickle calls what __reduce__ names)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.mark.parametrize("zip_format", [True, False])
def test_a_pickle_naming_another_global_is_refused_without_running_it(tmp_path, zip_format):
    from talk_hf.convert_fairseq import convert_fairseq_checkpoint

    marker = tmp_path / "ran"
    state = {"args": argparse.Namespace(arch="lightconv"), "model": {"x": torch.zeros(1)}, "extra": RunsCode(marker)}
    torch.save(state, tmp_path / "model.pt", _use_new_zipfile_serialization=zip_format)
    with pytest.raises(ValueError, match=r"needs (posix|os)\.system, which is not among the globals"):
        convert_fairseq_checkpoint(tmp_path, tmp_path / "out")
    assert not marker.exists()
