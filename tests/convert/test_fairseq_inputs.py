"""What the fairseq converter reads besides the weights: the checkpoint file itself (files that are no checkpoint, the
training meters of fairseq 0.6-0.9 checkpoints), an args checkpoint's text pipeline options, the dict.<lang>.txt
files (fairseq's Dictionary.add_from_file rule) and the tokens added to the converted tokenizer. Checkpoints are TaLK
releases in the extension's args layout (tests/convert/test_convert_talk.py); where fairseq is installed it is the
oracle of the dictionary and text pipeline rules."""

import argparse
import io
import pickle
import re
import sys
import types

import pytest
import torch

from . import fairseq_layout as layout
from . import fairseq_oracle as oracle
from .test_convert_talk import VARIANTS, talk_args, write_talk_release

fairseq = oracle.import_fairseq()
needs_fairseq = pytest.mark.skipif(
    fairseq is None, reason=f"fairseq is not installed (`make install` puts it in {oracle.FAIRSEQ_DIR})"
)


# ---------------------------------------------------------------------------------------------------------------
# The checkpoint file


def saved_bytes(obj, zip_format=True):
    buffer = io.BytesIO()
    torch.save(obj, buffer, _use_new_zipfile_serialization=zip_format)
    return buffer.getvalue()


def truncated(zip_format, keep=0.5, tensors=1):
    data = saved_bytes({"model": {f"x{i}": torch.zeros(1000) for i in range(tensors)}, "args": None}, zip_format)
    return data[:int(len(data) * keep)]


@pytest.mark.parametrize("content,message,torch_text", [
    (b"", "is empty, not a PyTorch checkpoint", "torch.load: EOFError"),
    (b"version https://git-lfs.github.com/spec/v1\noid sha256:4d7a2146\nsize 123456\n",
     r"is a Git LFS pointer, not the PyTorch checkpoint it stands for: fetch the LFS object \(`git lfs pull`",
     "Unsupported operand 118"),
    (b"<html><body>404 Not Found</body></html>",
     r"is not a PyTorch checkpoint, or a damaged one \(it starts with b'<html><body>404 Not Found",
     "Unsupported operand 60"),
    (truncated(zip_format=True), "is not a PyTorch checkpoint, or a damaged one", "failed reading zip archive"),
    (truncated(zip_format=False), "is not a PyTorch checkpoint, or a damaged one", "unexpected EOF"),
    (truncated(zip_format=True, keep=0.1, tensors=10), "is not a PyTorch checkpoint, or a damaged one", "torch.load"),
    (b"usage: see README\n", r"a damaged one \(it starts with b'usage", "torch.load"),
    (b"https://example.org/model.pt\n", r"a damaged one \(it starts with b'https", "torch.load"),
], ids=["empty", "git-lfs-pointer", "web-page", "truncated-zip", "truncated-legacy", "zip-head", "text", "url"])
def test_a_file_that_is_no_checkpoint_is_named_with_torchs_error(tmp_path, content, message, torch_text):
    from talk_hf.convert_fairseq import convert_fairseq_checkpoint

    (tmp_path / "model.pt").write_bytes(content)
    with pytest.raises(ValueError, match=message) as caught:
        convert_fairseq_checkpoint(tmp_path, tmp_path / "out")
    assert str(tmp_path / "model.pt") in str(caught.value) and torch_text in str(caught.value)
    assert caught.value.__cause__ is not None


def test_a_numpy_object_array_is_refused_naming_its_dtype(tmp_path):
    import numpy

    from talk_hf.convert_fairseq import load_checkpoint

    checkpoint = layout.fairseq_checkpoint(argparse.Namespace(arch="lightconv"), {"x": torch.zeros(1)})
    checkpoint["extra_state"]["notes"] = numpy.array(["a", "b"], dtype=object)
    torch.save(checkpoint, tmp_path / "model.pt")
    with pytest.raises(ValueError, match=r"needs numpy\.dtypes\.ObjectDType, which is not among the globals"):
        load_checkpoint(tmp_path / "model.pt")


def test_numpy_arrays_of_an_eval_bleu_checkpoint_load(tmp_path):
    """`fairseq-train --eval-bleu` logs its BLEU counts as numpy arrays, which the checkpoint keeps in
    extra_state["metrics"]."""
    import numpy

    from talk_hf.convert_fairseq import load_checkpoint

    checkpoint = layout.fairseq_checkpoint(argparse.Namespace(arch="lightconv"), {"x": torch.zeros(1)})
    counts = numpy.array([12, 7, 3, 1])
    checkpoint["extra_state"]["metrics"] = {"valid": [{"_bleu_counts": counts, "_bleu_sys_len": numpy.int64(40),
                                                       "_bleu_totals": numpy.array([20.0, 19.0, 18.0, 17.0])}]}
    torch.save(checkpoint, tmp_path / "model.pt")
    loaded = load_checkpoint(tmp_path / "model.pt")["extra_state"]["metrics"]["valid"][0]
    assert numpy.array_equal(loaded["_bleu_counts"], counts) and loaded["_bleu_sys_len"] == 40
    assert loaded["_bleu_totals"].dtype == numpy.float64


def fake_fairseq_meters(monkeypatch, marker):
    """A module fairseq.meters with fairseq 0.6-0.9's meter classes (their attributes), whose __setstate__ writes
    `marker`: unpickling with these classes would run it."""
    meters = types.ModuleType("fairseq.meters")

    class Meter:
        def __setstate__(self, state):
            marker.write_text("ran")

    for name, fields in [("AverageMeter", dict(val=0.5, avg=0.5, sum=2.0, count=4)),
                         ("TimeMeter", dict(init=0, start=1.5e9, n=100)),
                         ("StopwatchMeter", dict(sum=3.0, n=2, start_time=None))]:
        cls = type(name, (Meter,), {"__module__": "fairseq.meters", "__qualname__": name, "fields": fields})
        setattr(meters, name, cls)
    monkeypatch.setitem(sys.modules, "fairseq", sys.modules.get("fairseq") or types.ModuleType("fairseq"))
    monkeypatch.setitem(sys.modules, "fairseq.meters", meters)
    return meters


def meter(cls):
    obj = cls.__new__(cls)
    obj.__dict__.update(cls.fields)
    return obj


@pytest.mark.parametrize("zip_format", [True, False])
def test_training_meters_of_fairseq_0_6_to_0_9_load_as_inert_state(tmp_path, monkeypatch, zip_format):
    """fairseq 0.6-0.9's Trainer pickles its meters into extra_state["train_meters"]: they load as TrainingMeter
    objects holding the pickled attributes (fairseq's own classes are not run), and the checkpoint converts."""
    from talk_hf.convert_fairseq import TrainingMeter, convert_fairseq_checkpoint, load_checkpoint

    marker = tmp_path / "ran"
    meters = fake_fairseq_meters(monkeypatch, marker)
    args = talk_args(**VARIANTS["iwslt"])
    folder, state = write_talk_release(tmp_path / "release", args)
    checkpoint = layout.fairseq_checkpoint(args, state)
    train_meters = {"train_loss": meter(meters.AverageMeter), "wps": meter(meters.TimeMeter),
                    "wall": meter(meters.StopwatchMeter)}
    checkpoint["extra_state"]["train_meters"] = train_meters
    (folder / "model.pt").write_bytes(saved_bytes(checkpoint, zip_format))
    monkeypatch.delitem(sys.modules, "fairseq.meters")

    loaded = load_checkpoint(folder / "model.pt")["extra_state"]["train_meters"]
    assert {name: (type(m).__name__, m.state) for name, m in loaded.items()} == {
        name: (type(m).__name__, m.fields) for name, m in train_meters.items()}
    assert all(isinstance(m, TrainingMeter) for m in loaded.values()) and not marker.exists()
    assert (convert_fairseq_checkpoint(folder, tmp_path / "out") / "model.safetensors").is_file()


@needs_fairseq
def test_training_meters_of_later_fairseq_load_as_inert_state(tmp_path):
    from fairseq.logging import meters

    from talk_hf.convert_fairseq import TrainingMeter, load_checkpoint

    train_meters = {"loss": meters.AverageMeter(), "wps": meters.TimeMeter(), "wall": meters.StopwatchMeter(),
                    "sum": meters.SumMeter()}
    train_meters["loss"].update(2.5, n=4)
    checkpoint = layout.fairseq_checkpoint(argparse.Namespace(arch="lightconv"), {"x": torch.zeros(1)})
    checkpoint["extra_state"]["train_meters"] = train_meters
    torch.save(checkpoint, tmp_path / "model.pt")
    loaded = load_checkpoint(tmp_path / "model.pt")["extra_state"]["train_meters"]
    assert all(isinstance(m, TrainingMeter) for m in loaded.values())
    assert {name: m.state for name, m in loaded.items()} == {name: vars(m) for name, m in train_meters.items()}


# ---------------------------------------------------------------------------------------------------------------
# The text pipeline of an args checkpoint (fairseq <= 0.10: the TaLK and rfa-doc-mt releases)


ARGS_TEXT_PIPELINES = [
    (dict(tokenizer="moses", moses_no_escape=True, moses_no_dash_splits=True),
     r"sets \['moses_no_escape', 'moses_no_dash_splits'\]"),
    (dict(moses_no_dash_splits=True), r"sets \['moses_no_dash_splits'\]"),  # the hub's tokenizer="moses" takes it
    (dict(tokenizer="space"), "tokenizer is 'space'"),
    (dict(bpe="sentencepiece", sentencepiece_model="spm.model"), "BPE is 'sentencepiece'"),
    (dict(bpe="subword_nmt", bpe_separator="##"), "separator '##'"),
    (dict(tokenizer="moses", moses_no_escape=False, moses_no_dash_splits=False, bpe="subword_nmt",
          bpe_separator="@@"), None),
]


@pytest.mark.parametrize("options,refusal", ARGS_TEXT_PIPELINES)
def test_an_args_checkpoints_text_pipeline_is_checked_as_a_cfgs(tmp_path, options, refusal):
    from talk_hf.convert_fairseq import convert_fairseq_checkpoint

    folder, _ = write_talk_release(tmp_path / "release", talk_args(**VARIANTS["iwslt"], **options))
    if refusal is None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(convert_fairseq_checkpoint(folder, tmp_path / "out"))
        assert (tokenizer.source_lang, tokenizer.target_lang) == (layout.SOURCE_LANG, layout.TARGET_LANG)
        return
    with pytest.raises(ValueError, match=refusal):
        convert_fairseq_checkpoint(folder, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def fairseq_text_pipeline(args):
    """fairseq's tokenizer and bpe cfg sections of an args checkpoint as its hub interface loads it with
    tokenizer="moses", bpe="subword_nmt" (where the args name no tokenizer / BPE) -> plain dicts."""
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from omegaconf import OmegaConf

    args = argparse.Namespace(**vars(args))
    args.tokenizer = getattr(args, "tokenizer", None) or "moses"
    args.bpe, args.bpe_codes = getattr(args, "bpe", None) or "subword_nmt", "bpecodes"
    args.arch = "lightconv_iwslt_de_en"  # an architecture fairseq registers (the sections do not depend on it)
    cfg = convert_namespace_to_omegaconf(args)
    return {kind: OmegaConf.to_container(cfg[kind]) for kind in ("tokenizer", "bpe")}


def verdict(check, pipeline):
    try:
        check(pipeline)
    except ValueError as err:
        return str(err)
    return "accepted"


@needs_fairseq
@pytest.mark.filterwarnings("ignore::UserWarning")  # fairseq's hydra warns of its own deprecated compose options
@pytest.mark.parametrize("options", [options for options, _ in ARGS_TEXT_PIPELINES] + [{}])
def test_an_args_text_pipeline_is_judged_as_fairseqs_cfg_of_it(options):
    """The converter's verdict on an args checkpoint's text pipeline is its verdict on the cfg fairseq makes of the
    args (convert_namespace_to_omegaconf), and the Moses languages are that cfg's."""
    from talk_hf.convert_fairseq import check_text_pipeline, moses_languages, text_pipeline

    args = talk_args(**VARIANTS["iwslt"], **options)
    ours, theirs = text_pipeline({"args": args}), fairseq_text_pipeline(args)
    assert verdict(check_text_pipeline, ours) == verdict(check_text_pipeline, theirs)
    if verdict(check_text_pipeline, ours) == "accepted":
        assert moses_languages({"args": args}) == (theirs["tokenizer"]["source_lang"],
                                                   theirs["tokenizer"]["target_lang"])


# ---------------------------------------------------------------------------------------------------------------
# Dictionaries: fairseq's Dictionary.add_from_file rule


DICTIONARY_LINES = [
    ("a 5 \nb 4\n", ["a", "b"]),  # trailing whitespace is stripped
    ("a 5\r\nb 4\r\n", ["a", "b"]),
    ("a +5\nb -4\nc 1_000\n", ["a", "b", "c"]),  # the count is what int() reads
    ("a 5\nb 4\na 3 #fairseq:overwrite\n", ["a", "b", "a"]),
    ("  5\na 4\n", [" ", "a"]),  # the word is everything before the last space
    ("a b 5\n", ["a b"]),
    ("a ²\n", None),  # a digit int() does not read
    ("a\t5\n", None),
    ("a 5\n\n", None),
    ("a 5\na 4\n", None),  # a repeated word needs #fairseq:overwrite
    ("a #fairseq:overwrite\n", None),
]


@pytest.mark.parametrize("text,words", DICTIONARY_LINES)
def test_dictionary_lines_are_read_by_fairseqs_rule(tmp_path, text, words):
    from talk_hf.tokenization_fairseq import SPECIAL_TOKENS, load_fairseq_dictionary

    path = tmp_path / "dict.txt"
    path.write_bytes(text.encode("utf-8"))
    if words is None:
        message = rf"{re.escape(str(path))}, line \d: (expected '<token> <count>|duplicate token)"
        with pytest.raises(ValueError, match=message):
            load_fairseq_dictionary(path)
    else:
        symbols, indices = load_fairseq_dictionary(path)
        assert symbols == SPECIAL_TOKENS + words
        assert indices == {word: i for i, word in enumerate(symbols)}  # an overwritten word: its last id


@pytest.mark.parametrize("token", ["<s>", "<pad>", "</s>", "<unk>"])
def test_overwriting_a_special_token_is_refused(tmp_path, token):
    from talk_hf.tokenization_fairseq import load_fairseq_dictionary

    path = tmp_path / "dict.txt"
    path.write_text(f"a 5\n{token} 3 #fairseq:overwrite\n", encoding="utf-8")
    with pytest.raises(ValueError, match=rf"line 2: '{re.escape(token)}' overwrites a special token"):
        load_fairseq_dictionary(path)


@needs_fairseq
def test_fairseq_keeps_a_special_tokens_id_when_its_entry_is_overwritten(tmp_path):
    """Why the overwrite is refused: fairseq's model id and its text's id part."""
    from fairseq.data import Dictionary

    path = tmp_path / "dict.txt"
    path.write_text("a 5\n</s> 3 #fairseq:overwrite\n", encoding="utf-8")
    dictionary = Dictionary.load(str(path))
    assert dictionary.eos() == 2 and dictionary.index("</s>") == 5


@needs_fairseq
@pytest.mark.parametrize("text,words", DICTIONARY_LINES)
def test_dictionary_lines_read_as_fairseqs_dictionary_reads_them(tmp_path, text, words):
    from fairseq.data import Dictionary

    path = tmp_path / "dict.txt"
    path.write_bytes(text.encode("utf-8"))
    if words is None:
        with pytest.raises((ValueError, RuntimeError)):
            Dictionary.load(str(path))
    else:
        assert Dictionary.load(str(path)).symbols[4:] == words


# ---------------------------------------------------------------------------------------------------------------
# Tokens added to the tokenizer


def test_added_tokens_decode_to_themselves(tmp_path):
    tokenizer = layout.fairseq_tokenizer(tmp_path, "a 5\nb 4\n")
    assert tokenizer.add_tokens(["zebra", "<neu>"]) == 2
    ids = tokenizer("a zebra b <neu>")["input_ids"]
    assert ids == [4, 6, 5, 7, 2]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "a zebra b <neu>"
    assert tokenizer.convert_ids_to_tokens(ids) == ["a", "zebra", "b", "<neu>", "</s>"]


@pytest.mark.parametrize("how", ["add_special_tokens", "add_tokens"])
def test_added_special_tokens_stay_whole_and_are_skipped_on_decode(tmp_path, how):
    """A token added as special (a language tag for fine-tuning) is one id, as transformers' own Moses + BPE
    tokenizer (FSMT) keeps it, and decode(skip_special_tokens=True) drops it."""
    tokenizer = layout.fairseq_tokenizer(tmp_path, "a 5\nb 4\n")
    if how == "add_special_tokens":
        tokenizer.add_special_tokens({"additional_special_tokens": ["<2en>"]})
    else:
        tokenizer.add_tokens(["<2en>"], special_tokens=True)
    tag = tokenizer.convert_tokens_to_ids("<2en>")
    ids = tokenizer("<2en> a b")["input_ids"]
    assert ids == [tag, 4, 5, 2]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "a b"
    assert tokenizer.decode(ids) == "<2en> a b </s>"


@pytest.mark.parametrize("source,target,first", [
    ("a 5\nb 4\na 3 #fairseq:overwrite\n", None, 7),  # ids 0..6 (a's earlier id 4 stays), 6 distinct tokens
    ("a 5\nb 4\n", "a 5\nb 4\nc 3\nd 2\n", 8),  # the target dictionary, which decoding reads, is the larger
], ids=["overwritten-entry", "larger-target-dictionary"])
def test_added_tokens_take_ids_no_dictionary_entry_has(tmp_path, source, target, first):
    from transformers import AutoTokenizer

    tokenizer = layout.fairseq_tokenizer(tmp_path, source, target)
    assert len(tokenizer) == first
    tokenizer.add_tokens(["zz"])
    tokenizer.add_tokens(["yy", "zz"])  # a second call numbers on from the first's
    added = {token: tokenizer.convert_tokens_to_ids(token) for token in ("zz", "yy")}
    assert added == {"zz": first, "yy": first + 1} and len(tokenizer) == first + 2
    assert tokenizer.get_vocab()["zz"] == first and tokenizer.decode([first + 1, first]) == "yy zz"
    tokenizer.save_pretrained(tmp_path / "saved")
    reloaded = AutoTokenizer.from_pretrained(tmp_path / "saved")
    assert {token: reloaded.convert_tokens_to_ids(token) for token in ("zz", "yy")} == added
    assert reloaded.decode(reloaded("yy zz")["input_ids"], skip_special_tokens=True) == "yy zz"
