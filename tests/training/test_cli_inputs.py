"""Bad or unusual command-line input to the scripts and the library readers behind them: refused with a message
naming the problem, or read as meant (repeated --set flags, unknown config fields, tiny vocabularies, byte order
marks, --last, evaluate_model.py's --limit, line counts, --document_level and its decodings)."""

import gzip
import io
import json
import os
import re
import types
import warnings

import pytest
import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList

from talk_hf.tokenization import MIN_VOCAB_SIZE, train_joint_bpe
from talk_hf.training.corpora import load_json_pairs, load_text_pairs, load_tsv_pairs, read_lines
from talk_hf.training.evaluation import rouge
from talk_hf.training.loop import make_collator, summed_losses, validation_loss
from talk_hf.training.models import build_model, build_model_for_ids, config_fields, parse_overrides
from talk_hf.training.run import evaluate_translation, load_prepared

from .test_scripts import FIXTURE, ROOT, TINY, script

BOM = "\ufeff"
IDS = dict(vocab_size=100, pad_token_id=1, bos_token_id=0, eos_token_id=2)


def fixture_pairs():
    return [line.split("\t") for line in FIXTURE.read_text(encoding="utf-8").splitlines()]


# ------------------------------------------------------------------------------------------ train.py --set, models


def prepared_folder(folder, args=None):
    """A folder that train.py takes for prepared data: its preprocess.json (with these settings as "args")."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "preprocess.json").write_text(json.dumps({"args": args or {}}), encoding="utf-8")
    return str(folder)


def test_repeated_set_flags_add_up(monkeypatch, tmp_path):
    train = script("train")
    calls = []
    monkeypatch.setattr(train, "train_run", lambda *args, **kwargs: calls.append(kwargs) or {})
    base = ["--data", prepared_folder(tmp_path / "d"), "--model", "talk", "--output_dir", "o", "--max_steps", "1"]
    train.main([*base, "--set", "d_model=16", "encoder_layers=1", "--set", "decoder_max_offsets=[3]"])
    assert calls[0]["overrides"] == {"d_model": 16, "encoder_layers": 1, "decoder_max_offsets": [3]}
    train.main(base)
    assert calls[1]["overrides"] == {}


def test_a_field_set_twice_is_refused(monkeypatch, capsys):
    train = script("train")
    monkeypatch.setattr(train, "train_run", lambda *args, **kwargs: pytest.fail("trained despite a repeated field"))
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--data", "d", "--model", "talk", "--output_dir", "o", "--max_steps", "1",
                    "--set", "d_model=16", "--set", "dropout=0.1", "d_model=32"])
    assert exit_info.value.code == 2 and "'d_model' is given twice" in capsys.readouterr().err
    with pytest.raises(ValueError, match="'dropout' is given twice"):
        parse_overrides(["dropout=0.1", "dropout=0.1"])


@pytest.mark.parametrize("kind, overrides, unknown", [
    ("talk", dict(d_modle=16), "d_modle"),
    ("talk_lm", dict(encoder_layers=1), "encoder_layers"),
    ("lightconv", dict(encoder_heads=2), "encoder_heads"),
    ("rfa_doc", dict(encoder_heads=2), "encoder_heads"),
    ("marian", dict(encoder_heads=2), "encoder_heads"),
    ("bart", dict(d_modle=16), "d_modle"),
    ("gpt2", dict(encoder_layers=1), "encoder_layers"),
])
def test_build_model_refuses_unknown_fields(kind, overrides, unknown):
    with pytest.raises(ValueError, match=rf"unknown config field\(s\) \['{unknown}'\] for model kind '{kind}'.*"
                                         r"takes: .*d_model"):
        build_model_for_ids(kind, IDS, overrides=dict(d_model=16, **overrides))


def test_build_model_refuses_unknown_fields_of_a_config_file(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"d_model": 16, "decoder_layer": 1}))
    with pytest.raises(ValueError, match=r"\['decoder_layer'\]"):
        build_model_for_ids("talk", IDS, config_file=config)


def test_a_saved_config_json_builds_the_same_model(tmp_path):
    """A model's own config.json (with model_type and, saved with its code, auto_map) is a config file: the same
    sizes; one of another model type is refused by name."""
    model = build_model_for_ids("talk", IDS, overrides=dict(d_model=16, encoder_layers=1, decoder_layers=2,
                                                            encoder_ffn_dim=32, decoder_ffn_dim=32))
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == "talk" and "auto_map" in saved
    again = build_model_for_ids("talk", IDS, config_file=tmp_path / "config.json")
    assert (again.config.d_model, again.config.decoder_layers, again.config.encoder_ffn_dim) == (16, 2, 32)
    with pytest.raises(ValueError, match="is a 'talk' config, not one of model kind 'dynamic_conv'"):
        build_model_for_ids("dynamic_conv", IDS, config_file=tmp_path / "config.json")


@pytest.mark.parametrize("kind, overrides", [
    ("talk", dict(vocab_size=50)), ("marian", dict(pad_token_id=0)), ("lightconv", dict(conv_type="dynamic"))])
def test_build_model_refuses_fields_the_kind_and_tokenizer_set(kind, overrides):
    (key, value), = overrides.items()
    with pytest.raises(ValueError, match=rf"{key}={value!r} clash"):
        build_model_for_ids(kind, IDS, overrides=overrides)
    same = {key: {**IDS, "conv_type": "lightweight"}[key]}
    assert build_model_for_ids(kind, IDS, overrides=dict(same, d_model=16, encoder_layers=1, decoder_layers=1))


def tokenizer_with_a_late_separator(with_separator=True):
    """A word-level tokenizer whose "<sep>", if any, comes after its words (id 9), not at the joint BPE's id 4."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<s>", "<pad>", "</s>", "<unk>", "w4", "w5", "w6", "w7", "w8"]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", pad_token="<pad>",
                                        eos_token="</s>", unk_token="<unk>")
    if with_separator:
        tokenizer.add_special_tokens({"sep_token": "<sep>"})
    return tokenizer


def test_an_rfa_doc_model_gates_at_its_tokenizers_separator():
    """build_model gives RFA-doc the id of the tokenizer's window separator, refuses another one by name, and refuses
    a gate for a tokenizer without a separator (its default id would be a word's)."""
    tokenizer = tokenizer_with_a_late_separator()
    size = dict(d_model=16, encoder_layers=1, decoder_layers=1)
    assert build_model("rfa_doc", tokenizer, overrides=size).config.sep_token_id == 9
    with pytest.raises(ValueError, match="sep_token_id=4 clash"):
        build_model("rfa_doc", tokenizer, overrides=dict(size, sep_token_id=4))
    plain = tokenizer_with_a_late_separator(with_separator=False)
    with pytest.raises(ValueError, match="no sentence separator"):
        build_model("rfa_doc", plain, overrides=size)
    assert build_model("rfa_doc", plain, overrides=dict(size, sentential_gate="none"))


def test_runner_and_demo_overrides_are_all_taken():
    rows = [*script("results_multi30k").ROWS.items(), *script("results_lm").ROWS.items(),
            *script("results_doc_zh_en").MODELS.values(), ("talk", script("demo").MODEL)]
    assert len(rows) == 10
    for kind, overrides in rows:
        assert set(overrides) <= set(config_fields(kind)), kind
        model = build_model_for_ids(kind, IDS, overrides=overrides)
        sizes = {key: getattr(model.config, key, None) for key in ("d_model", "n_embd")}
        assert overrides["d_model"] in sizes.values(), kind


# ------------------------------------------------------------------------------------------ vocabulary size


@pytest.mark.parametrize("vocab_size", [-5, 0, 3, MIN_VOCAB_SIZE - 1])
def test_too_small_vocab_size_is_refused(vocab_size, tmp_path, capsys):
    texts = [text for pair in fixture_pairs() for text in pair]
    with pytest.raises(ValueError, match=f"vocab_size must be an int >= {MIN_VOCAB_SIZE}.*got {vocab_size}"):
        train_joint_bpe(texts, vocab_size)
    with pytest.raises(SystemExit) as exit_info:
        script("preprocess").main(["--tsv", f"train={FIXTURE}", "--vocab_size", str(vocab_size), "--output_dir",
                                   str(tmp_path / "data")])
    assert exit_info.value.code == 2
    assert f"--vocab_size must be >= {MIN_VOCAB_SIZE}" in capsys.readouterr().err
    assert not (tmp_path / "data").exists()


def test_smallest_vocab_size_trains():
    tok = train_joint_bpe(["ab ab ab", "ba"], MIN_VOCAB_SIZE, min_frequency=1)
    assert tok.convert_ids_to_tokens(list(range(5))) == ["<s>", "<pad>", "</s>", "<unk>", "<sep>"]


# ------------------------------------------------------------------------------------------ byte order marks


@pytest.mark.parametrize("gz", [False, True])
def test_readers_drop_a_byte_order_mark(tmp_path, gz):
    def write(name, text):
        path = tmp_path / (name + (".gz" if gz else ""))
        data = (BOM + text).encode("utf-8")
        path.write_bytes(gzip.compress(data) if gz else data)
        return path

    assert read_lines(write("a.de", "Ein Hund.\nZwei.\n")) == ["Ein Hund.", "Zwei."]
    pairs = load_text_pairs(write("s.de", "Ein Hund.\n"), write("t.en", "A dog.\n"))
    assert pairs["source"] == ["Ein Hund."]
    tsv = load_tsv_pairs(write("p.tsv", "src\ttgt\nHallo\tHello\n"), "src", "tgt")
    assert tsv["source"] == ["Hallo"] and tsv["target"] == ["Hello"]
    js = load_json_pairs(write("p.jsonl", '{"source": "a", "target": "b"}\n'), "source", "target")
    assert js["source"] == ["a"]


def test_invalid_utf8_after_a_byte_order_mark_names_its_line_and_byte(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_bytes(BOM.encode("utf-8") + b"ab\n\xffc\n")
    with pytest.raises(ValueError, match=r"line 2 is not valid UTF-8 \(invalid start byte at byte 6\)"):
        read_lines(path)


def test_translate_drops_a_byte_order_mark_on_stdin(monkeypatch):
    translate = script("translate")
    seen = []

    def translator(texts, **kwargs):
        seen.extend(texts)
        return [{"translation_text": text.upper()} for text in texts]

    translator.model = types.SimpleNamespace(generation_config=GenerationConfig())
    monkeypatch.setattr(translate, "pipeline", lambda *args, **kwargs: translator)
    monkeypatch.setattr("sys.stdin", stdin((BOM + "Ein Hund.\nZwei.\n").encode("utf-8")))
    assert translate.main(["--model", "m"]) == ["EIN HUND.", "ZWEI."]
    assert seen == ["Ein Hund.", "Zwei."]


def stdin(raw):
    """A stand-in for sys.stdin holding the bytes `raw` (text mode on top, as Python opens it)."""
    return io.TextIOWrapper(io.BytesIO(raw), encoding="utf-8", errors="surrogateescape")


@pytest.mark.parametrize("raw, message", [
    (b"Ein Hund\rrennt.\nZwei Kinder.\n", r"stdin: line 1 holds a carriage return \(\\r\) not followed by \\n"),
    (b"Ein Hund.\nZwei M\xe4nner.\n", r"stdin: line 2 is not valid UTF-8"),
])
def test_translate_reads_stdin_by_the_rules_of_a_file(raw, message, monkeypatch):
    """A lone carriage return would make two output lines of one input line (every later line misaligned); a byte
    that is not UTF-8 would reach the tokenizer as a surrogate. Both refused, naming the line, before the model
    loads."""
    translate = script("translate")
    monkeypatch.setattr(translate, "pipeline", lambda *args, **kwargs: pytest.fail("loaded the model"))
    monkeypatch.setattr("sys.stdin", stdin(raw))
    with pytest.raises(ValueError, match=message):
        translate.main(["--model", "m"])


# ------------------------------------------------------------------------------------------ average_checkpoints.py


@pytest.mark.parametrize("last", ["0", "-1"])
def test_average_checkpoints_needs_at_least_one(last, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        script("average_checkpoints").main(["--run", str(tmp_path), "--last", last, "--output", str(tmp_path / "o")])
    assert exit_info.value.code == 2 and f"--last must be >= 1, got {last}" in capsys.readouterr().err


# ------------------------------------------------------------------------------- convert_fairseq_checkpoint.py


def test_convert_refuses_a_missing_checkpoint_and_a_used_folder_by_name(tmp_path, capsys):
    """The converter's refusals reach the command line as its usage error (exit 2), not as a traceback."""
    convert = script("convert_fairseq_checkpoint")
    with pytest.raises(SystemExit) as exit_info:
        convert.main([str(tmp_path / "release"), str(tmp_path / "out")])
    assert exit_info.value.code == 2 and f"no fairseq checkpoint at {tmp_path / 'release'}" in capsys.readouterr().err
    (tmp_path / "release").mkdir()
    (tmp_path / "release" / "model.pt").write_bytes(b"")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "config.json").write_text("{}")
    with pytest.raises(SystemExit) as exit_info:
        convert.main([str(tmp_path / "release"), str(tmp_path / "out")])
    assert exit_info.value.code == 2 and "exists and is not empty" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ evaluate_model.py


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Prepared translation and LM data (the fixture pairs) and an untrained tiny model for each."""
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("inputs")
    preprocess = script("preprocess")
    preprocess.main(["--tsv", f"test={FIXTURE}", "--tokenizer_splits", "test", "--vocab_size", "200",
                     "--output_dir", str(root / "data")])
    corpus = root / "corpus.txt"
    corpus.write_text("".join(f"{source} {target}\n" for source, target in fixture_pairs()), encoding="utf-8")
    preprocess.main(["--lm_text", f"test={corpus}", "--tokenizer_splits", "test", "--block_size", "16",
                     "--vocab_size", "200", "--output_dir", str(root / "lm_data")])
    overrides = dict(parse_overrides(TINY))
    lm = dict(d_model=16, decoder_layers=1, decoder_ffn_dim=32, decoder_heads=2, decoder_max_offsets=[3])
    for name, data, kind, kind_overrides in (("talk", "data", "talk", overrides), ("lm", "lm_data", "talk_lm", lm)):
        tokenizer = AutoTokenizer.from_pretrained(root / data / "tokenizer")
        torch.manual_seed(0)
        model = build_model(kind, tokenizer, overrides=kind_overrides)
        model.generation_config.max_new_tokens = 3
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    return root


@pytest.mark.parametrize("metric, data, model_dir", [("loss", "data", "talk"), ("perplexity", "lm_data", "lm")])
def test_evaluate_loss_and_perplexity_take_limit(saved, metric, data, model_dir):
    evaluate = script("evaluate_model")
    split = load_prepared(saved / data, "test")
    assert len(split) > 4
    scored = evaluate.main(["--model", str(saved / model_dir), "--data", str(saved / data), "--metric", metric,
                            "--limit", "4"])
    auto = evaluate.AutoModelForCausalLM if metric == "perplexity" else evaluate.AutoModelForSeq2SeqLM
    model = auto.from_pretrained(saved / model_dir).eval()
    collator = make_collator(model)
    if metric == "loss":
        sums = summed_losses(model, split.select(range(4)), collator, 8192, swap_sources=True)
        loss, tokens = sums.loss, sums.tokens
    else:
        loss, tokens = validation_loss(model, split.select(range(4)), collator, 8192)
    assert scored["loss"] == pytest.approx(loss) and scored["tokens"] == tokens
    assert tokens < validation_loss(model, split, collator, 8192)[1]


@pytest.mark.parametrize("metric, model_dir", [("loss", "talk"), ("perplexity", "lm")])
def test_evaluate_refuses_ids_prepared_with_another_vocabulary(saved, metric, model_dir, monkeypatch, tmp_path):
    """Loss and perplexity read the prepared ids: ids of another vocabulary (here: a lowercased one, of the same
    size) would be scored as other tokens."""
    evaluate = script("evaluate_model")
    data = tmp_path / "lowercased"
    inputs = ["--tsv", f"test={FIXTURE}"] if metric == "loss" else ["--lm_text", f"test={saved / 'corpus.txt'}",
                                                                    "--block_size", "16"]
    script("preprocess").main([*inputs, "--tokenizer_splits", "test", "--vocab_size", "200", "--lowercase",
                               "--output_dir", str(data)])
    monkeypatch.setattr(evaluate, "load_prepared", lambda *args: pytest.fail("scored"))
    with pytest.raises(SystemExit, match=f"^--data {data} was prepared with another tokenizer than "
                                         f"--model {saved / model_dir}'s"):
        evaluate.main(["--model", str(saved / model_dir), "--data", str(data), "--metric", metric])


@pytest.mark.parametrize("metric, model_dir, message", [
    ("perplexity", "talk", "is an encoder-decoder (talk): --metric perplexity does not apply to it; use --metric "
                           "bleu, rouge or loss"),
    ("loss", "lm", "is a causal language model (talk_lm): --metric loss does not apply to it; use --metric perplexity"),
])
def test_evaluate_refuses_a_metric_of_another_kind_of_model(saved, metric, model_dir, message):
    with pytest.raises(SystemExit, match=re.escape(message)):
        script("evaluate_model").main(["--model", str(saved / model_dir), "--data", str(saved / "data"),
                                       "--metric", metric])


def test_evaluate_checks_line_counts_before_translating(saved, tmp_path, monkeypatch):
    evaluate = script("evaluate_model")
    monkeypatch.setattr(evaluate, "evaluate_translation", lambda *args, **kwargs: pytest.fail("translated"))
    source, reference = tmp_path / "src.de", tmp_path / "ref.en"
    source.write_text("Ein Hund.\nZwei.\nDrei.\n", encoding="utf-8")
    reference.write_text("A dog.\nTwo.\n", encoding="utf-8")
    for metric in ("bleu", "rouge"):
        with pytest.raises(SystemExit, match=rf"--source {source} has 3 lines, --reference {reference} has 2 lines"):
            evaluate.main(["--model", str(saved / "talk"), "--source", str(source), "--reference", str(reference),
                           "--limit", "1", "--metric", metric])


@pytest.mark.parametrize("argv, message", [
    (["--source", "s", "--reference", "r", "--document_level"], "--document_level needs --data"),
    (["--data", "d", "--metric", "loss", "--document_level"], "--document_level scores translations"),
    (["--source", "s", "--reference", "r", "--metric", "loss"], "--metric loss needs --data"),
    (["--data", "d", "--metric", "rouge"], "--metric rouge needs --source"),
    (["--data", "d", "--reference", "r"], "--reference needs --source"),
    (["--data", "d", "--limit", "-2"], "--limit must be >= 0, got -2"),
    (["--data", "d", "--document_decoding", "streaming"], "--document_decoding applies to --document_level"),
    (["--data", "d", "--document_level", "--document_decoding", "streaming", "--num_beams", "4"],
     "--document_decoding streaming carries one decoder state (greedy): --num_beams must be 1, got 4"),
])
def test_evaluate_refuses_inconsistent_flags(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        script("evaluate_model").main(["--model", "m", *argv])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_rouge_refuses_a_length_mismatch():
    with pytest.raises(ValueError, match="2 summaries for 3 references"):
        rouge(["a dog", "two"], ["a dog", "two", "three"])


# ------------------------------------------------------------------------------------------ document-level evaluation

DOC_SOURCES = ["ein hund läuft .", "er bellt .", "die katze rennt weg .", "ein mann sieht den hund .", "er ruft ihn ."]
DOC_TARGETS = ["a dog runs .", "it barks .", "the cat runs away .", "a man sees the dog .", "he calls it ."]


def document_split(sources=DOC_SOURCES, targets=DOC_TARGETS, doc_ids=("a",) * 3 + ("b",) * 2):
    """A prepared split of document windows (window 2) of these sentences."""
    import datasets

    from talk_hf.training.corpora import document_windows

    rows = {"doc_id": list(doc_ids), "source": list(sources), "target": list(targets)}
    return document_windows(datasets.Dataset.from_dict(rows), window=2)


@pytest.fixture(scope="module")
def documents(tmp_path_factory):
    """A folder with data/test, a prepared split of document windows (two documents), and model/, an untrained
    tiny talk model saved with num_beams 4 in its generation config (as a training run saves its beam)."""
    root = tmp_path_factory.mktemp("documents")
    tokenizer = train_joint_bpe(DOC_SOURCES + DOC_TARGETS, vocab_size=80, min_frequency=1)
    document_split().save_to_disk(str(root / "data" / "test"))
    torch.manual_seed(0)
    model = build_model("talk", tokenizer, overrides=dict(parse_overrides(TINY)))
    model.generation_config.num_beams = 4
    model.save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    return root


def loaded(folder):
    """(model in eval mode, tokenizer) saved in `folder`."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    return AutoModelForSeq2SeqLM.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)


class OnlyScores(LogitsProcessor):
    """Leaves one token possible at every step (ends=True: </s> at once) or every token but it (ends=False: a
    model that never ends its windows)."""

    def __init__(self, token, ends):
        self.token, self.ends = token, ends

    def __call__(self, input_ids, scores):
        chosen = torch.arange(scores.shape[1]) == self.token
        return scores.masked_fill(~chosen if self.ends else chosen, -float("inf"))


def steered(model, processor):
    """The model, its generate() calls given `processor`."""
    generate = model.generate
    model.generate = lambda **kwargs: generate(**kwargs, logits_processor=LogitsProcessorList([processor]))
    return model


def test_streaming_evaluation_decodes_greedily_whatever_beam_the_model_was_saved_with(documents, tmp_path):
    """--document_decoding streaming carries one decoder state: without --num_beams it decodes greedily, though the
    model was saved with 4 beams (which the other decodings still take), as evaluating it with num_beams=1 does."""
    evaluate = script("evaluate_model")
    argv = ["--model", str(documents / "model"), "--data", str(documents / "data"), "--document_level",
            "--max_new_tokens", "4"]
    hypotheses = tmp_path / "hypotheses.txt"
    scored = evaluate.main([*argv, "--document_decoding", "streaming", "--hypotheses", str(hypotheses)])
    assert scored["generation"]["num_beams"] == 1 and scored["document_decoding"] == "streaming"
    model, tokenizer = loaded(documents / "model")
    direct = evaluate_translation(model, tokenizer, load_prepared(documents / "data", "test"), num_beams=1,
                                  max_new_tokens=4, document_level=True, document_decoding="streaming")
    assert hypotheses.read_text(encoding="utf-8").split("\n")[:-1] == direct["hypotheses"]
    assert evaluate.main(argv)["generation"]["num_beams"] == 4


def test_windows_decoding_warns_about_and_counts_the_windows_the_limit_cuts(documents):
    """document_decoding="windows": max_new_tokens limits a whole window (its context sentences and the current
    one), and the last sentence of a window it cuts, scored as the current one, may be a context sentence: such
    windows are warned about with their count, which the results hold (windows_cut); windows that end are not."""
    model, tokenizer = loaded(documents / "model")
    split = load_prepared(documents / "data", "test")
    settings = dict(num_beams=1, max_new_tokens=4, document_level=True, document_decoding="windows")
    steered(model, OnlyScores(tokenizer.eos_token_id, ends=False))
    with pytest.warns(UserWarning, match="5 of 5 generated windows have no </s>") as caught:
        scored = evaluate_translation(model, tokenizer, split, **settings)
    assert scored["windows_cut"] == 5
    assert [w.filename for w in caught if "no </s>" in str(w.message)] == [__file__]  # the caller's line
    model, _ = loaded(documents / "model")
    steered(model, OnlyScores(tokenizer.eos_token_id, ends=True))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        scored = evaluate_translation(model, tokenizer, split, **settings)
    assert scored["windows_cut"] == 0 and not [w for w in caught if "no </s>" in str(w.message)]


def test_document_evaluation_takes_a_blank_sentence(documents):
    """A prepared split keeps a document's blank lines as rows: document-level evaluation gives a blank sentence
    the translation "" and translates the others as in the document without it."""
    from talk_hf import translate_document

    model, tokenizer = loaded(documents / "model")
    sources = [DOC_SOURCES[0], "", *DOC_SOURCES[1:3]]
    targets = [DOC_TARGETS[0], "", *DOC_TARGETS[1:3]]
    scored = evaluate_translation(model, tokenizer, document_split(sources, targets, ["a"] * 4), num_beams=1,
                                  max_new_tokens=4, document_level=True)
    alone = translate_document(model, tokenizer, [s for s in sources if s], window=2, num_beams=1, max_new_tokens=4)
    assert scored["hypotheses"] == [alone[0], "", *alone[1:]] and scored["sentences"] == 4


@pytest.mark.parametrize("name, argv, message", [
    ("translate", ["--model", "m", "--input", "{missing}"], "translate.py: error: "),
    ("evaluate_model", ["--model", "m", "--source", "{missing}", "--reference", "{missing}"],
     "evaluate_model.py: error: "),
    ("preprocess", ["--tsv", "train={missing}", "--output_dir", "{out}"], "preprocess.py: error: "),
])
def test_scripts_report_a_missing_input_file_as_an_error_line(name, argv, message, tmp_path):
    """Run as commands: one line naming the script and the file, exit status 1, no traceback."""
    import subprocess
    import sys

    missing = tmp_path / "missing.txt"
    argv = [a.format(missing=missing, out=tmp_path / "out") for a in argv]
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / f"{name}.py"), *argv], capture_output=True,
                            text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(message) and str(missing) in result.stderr

