"""talk_hf.training.prepare: prepared folders (tokenizer/, <split>/, preprocess.json) for translation and LM data,
written from the 64-pair fixture and small hand-made corpora."""

import io
import json
import multiprocessing
import tarfile
import time
from pathlib import Path

import datasets
import pytest
from transformers import AutoTokenizer

from talk_hf.tokenization import EOS_ID, SEP_ID, split_sentences, train_joint_bpe
from talk_hf.training.corpora import load_tsv_pairs
from talk_hf.training.prepare import (
    SUMMARY_FILE,
    load_pair_splits,
    prepare_lm_data,
    prepare_once,
    prepare_translation_data,
    prepare_wiki_zh_en,
)
from tests.convert.fairseq_layout import fairseq_tokenizer

FIXTURE = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "multi30k_pairs.tsv"
COLUMNS = ["source", "target", "doc_id", "num_context", "input_ids", "labels", "num_tokens"]


def fixture_pairs():
    with open(FIXTURE, encoding="utf-8") as f:
        return [tuple(line.rstrip("\n").split("\t")) for line in f]


@pytest.fixture(scope="module")
def pairs():
    return load_tsv_pairs(FIXTURE, 0, 1)


@pytest.fixture(scope="module")
def prepared(pairs, tmp_path_factory):
    """A folder with train (the 64 pairs) and valid (the first 16), examples over 30 tokens dropped."""
    out = tmp_path_factory.mktemp("prepared") / "data"
    summary = prepare_translation_data(out, {"train": pairs, "valid": pairs.select(range(16))}, vocab_size=300,
                                       max_tokens_per_example=30)
    return out, summary


def documents():
    """Two documents, of 3 and 2 sentences."""
    return datasets.Dataset.from_dict({
        "source": ["Ein Hund.", "Er bellt.", "Laut.", "Zwei Kinder.", "Sie spielen."],
        "target": ["A dog.", "It barks.", "Loudly.", "Two children.", "They play."],
        "doc_id": ["a", "a", "a", "b", "b"],
    })


def test_translation_splits_counts_and_summary(prepared):
    out, summary = prepared
    assert sorted(p.name for p in out.iterdir()) == ["preprocess.json", "tokenizer", "train", "valid"]
    assert json.loads((out / SUMMARY_FILE).read_text(encoding="utf-8")) == json.loads(json.dumps(summary))
    tok = AutoTokenizer.from_pretrained(out / "tokenizer")
    assert len(tok) == 300 and tok.sep_token_id == SEP_ID and tok.eos_token_id == EOS_ID
    assert summary["tokenizer"] == {"vocab_size": 300, "trained_on": ["train"]}
    assert summary["args"]["splits"] == ["train", "valid"] and summary["args"]["max_tokens_per_example"] == 30
    assert summary["args"]["output_dir"] == str(out) and summary["args"]["tokenizer"] is None
    source_pairs = fixture_pairs()
    for name, rows in (("train", source_pairs), ("valid", source_pairs[:16])):
        keep = [len(tok(s)["input_ids"]) <= 30 and len(tok(t)["input_ids"]) <= 30 for s, t in rows]
        counts = summary["splits"][name]
        assert counts["sentences"] == counts["examples"] == len(rows) and counts["documents"] is None
        assert (counts["kept"], counts["dropped"]) == (keep.count(True), keep.count(False))
        ds = datasets.load_from_disk(str(out / name))
        assert ds.column_names == COLUMNS and len(ds) == counts["kept"]
        assert list(zip(ds["source"], ds["target"])) == [r for r, k in zip(rows, keep) if k]
        assert ds["input_ids"] == tok(ds["source"][:])["input_ids"] and all(ids[-1] == EOS_ID for ids in ds["labels"])
        assert counts["num_tokens_total"] == sum(ds["num_tokens"]) and counts["num_tokens_max"] <= 30
    assert 0 < summary["splits"]["train"]["dropped"] < 64  # the limit is exercised


def test_translation_reuses_a_tokenizer(prepared, pairs, tmp_path):
    out, _ = prepared
    folder = str(out / "tokenizer")
    tok = AutoTokenizer.from_pretrained(folder)
    by_path = prepare_translation_data(tmp_path / "a", {"test": pairs.select(range(8))}, tokenizer=folder,
                                       vocab_size=50)
    by_object = prepare_translation_data(tmp_path / "b", {"test": pairs.select(range(8))}, tokenizer=tok)
    assert by_path["tokenizer"] == {"vocab_size": 300, "trained_on": None}  # vocab_size ignored: nothing trained
    assert by_path["args"]["tokenizer"] == folder and by_object["args"]["tokenizer"] == folder  # name_or_path
    for name in ("a", "b"):
        test = datasets.load_from_disk(str(tmp_path / name / "test"))
        assert test["input_ids"] == tok([s for s, _ in fixture_pairs()[:8]])["input_ids"]
        assert AutoTokenizer.from_pretrained(tmp_path / name / "tokenizer").get_vocab() == tok.get_vocab()


def test_translation_windows_reverse_and_recorded_args(tmp_path):
    summary = prepare_translation_data(tmp_path, {"train": documents()}, window=2, reverse=True, vocab_size=80,
                                       min_frequency=1, args={"corpus": "hand-made"})
    assert summary["args"] == {"corpus": "hand-made"}
    counts = summary["splits"]["train"]
    assert (counts["sentences"], counts["documents"], counts["examples"], counts["dropped"]) == (5, 2, 5, 0)
    ds = datasets.load_from_disk(str(tmp_path / "train"))
    assert ds["num_context"] == [0, 1, 1, 0, 1] and ds["doc_id"] == ["a", "a", "a", "b", "b"]
    assert split_sentences(ds["source"][2]) == ["It barks.", "Loudly."]  # reversed: English source
    assert split_sentences(ds["target"][4]) == ["Zwei Kinder.", "Sie spielen."]  # never across documents
    assert [ids.count(SEP_ID) for ids in ds["input_ids"]] == [0, 1, 1, 0, 1]


def test_translation_errors_write_nothing(pairs, tmp_path):
    out = tmp_path / "x"
    with pytest.raises(ValueError, match="needs a 'doc_id' column"):  # windows need documents
        prepare_translation_data(out, {"train": pairs}, window=2, vocab_size=300)
    with pytest.raises(ValueError, match="window must be an int >= 1"):
        prepare_translation_data(out, {"train": pairs}, window=0)
    with pytest.raises(ValueError, match=r"tokenizer_splits \['train'\] are not among the splits \['valid'\]"):
        prepare_translation_data(out, {"valid": pairs})
    with pytest.raises(ValueError, match="keep_all_splits"):
        prepare_translation_data(out, {"train": pairs}, keep_all_splits=["test"])
    with pytest.raises(ValueError, match="no splits"):
        prepare_translation_data(out, {})
    with pytest.raises(ValueError, match=r"would be dropped from \{'test': \d+\}"):  # a test set must be whole
        prepare_translation_data(out, {"train": pairs, "test": pairs}, vocab_size=300, max_tokens_per_example=20,
                                 keep_all_splits=["test"])
    with pytest.raises(ValueError, match=r"split\(s\) \['valid'\] hold no sentence pairs"):
        prepare_translation_data(out, {"train": pairs, "valid": pairs.select([])}, vocab_size=300)
    with pytest.raises(ValueError, match=r"every example of split\(s\) \['train'\] is longer than "):
        prepare_translation_data(out, {"train": pairs}, vocab_size=300, max_tokens_per_example=2)
    assert not out.exists()


def test_load_pair_splits(tmp_path):
    (tmp_path / "s.txt").write_text("Ein Hund.\nZwei Kinder.\n", encoding="utf-8")
    (tmp_path / "t.txt").write_text("A dog.\nTwo children.\n", encoding="utf-8")
    splits = load_pair_splits(text_files={"test": (tmp_path / "s.txt", tmp_path / "t.txt")})
    assert list(splits) == ["test"] and splits["test"]["target"] == ["A dog.", "Two children."]
    tsv = load_pair_splits(tsv_files={"train": FIXTURE, "valid": FIXTURE}, source_column=1, target_column=0)
    assert list(tsv) == ["train", "valid"] and tsv["valid"]["source"][0] == fixture_pairs()[0][1]
    with pytest.raises(ValueError, match="exactly one kind of input, got none"):
        load_pair_splits()
    with pytest.raises(ValueError, match=r"got \['tsv_files', 'json_files'\]"):
        load_pair_splits(tsv_files={"train": FIXTURE}, json_files={"train": FIXTURE})
    with pytest.raises(ValueError, match="needs source_lang and target_lang"):
        load_pair_splits(hub_dataset="bentrevett/multi30k")
    with pytest.raises(ValueError, match="tsv_files is empty"):
        load_pair_splits(tsv_files={})


def wiki_archive(path):
    """A zh-en.tar.gz in the layout of the bundled one: a dev split of two documents (page titles)."""
    rows = [("Hund", "Intro", "Intro", f"狗{i}。", f"Dog {i}.") for i in range(3)]
    rows += [("Katze", "Intro", "Intro", f"猫{i}。", f"Cat {i}.") for i in range(2)]
    payload = "".join("\t".join(r) + "\n" for r in rows).encode("utf-8")
    with tarfile.open(path, "w:gz") as tar:
        info = tarfile.TarInfo("zh-en/dev.zh-en")
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    return path


def test_prepare_wiki_zh_en_from_an_archive(tmp_path):
    archive = wiki_archive(tmp_path / "zh-en.tar.gz")
    summary = prepare_wiki_zh_en(tmp_path / "out", ["dev"], archive=archive, window=3, tokenizer_splits=["dev"],
                                 vocab_size=60, min_frequency=1)
    assert summary["splits"]["dev"]["documents"] == 2 and summary["splits"]["dev"]["examples"] == 5
    dev = datasets.load_from_disk(str(tmp_path / "out" / "dev"))
    assert dev["num_context"] == [0, 1, 2, 0, 1] and dev["doc_id"] == [0, 0, 0, 1, 1]
    assert split_sentences(dev["target"][2]) == ["Dog 0.", "Dog 1.", "Dog 2."]
    with pytest.raises(ValueError, match="splits repeat"):
        prepare_wiki_zh_en(tmp_path / "x", ["dev", "dev"], archive=archive)
    with pytest.raises(ValueError, match="unknown wiki zh-en split"):
        prepare_wiki_zh_en(tmp_path / "x", ["valid"], archive=archive)
    assert not (tmp_path / "x").exists()


def test_lm_blocks_holdout_and_counts(tmp_path):
    lines = [f"{s} {t}" for s, t in fixture_pairs()]
    summary = prepare_lm_data(tmp_path, {"train": lines}, holdout=0.25, block_size=16, vocab_size=300)
    counts = summary["splits"]
    assert list(counts) == ["train", "valid"] and (counts["train"]["lines"], counts["valid"]["lines"]) == (48, 16)
    assert summary["tokenizer"] == {"vocab_size": 300, "trained_on": ["train"]}
    assert summary["args"]["holdout"] == 0.25 and summary["args"]["splits"] == ["train"]
    tok = AutoTokenizer.from_pretrained(tmp_path / "tokenizer")
    for name, part in (("train", lines[:48]), ("valid", lines[48:])):
        blocks = datasets.load_from_disk(str(tmp_path / name))
        stream = [i for line in part for i in tok(line)["input_ids"] + [EOS_ID]]  # no </s> from the tokenizer
        c = counts[name]
        assert c["tokens_total"] == len(stream) and c["blocks"] == len(blocks) == len(stream) // 16
        assert c["tail_tokens_dropped"] == len(stream) % 16 == c["tokens_total"] - c["tokens_in_blocks"]
        assert [i for ids in blocks["input_ids"] for i in ids] == stream[: len(blocks) * 16]
        assert blocks["labels"] == blocks["input_ids"] and set(blocks["num_tokens"]) == {16}
    reused = prepare_lm_data(tmp_path / "again", {"test": lines[:8]}, tokenizer=tmp_path / "tokenizer", block_size=8)
    assert reused["tokenizer"] == {"vocab_size": 300, "trained_on": None}


def test_lm_errors_write_nothing(tmp_path):
    out = tmp_path / "x"
    lines = ["a b c d"] * 40
    for kwargs, message in (({"holdout": 1.5}, "holdout must be in"), ({"block_size": 0}, "block_size must be"),
                            ({"tokenizer_splits": ["valid"]}, "are not among the splits")):
        with pytest.raises(ValueError, match=message):
            prepare_lm_data(out, {"train": lines}, vocab_size=30, min_frequency=1, **kwargs)
    with pytest.raises(ValueError, match="needs a 'train' split and no 'valid' one"):
        prepare_lm_data(out, {"train": lines, "valid": lines}, holdout=0.1)
    with pytest.raises(ValueError, match="split 'test': .*fewer than block_size"):  # a split too short for a block
        prepare_lm_data(out, {"train": lines, "test": ["a"]}, block_size=8, vocab_size=30, min_frequency=1)
    assert not out.exists()


def _build_slowly(folder):
    """A preparation that takes a while, noting each start in <folder>.starts."""
    def build():
        with open(f"{folder}.starts", "a") as f:
            f.write("start\n")
        time.sleep(0.5)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / SUMMARY_FILE).write_text("{}")

    return prepare_once(folder, build)


def test_processes_started_together_prepare_a_folder_once(tmp_path):
    folder = tmp_path / "data_wikitext2"
    with multiprocessing.get_context("spawn").Pool(3) as pool:
        assert pool.map(_build_slowly, [folder] * 3) == [folder] * 3
    assert (tmp_path / "data_wikitext2.starts").read_text() == "start\n"
    assert _build_slowly(folder) == folder and (tmp_path / "data_wikitext2.starts").read_text() == "start\n"


def test_preparing_again_replaces_the_earlier_splits_and_tokenizer(pairs, tmp_path):
    prepare_translation_data(tmp_path, {"train": pairs, "test": pairs.select(range(4))}, vocab_size=300)
    summary = prepare_translation_data(tmp_path, {"train": pairs}, vocab_size=200)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["preprocess.json", "tokenizer", "train"]  # no old test/
    assert len(AutoTokenizer.from_pretrained(tmp_path / "tokenizer")) == 200 == summary["tokenizer"]["vocab_size"]


def test_a_preparation_stopped_part_way_is_refused_not_completed(pairs, tmp_path, monkeypatch):
    prepare_translation_data(tmp_path, {"train": pairs, "valid": pairs.select(range(4))}, vocab_size=300)

    def stop(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(datasets.Dataset, "save_to_disk", stop)
    with pytest.raises(KeyboardInterrupt):
        prepare_translation_data(tmp_path, {"train": pairs, "valid": pairs.select(range(4))}, vocab_size=200)
    monkeypatch.undo()
    assert not (tmp_path / SUMMARY_FILE).exists()  # never taken for a finished preparation
    with pytest.raises(ValueError, match="holds a tokenizer but no preprocess.json"):
        prepare_translation_data(tmp_path, {"train": pairs}, vocab_size=200)


def test_a_folder_prepared_with_other_settings_is_refused(tmp_path):
    lines = ["a b c d e f"] * 40

    def prepare(block_size):
        return prepare_once(tmp_path / "data", lambda: prepare_lm_data(
            tmp_path / "data", {"train": lines}, block_size=block_size, vocab_size=30, min_frequency=1),
            settings={"block_size": block_size, "vocab_size": 30})

    assert prepare(8) == tmp_path / "data" and prepare(8) == tmp_path / "data"
    with pytest.raises(ValueError, match=r"prepared with block_size=8 \(asked for 4\)"):
        prepare(4)


def test_a_tokenizer_of_the_other_kind_is_refused(pairs, tmp_path):
    lines = [s for s, _ in fixture_pairs()]
    lm_tok = train_joint_bpe(lines, 200, add_eos=False)
    translation_tok = train_joint_bpe(lines, 200)
    with pytest.raises(ValueError, match=r"does not end every target with </s>"):
        prepare_translation_data(tmp_path / "a", {"train": pairs}, tokenizer=lm_tok)
    with pytest.raises(ValueError, match=r"appends </s> to every encoding"):
        prepare_lm_data(tmp_path / "b", {"train": lines}, tokenizer=translation_tok, block_size=8)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_a_converted_fairseq_tokenizer_prepares_data(tmp_path):
    """A slow tokenizer (a converted fairseq checkpoint's, to fine-tune it) encodes the splits and keys the cache
    by its files."""
    tok = fairseq_tokenizer(tmp_path, "".join(f"{w} 1\n" for w in ["ein", "hund", "a", "dog", "."]))
    pairs = datasets.Dataset.from_dict({"source": ["ein hund ."], "target": ["a dog ."]})
    prepare_translation_data(tmp_path / "data", {"train": pairs}, tokenizer=tok, cache_dir=tmp_path / "cache")
    train = datasets.load_from_disk(str(tmp_path / "data" / "train"))
    assert train["input_ids"] == [tok("ein hund .")["input_ids"]]
    assert train["labels"] == [tok(text_target="a dog .")["input_ids"]]
