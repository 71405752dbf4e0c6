"""scripts/preprocess.py end to end on the 64-pair fixture and the Wikipedia zh-en dev split (in process through
main(argv), plus --help in a subprocess)."""

import gzip
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import datasets
import pytest
from transformers import AutoTokenizer

from talk_hf.tokenization import EOS_ID, SEP_ID, split_sentences

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "preprocess.py"
FIXTURE = ROOT / "tests" / "fixtures" / "multi30k_pairs.tsv"
COLUMNS = ["source", "target", "doc_id", "num_context", "input_ids", "labels", "num_tokens"]


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("preprocess_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # importable: no work at import time
    return module


def fixture_pairs():
    with open(FIXTURE, encoding="utf-8") as f:
        return [tuple(line.rstrip("\n").split("\t")) for line in f]


def test_help_documents_every_flag(script):
    result = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    actions = [a for a in script.build_parser()._actions if a.option_strings]
    assert len(actions) > 20
    for action in actions:
        assert action.help, action.option_strings  # every flag has a help text
        assert any(opt in result.stdout for opt in action.option_strings), action.option_strings
    for flag in ("--source_file", "--target_file", "--split", "--tsv", "--json", "--hub_dataset", "--wiki_zh_en",
                 "--vocab_size", "--lowercase", "--window", "--max_tokens_per_example", "--output_dir"):
        assert flag in result.stdout


def test_tsv_end_to_end(script, tmp_path):
    out = tmp_path / "out"
    summary = script.main(["--tsv", f"train={FIXTURE}", "--tsv", f"valid={FIXTURE}", "--vocab_size", "300",
                           "--max_tokens_per_example", "30", "--output_dir", str(out)])
    tok = AutoTokenizer.from_pretrained(out / "tokenizer")
    assert len(tok) == 300 and tok.sep_token_id == SEP_ID and tok.eos_token_id == EOS_ID
    pairs = fixture_pairs()
    keep = [len(tok(s)["input_ids"]) <= 30 and len(tok(t)["input_ids"]) <= 30 for s, t in pairs]
    assert 0 < keep.count(False) < len(pairs)
    written = json.loads((out / "preprocess.json").read_text(encoding="utf-8"))
    assert written == json.loads(json.dumps(summary))
    assert written["args"]["vocab_size"] == 300 and written["args"]["max_tokens_per_example"] == 30
    assert written["tokenizer"] == {"vocab_size": 300, "trained_on": ["train"]}
    for split in ("train", "valid"):
        counts = written["splits"][split]
        assert counts["sentences"] == counts["examples"] == 64
        assert counts["dropped"] == keep.count(False) and counts["kept"] == keep.count(True)
        ds = datasets.load_from_disk(str(out / split))
        assert ds.column_names == COLUMNS and len(ds) == keep.count(True)
        assert list(zip(ds["source"], ds["target"])) == [p for p, k in zip(pairs, keep) if k]
        assert ds[0]["input_ids"] == tok(ds[0]["source"])["input_ids"] and ds[0]["labels"][-1] == EOS_ID
        assert counts["num_tokens_total"] == sum(ds["num_tokens"]) and counts["num_tokens_max"] <= 30


def test_test_splits_keep_every_example(script, tmp_path):
    """A test set is scored sentence by sentence: a limit that would drop some of its examples is an error (by
    default for splits named like a test set, else the ones --keep_all_splits names), never a smaller test set."""
    args = ["--tsv", f"train={FIXTURE}", "--tsv", f"test={FIXTURE}", "--vocab_size", "300",
            "--max_tokens_per_example", "30", "--output_dir", str(tmp_path / "out")]
    with pytest.raises(ValueError, match=r"would be dropped from \{'test': \d+\}"):
        script.main(args)
    with pytest.raises(ValueError, match=r"would be dropped from \{'train': \d+\}"):
        script.main([*args, "--keep_all_splits", "train"])
    assert not (tmp_path / "out").exists()


def test_text_files_match_tsv(script, tmp_path):
    pairs = fixture_pairs()
    (tmp_path / "train.de").write_text("".join(p[0] + "\n" for p in pairs), encoding="utf-8")
    with gzip.open(tmp_path / "train.en.gz", "wt", encoding="utf-8") as f:
        f.write("".join(p[1] + "\n" for p in pairs))
    (tmp_path / "test.de").write_text("Ein Hund.\n", encoding="utf-8")
    (tmp_path / "test.en").write_text("A dog.\n", encoding="utf-8")
    script.main(["--source_file", str(tmp_path / "train.de"), "--target_file", str(tmp_path / "train.en.gz"),
                 "--split", f"test={tmp_path / 'test.de'},{tmp_path / 'test.en'}", "--vocab_size", "300",
                 "--output_dir", str(tmp_path / "text")])
    script.main(["--tsv", f"train={FIXTURE}", "--vocab_size", "300", "--output_dir", str(tmp_path / "tsv")])
    text_train = datasets.load_from_disk(str(tmp_path / "text" / "train"))
    tsv_train = datasets.load_from_disk(str(tmp_path / "tsv" / "train"))
    assert text_train["input_ids"] == tsv_train["input_ids"] and text_train["labels"] == tsv_train["labels"]
    test = datasets.load_from_disk(str(tmp_path / "text" / "test"))
    assert test["source"] == ["Ein Hund."] and test["target"] == ["A dog."]
    counts = json.loads((tmp_path / "text" / "preprocess.json").read_text())["splits"]
    assert set(counts) == {"train", "test"} and counts["train"]["dropped"] == 0


def test_json_reverse_and_reused_tokenizer(script, tmp_path):
    pairs = fixture_pairs()[:8]
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"translation": {"de": d, "en": e}}) + "\n" for d, e in pairs))
    script.main(["--tsv", f"train={FIXTURE}", "--vocab_size", "300", "--output_dir", str(tmp_path / "a")])
    script.main(["--json", f"valid={path}", "--source_key", "translation.de", "--target_key", "translation.en",
                 "--reverse", "--tokenizer", str(tmp_path / "a" / "tokenizer"), "--output_dir", str(tmp_path / "b")])
    ds = datasets.load_from_disk(str(tmp_path / "b" / "valid"))
    assert ds["source"] == [e for _, e in pairs] and ds["target"] == [d for d, _ in pairs]
    tok = AutoTokenizer.from_pretrained(tmp_path / "a" / "tokenizer")
    assert ds["input_ids"] == tok([e for _, e in pairs])["input_ids"]
    assert json.loads((tmp_path / "b" / "preprocess.json").read_text())["tokenizer"]["trained_on"] is None


def test_local_hub_folder(script, tmp_path):
    pairs = fixture_pairs()
    dd = datasets.DatasetDict({
        split: datasets.Dataset.from_dict({"translation": [{"de": d, "en": e} for d, e in pairs[a:b]]})
        for split, (a, b) in {"train": (0, 48), "validation": (48, 64)}.items()
    })
    dd.save_to_disk(str(tmp_path / "hub"))
    summary = script.main(["--hub_dataset", str(tmp_path / "hub"), "--hub_splits", "train,validation",
                           "--source_lang", "de", "--target_lang", "en", "--vocab_size", "250",
                           "--output_dir", str(tmp_path / "out")])
    assert {k: v["examples"] for k, v in summary["splits"].items()} == {"train": 48, "validation": 16}
    valid = datasets.load_from_disk(str(tmp_path / "out" / "validation"))
    assert valid["source"] == [d for d, _ in pairs[48:]]


def test_wiki_windows(script, tmp_path, monkeypatch):
    """From the checkout's data/, also where the package's default (data/ beside it) does not exist, as in a
    non-editable install."""
    from talk_hf.training import corpora

    monkeypatch.setattr(corpora, "WIKI_ZH_EN_ARCHIVE", tmp_path / "site-packages" / "data" / "zh-en.tar.gz")
    out = tmp_path / "wiki"
    summary = script.main(["--wiki_zh_en", "--wiki_splits", "dev,zh2en-test", "--tokenizer_splits", "dev",
                           "--window", "4", "--vocab_size", "3000", "--output_dir", str(out)])
    counts = summary["splits"]
    assert counts["dev"]["sentences"] == counts["dev"]["examples"] == counts["dev"]["kept"] == 2020
    assert counts["dev"]["documents"] == 75 and counts["zh2en-test"]["documents"] == 30
    assert counts["zh2en-test"]["examples"] == 875
    dev = datasets.load_from_disk(str(out / "dev"))
    assert dev.column_names == COLUMNS
    ids, context = dev["doc_id"][:], dev["num_context"][:]
    starts = [i for i in range(len(ids)) if i == 0 or ids[i] != ids[i - 1]]
    assert len(starts) == 75 and all(context[i] == 0 for i in starts)
    assert max(context) == 3 and context.count(3) > 1500
    row = dev[3]
    assert row["num_context"] == 3 and len(split_sentences(row["source"])) == 4
    assert row["input_ids"].count(SEP_ID) == 3 and row["labels"].count(SEP_ID) == 3


@pytest.mark.parametrize("flags", [["--lowercase"], ["--vocab_size", "100"], ["--min_frequency", "1"],
                                   ["--tokenizer_splits", "valid"]])
def test_tokenizer_training_flags_with_a_given_tokenizer_are_a_usage_error(script, tmp_path, capsys, flags):
    """A given tokenizer is used as it is: --lowercase and the others would be recorded in preprocess.json as if
    applied while the data stays as that tokenizer makes it."""
    script.main(["--tsv", f"train={FIXTURE}", "--vocab_size", "300", "--output_dir", str(tmp_path / "a")])
    with pytest.raises(SystemExit) as exit_info:
        script.main(["--tsv", f"valid={FIXTURE}", "--tokenizer", str(tmp_path / "a" / "tokenizer"), *flags,
                     "--output_dir", str(tmp_path / "b")])
    assert exit_info.value.code == 2
    message = f"{flags[0]} train a tokenizer: with --tokenizer (used as it is) they do not apply"
    assert message in capsys.readouterr().err
    assert not (tmp_path / "b").exists()


def test_input_errors(script, tmp_path):
    with pytest.raises(SystemExit):  # no input
        script.main(["--output_dir", str(tmp_path / "x")])
    with pytest.raises(SystemExit):  # two kinds of input
        script.main(["--tsv", f"train={FIXTURE}", "--wiki_zh_en", "--output_dir", str(tmp_path / "x")])
    with pytest.raises(SystemExit):  # tokenizer split missing
        script.main(["--tsv", f"valid={FIXTURE}", "--output_dir", str(tmp_path / "x")])
    with pytest.raises(ValueError, match="needs a 'doc_id' column"):  # windows need documents
        script.main(["--tsv", f"train={FIXTURE}", "--window", "2", "--vocab_size", "300",
                     "--output_dir", str(tmp_path / "x")])
    assert not (tmp_path / "x").exists()  # checked before anything is written
    result = subprocess.run([sys.executable, str(SCRIPT), "--tsv", f"train={FIXTURE}", "--window", "2",
                             "--vocab_size", "300", "--output_dir", str(tmp_path / "y")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and "preprocess.py: error:" in result.stderr and "doc_id" in result.stderr


def test_lm_text_blocks_and_holdout(script, tmp_path):
    lines = [f"{s} {t}" for s, t in fixture_pairs()]  # 64 lines of German and English words
    corpus = tmp_path / "corpus.txt.gz"
    with gzip.open(corpus, "wt", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    out = tmp_path / "lm"
    summary = script.main(["--lm_text", f"train={corpus}", "--lm_holdout", "0.25", "--block_size", "16",
                           "--vocab_size", "300", "--output_dir", str(out)])
    counts = summary["splits"]
    assert counts["train"]["lines"] == 48 and counts["valid"]["lines"] == 16  # the last quarter, by position
    tok = AutoTokenizer.from_pretrained(out / "tokenizer")
    assert tok("ein Mann")["input_ids"][-1] != EOS_ID  # LM tokenizer: no </s> appended to a prompt
    for name in ("train", "valid"):
        blocks = datasets.load_from_disk(str(out / name))
        c = counts[name]
        assert len(blocks) == c["blocks"] > 0 and set(blocks.column_names) == {"input_ids", "labels", "num_tokens"}
        assert all(len(ids) == 16 for ids in blocks["input_ids"]) and blocks["labels"] == blocks["input_ids"]
        assert c["tokens_in_blocks"] + c["tail_tokens_dropped"] == c["tokens_total"] and c["tail_tokens_dropped"] < 16
        # the stream is every line's tokens followed by </s>: decoding the blocks gives the lines back, in order
        stream = [i for ids in blocks["input_ids"] for i in ids]
        part = lines[:48] if name == "train" else lines[48:]
        expected = [i for line in part for i in tok(line)["input_ids"] + [EOS_ID]]
        assert stream == expected[: len(stream)]


def test_lm_input_errors(script, tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text("a b c\n" * 50, encoding="utf-8")
    for argv in (["--lm_holdout", "1.5"], ["--window", "2"], ["--block_size", "0"], ["--tsv", f"train={FIXTURE}"],
                 ["--max_tokens_per_example", "20"], ["--keep_all_splits", "train"], ["--cache_dir", str(tmp_path)],
                 ["--lm_holdout", "0.1", "--lm_text", f"valid={corpus}"]):
        with pytest.raises(SystemExit):
            script.main(["--lm_text", f"train={corpus}", *argv, "--output_dir", str(tmp_path / "x")])
    assert not (tmp_path / "x").exists()
