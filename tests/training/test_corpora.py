"""talk_hf.training.corpora: file readers, pair loaders (text, TSV, JSON lines, Hub), the bundled corpora, document
windows and document helpers.

Fast: real data from data/ (Multi30k val, the Wikipedia zh-en archive, the IWSLT15 TED zh-en talks) and the 64-pair
fixture.
"""

import gzip
import hashlib
import json
import re
from pathlib import Path

import datasets
import pytest

from talk_hf.tokenization import split_sentences
from talk_hf.training.corpora import (
    WIKI_ZH_EN_ARCHIVE,
    count_documents,
    document_windows,
    group_documents,
    load_hub_pairs,
    read_lines,
    load_iwslt15_ted_zh_en,
    load_json_pairs,
    load_text_pairs,
    load_tsv_pairs,
    load_wiki_zh_en,
    reverse_pairs,
    write_lines,
)
from talk_hf.training.evaluation import last_sentences

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "data"
FIXTURE = ROOT / "tests" / "fixtures" / "multi30k_pairs.tsv"
# (pairs, documents) per split, as stated in data/README.md
WIKI_SIZES = {"train": (26505, 693), "dev": (2020, 75), "zh2en-test": (875, 30), "en2zh-test": (1147, 22)}


def fixture_pairs():
    with open(FIXTURE, encoding="utf-8") as f:
        return [tuple(line.rstrip("\n").split("\t")) for line in f]


def write(path, text, gz=False):
    if gz:
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        Path(path).write_text(text, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def pairs_ds():
    pairs = fixture_pairs()
    return datasets.Dataset.from_dict({"source": [p[0] for p in pairs], "target": [p[1] for p in pairs]})


@pytest.fixture(scope="module")
def wiki():
    return {split: load_wiki_zh_en(split) for split in WIKI_SIZES}



# ------------------------------------------------------------------------------------------------ text files


def test_load_text_pairs_keeps_every_line(tmp_path):
    src = write(tmp_path / "a.de", "Ein Hund.\n\nZwei Katzen.\r\nDrei.")  # empty line, CRLF, no final newline
    tgt = write(tmp_path / "a.en", "A dog.\n\nTwo cats.\nThree.\n")
    ds = load_text_pairs(src, tgt)
    assert ds.column_names == ["source", "target"]
    assert ds["source"] == ["Ein Hund.", "", "Zwei Katzen.", "Drei."]
    assert ds["target"] == ["A dog.", "", "Two cats.", "Three."]


def test_load_text_pairs_gz_matches_plain(tmp_path):
    pairs = fixture_pairs()
    src_text = "".join(p[0] + "\n" for p in pairs)
    tgt_text = "".join(p[1] + "\n" for p in pairs)
    plain = load_text_pairs(write(tmp_path / "s.txt", src_text), write(tmp_path / "t.txt", tgt_text))
    zipped = load_text_pairs(
        write(tmp_path / "s.txt.gz", src_text, gz=True), write(tmp_path / "t.gz", tgt_text, gz=True)
    )
    assert zipped.to_dict() == plain.to_dict()
    assert list(zip(plain["source"], plain["target"])) == pairs


def test_load_text_pairs_real_multi30k_val():
    ds = load_text_pairs(DATA / "multi30k" / "val.de.gz", DATA / "multi30k" / "val.en.gz")
    assert len(ds) == 1014
    with gzip.open(DATA / "multi30k" / "val.en.gz", "rt", encoding="utf-8") as f:
        first_en = f.readline().rstrip("\n")
    assert ds[0]["target"] == first_en and ds[0]["source"] != first_en


def test_load_text_pairs_mismatch_names_files_and_counts(tmp_path):
    src = write(tmp_path / "x.src", "a\nb\nc\n")
    tgt = write(tmp_path / "y.tgt", "a\nb\n")
    with pytest.raises(ValueError) as err:
        load_text_pairs(src, tgt)
    message = str(err.value)
    assert "x.src" in message and "y.tgt" in message and "3" in message and "2" in message


def test_load_text_pairs_bad_utf8_names_line(tmp_path):
    src = tmp_path / "bad.src"
    src.write_bytes(b"ok\nalso ok\n\xff\xfe broken\n")
    tgt = write(tmp_path / "t", "a\nb\nc\n")
    with pytest.raises(ValueError, match=r"bad\.src.*line 3"):
        load_text_pairs(src, tgt)


def test_load_text_pairs_refuses_a_stray_carriage_return(tmp_path):
    src = write(tmp_path / "s", "eins\nzw\rei\ndrei\n")  # 3 lines for wc -l; universal newlines would read 4
    tgt = write(tmp_path / "t", "one\ntwo\nthr\ree\n")
    with pytest.raises(ValueError, match=r"s: line 2 holds a carriage return"):
        load_text_pairs(src, tgt)
    assert read_lines(write(tmp_path / "mac", "a\rb\r")) == ["a", "b"]  # \r alone ends every line: fine


@pytest.mark.parametrize("damage", ["truncated", "corrupt"])
def test_damaged_gzip_data_is_named(tmp_path, damage):
    data = gzip.compress(("ein Hund läuft\n" * 200).encode())
    data = data[: len(data) // 2] if damage == "truncated" else data[:20] + bytes(40) + data[60:]
    path = tmp_path / "d.de.gz"
    path.write_bytes(data)
    with pytest.raises(ValueError, match=r"d\.de\.gz: (truncated or corrupt gzip data|named \.gz but not gzip data, or "
                                         r"corrupt)"):
        read_lines(path)


def test_write_lines_keeps_one_line_per_entry(tmp_path):
    """A byte-level tokenizer can decode a line break inside a hypothesis: it becomes a space, one line each."""
    write_lines(tmp_path / "h.txt", ["a\nb", "c\r\nd", "e\rf", "g\u2028h", ""])
    assert read_lines(tmp_path / "h.txt") == ["a b", "c d", "e f", "g\u2028h", ""]


def test_a_gz_name_on_plain_text_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"plain\.gz: named \.gz but not gzip data"):
        read_lines(write(tmp_path / "plain.gz", "a\n"))


# ------------------------------------------------------------------------------------------------ TSV / JSON


def test_load_tsv_fixture():
    ds = load_tsv_pairs(FIXTURE, 0, 1)
    assert ds.column_names == ["source", "target"]
    assert list(zip(ds["source"], ds["target"])) == fixture_pairs()
    swapped = load_tsv_pairs(FIXTURE, 1, 0)
    assert swapped["source"] == ds["target"]


def test_load_tsv_header_names_and_doc_column(tmp_path):
    path = write(tmp_path / "d.tsv.gz", "doc\tde\ten\nd1\tEins.\tOne.\nd1\tZwei.\tTwo.\nd2\tDrei.\tThree.\n", gz=True)
    ds = load_tsv_pairs(path, "de", "en", doc_column="doc")
    assert ds.to_dict() == {"source": ["Eins.", "Zwei.", "Drei."], "target": ["One.", "Two.", "Three."],
                            "doc_id": ["d1", "d1", "d2"]}
    with pytest.raises(ValueError, match=r"'fr'.*not in the header"):
        load_tsv_pairs(path, "fr", "en")


def test_load_tsv_errors_name_file_and_line(tmp_path):
    path = write(tmp_path / "p.tsv", "a\tb\nc\td\ne\tf\tg\n")
    with pytest.raises(ValueError, match=r"p\.tsv: line 3 has 3 tab-separated fields, expected 2"):
        load_tsv_pairs(path, 0, 1)
    good = write(tmp_path / "q.tsv", "a\tb\n")
    with pytest.raises(ValueError, match=r"q\.tsv: target column 2 is out of range"):
        load_tsv_pairs(good, 0, 2)
    with pytest.raises(ValueError, match="not a mix"):
        load_tsv_pairs(good, "de", 1)


def test_load_json_pairs(tmp_path):
    records = [{"translation": {"de": "Hallo", "en": "Hello"}, "doc": 7},
               {"translation": {"de": "Welt", "en": "World"}, "doc": 7}]
    path = write(tmp_path / "p.jsonl", json.dumps(records[0]) + "\n\n" + json.dumps(records[1]) + "\n")
    ds = load_json_pairs(path, "translation.de", "translation.en", doc_key="doc")
    assert ds.to_dict() == {"source": ["Hallo", "Welt"], "target": ["Hello", "World"], "doc_id": ["7", "7"]}
    flat = write(tmp_path / "f.jsonl.gz", json.dumps({"s": "x", "t": "y"}) + "\n", gz=True)
    assert load_json_pairs(flat, "s", "t").to_dict() == {"source": ["x"], "target": ["y"]}


@pytest.mark.parametrize("ids,message", [
    (['"a"', "null"], r"line 2 field 'doc' is null, expected a string or an integer"),
    (['{"id": 7}'], r"line 1 field 'doc' is \{\"id\": 7\}, expected"),
    (["true"], "line 1 field 'doc' is true, expected"),
    (["1", '"1"'], r"line 2 field 'doc' is \"1\", a str where earlier ids are ints: 1 and \"1\" would be one"),
])
def test_json_document_ids_are_strings_or_integers_of_one_type(tmp_path, ids, message):
    """The ids are stored as str: null, objects and booleans would all become one id, and 1 and "1" the same."""
    lines = "".join(f'{{"s": "a", "t": "b", "doc": {i}}}\n' for i in ids)
    with pytest.raises(ValueError, match=message):
        load_json_pairs(write(tmp_path / "d.jsonl", lines), "s", "t", doc_key="doc")


def test_load_json_errors(tmp_path):
    missing = write(tmp_path / "m.jsonl", '{"s": "a", "t": "b"}\n{"s": "c"}\n')
    with pytest.raises(ValueError, match=r"m\.jsonl: line 2 has no field 't'"):
        load_json_pairs(missing, "s", "t")
    broken = write(tmp_path / "b.jsonl", '{"s": "a", "t": "b"}\n{"s": \n')
    with pytest.raises(ValueError, match=r"b\.jsonl: line 2 is not valid JSON"):
        load_json_pairs(broken, "s", "t")
    number = write(tmp_path / "n.jsonl", '{"s": 3, "t": "b"}\n')
    with pytest.raises(ValueError, match=r"n\.jsonl: line 1 field 's' is int"):
        load_json_pairs(number, "s", "t")


# ------------------------------------------------------------------------------------------------ Hub path (local)


def test_load_hub_pairs_local_data_files(tmp_path):
    folder = tmp_path / "hub"
    folder.mkdir()
    rows = {"train": [("Hallo", "Hello"), ("Welt", "World")], "test": [("Tschüss", "Bye")]}
    for split, pairs in rows.items():
        lines = [json.dumps({"translation": {"de": de, "en": en}}) for de, en in pairs]
        write(folder / f"{split}.jsonl", "\n".join(lines) + "\n")
    ds = load_hub_pairs(str(folder), "train", "de", "en", cache_dir=tmp_path / "cache")
    assert ds.to_dict() == {"source": ["Hallo", "Welt"], "target": ["Hello", "World"]}
    rev = load_hub_pairs(str(folder), "test", "en", "de", cache_dir=tmp_path / "cache")
    assert rev.to_dict() == {"source": ["Bye"], "target": ["Tschüss"]}
    with pytest.raises(ValueError, match="'fr'"):
        load_hub_pairs(str(folder), "train", "fr", "en", cache_dir=tmp_path / "cache")


def test_a_saved_dataset_without_a_split_is_not_several_splits(tmp_path):
    """Dataset.from_dict(...).save_to_disk records no split: load_hub_pairs gives it for any split name, so
    preparing train, validation and test from it would make three copies (the test set trained on)."""
    from talk_hf.training.prepare import load_pair_splits

    datasets.Dataset.from_dict({"de": ["a", "b"], "en": ["x", "y"]}).save_to_disk(str(tmp_path / "one"))
    with pytest.raises(ValueError, match=r"one dataset saved without a split name, which cannot be 3 splits"):
        load_pair_splits(hub_dataset=str(tmp_path / "one"), source_lang="de", target_lang="en")
    splits = load_pair_splits(hub_dataset=str(tmp_path / "one"), source_lang="de", target_lang="en",
                              hub_splits=["train"])
    assert splits["train"].to_dict() == {"source": ["a", "b"], "target": ["x", "y"]}


def test_load_hub_pairs_save_to_disk_folder(tmp_path):
    dd = datasets.DatasetDict({
        "train": datasets.Dataset.from_dict({"de": ["a", "b"], "en": ["x", "y"], "doc_id": [0, 0]}),
        "validation": datasets.Dataset.from_dict({"de": ["c"], "en": ["z"], "doc_id": [1]}),
    })
    dd.save_to_disk(str(tmp_path / "saved"))
    ds = load_hub_pairs(str(tmp_path / "saved"), "validation", "de", "en")
    assert ds.to_dict() == {"source": ["c"], "target": ["z"], "doc_id": [1]}
    with pytest.raises(ValueError, match="no split 'test'"):
        load_hub_pairs(str(tmp_path / "saved"), "test", "de", "en")
    with pytest.raises(ValueError, match=r"no column\(s\) \['fr'\]"):
        load_hub_pairs(str(tmp_path / "saved"), "train", "fr", "en")


# ------------------------------------------------------------------------------------------------ Wikipedia zh-en


def test_wiki_archive_is_the_upstream_file():
    digest = hashlib.sha256(WIKI_ZH_EN_ARCHIVE.read_bytes()).hexdigest()
    assert digest == "6b607ac1df88ef5db2f1799daff994a1f0bcabdc43283fed11ec67b49b03e894"
    assert WIKI_ZH_EN_ARCHIVE == DATA / "wiki_zh_en" / "zh-en.tar.gz"


def test_wiki_split_sizes(wiki):
    for split, (pairs, docs) in WIKI_SIZES.items():
        ds = wiki[split]
        assert len(ds) == pairs, split
        assert count_documents(ds) == docs, split
        assert len(set(ds["doc_id"])) == docs, split  # contiguous runs get distinct ids
    assert len(set(wiki["train"]["title"])) == 692  # one title occurs in two separate runs
    assert set(wiki["dev"].column_names) == {"doc_id", "title", "section_zh", "section_en", "source", "target"}


def test_wiki_documents_are_title_runs(wiki):
    ds = wiki["train"]
    titles, ids = ds["title"][:], ds["doc_id"][:]
    assert ids[0] == 0 and ids[-1] == 692
    for i in range(1, len(ds)):
        assert ids[i] == ids[i - 1] + (titles[i] != titles[i - 1])


def test_wiki_content(wiki):
    first = wiki["dev"][0]
    assert first["title"] == "吴健雄" and first["section_en"] == "Introduction"
    assert first["source"].startswith("吴健雄，美籍华裔物理学家")
    assert first["target"].startswith("Chien-Shiung Wu")
    cjk = re.compile(r"[\u4e00-\u9fff]")
    assert all(cjk.search(s) for s in wiki["zh2en-test"]["source"][:50])
    assert not any(cjk.search(t) for t in wiki["zh2en-test"]["target"][:50])
    assert all(s and t for s, t in zip(wiki["dev"]["source"], wiki["dev"]["target"]))


def test_wiki_unknown_split():
    with pytest.raises(ValueError, match="unknown wiki zh-en split 'test'"):
        load_wiki_zh_en("test")


# ------------------------------------------------------------------------------------------------ windows


def six_and_two():
    return datasets.Dataset.from_dict({
        "source": [f"s{i}" for i in range(1, 7)] + ["u1", "u2"],
        "target": [f"t{i}" for i in range(1, 7)] + ["v1", "v2"],
        "doc_id": ["A"] * 6 + ["B"] * 2,
    })


def test_window4_on_six_sentence_doc():
    out = document_windows(six_and_two(), 4)
    assert out.column_names == ["source", "target", "doc_id", "num_context"]
    assert out["source"] == [
        "s1",
        "s1 <sep> s2",
        "s1 <sep> s2 <sep> s3",
        "s1 <sep> s2 <sep> s3 <sep> s4",
        "s2 <sep> s3 <sep> s4 <sep> s5",
        "s3 <sep> s4 <sep> s5 <sep> s6",
        "u1",
        "u1 <sep> u2",
    ]
    assert out["target"][5] == "t3 <sep> t4 <sep> t5 <sep> t6" and out["target"][7] == "v1 <sep> v2"
    assert out["num_context"] == [0, 1, 2, 3, 3, 3, 0, 1]
    assert out["doc_id"] == ["A"] * 6 + ["B"] * 2
    assert document_windows(six_and_two(), 2, sep_token="|")["source"][2] == "s2 | s3"


def test_a_blank_sentence_is_left_out_of_the_other_windows():
    """As document translation leaves it out: the sentences after it take those before it as context, and its own
    window is itself alone (its translation is empty)."""
    doc = datasets.Dataset.from_dict({"source": ["s1", " ", "s3", "s4"], "target": ["t1", "", "t3", "t4"],
                                      "doc_id": ["A"] * 4})
    out = document_windows(doc, 3)
    assert out["source"] == ["s1", "", "s1 <sep> s3", "s1 <sep> s3 <sep> s4"]
    assert out["target"] == ["t1", "", "t1 <sep> t3", "t1 <sep> t3 <sep> t4"]
    assert out["num_context"] == [0, 0, 1, 2]


def test_window1_is_sentence_level(wiki, pairs_ds):
    dev = wiki["dev"]
    out = document_windows(dev, 1)
    assert out["source"] == [s.strip() for s in dev["source"]]
    assert out["target"] == [t.strip() for t in dev["target"]]
    assert set(out["num_context"]) == {0} and out["doc_id"] == dev["doc_id"]
    plain = document_windows(pairs_ds, 1)  # no doc_id: every row its own document
    assert plain["source"] == pairs_ds["source"] and plain["doc_id"] == list(range(len(pairs_ds)))


def test_windows_never_cross_documents(wiki):
    dev, window = wiki["dev"], 4
    out = document_windows(dev, window)
    sources, targets, ids = dev["source"][:], dev["target"][:], dev["doc_id"][:]
    assert len(out) == len(dev)
    for i, (src, tgt, context) in enumerate(zip(out["source"], out["target"], out["num_context"])):
        first = i - context
        assert split_sentences(src) == [s.strip() for s in sources[first : i + 1]]
        assert split_sentences(tgt) == [t.strip() for t in targets[first : i + 1]]
        assert ids[first] == ids[i]  # same document
        # as long as possible: either the full window or the document starts at `first`
        assert context == window - 1 or first == 0 or ids[first - 1] != ids[i]
        assert last_sentences([src]) == [sources[i].strip()]


def test_window_errors(pairs_ds):
    with pytest.raises(ValueError, match="needs a 'doc_id' column"):
        document_windows(pairs_ds, 2)
    with pytest.raises(ValueError, match="window must be an int >= 1"):
        document_windows(six_and_two(), 0)
    bad = datasets.Dataset.from_dict({"source": ["a", "b <sep> c"], "target": ["x", "y"], "doc_id": [0, 0]})
    with pytest.raises(ValueError, match="row 1 source already contains the separator"):
        document_windows(bad, 2)


def test_last_sentences():
    assert last_sentences(["A dog. <sep> It barks. <sep> Loudly.", "  Only one.  ", "a <sep>"]) == [
        "Loudly.", "Only one.", ""]
    assert last_sentences(["a | b"], sep_token="|") == ["b"]
    assert last_sentences(["</s> Er <sep> bellt.</s><pad>"]) == ["bellt."]  # decoded hypotheses keep specials


def test_count_documents_and_reverse():
    ds = datasets.Dataset.from_dict({"source": list("abcde"), "target": list("vwxyz"), "doc_id": [1, 1, 2, 1, 1]})
    assert count_documents(ds) == 3  # the second run of id 1 is a separate document
    assert count_documents(ds.remove_columns("doc_id")) == 5
    rev = reverse_pairs(ds)
    assert rev["source"] == list("vwxyz") and rev["target"] == list("abcde") and rev["doc_id"] == ds["doc_id"]


def test_iwslt15_ted_zh_en_talks():
    """The bundled IWSLT15 TED zh-en sets with their document boundaries (counts as stated in data/README.md)."""
    dev, test = load_iwslt15_ted_zh_en("dev2010"), load_iwslt15_ted_zh_en("test")
    assert (len(dev), dev["doc_id"][-1] + 1) == (887, 8)
    assert (len(test), test["doc_id"][-1] + 1) == (5473, 56)
    parts = [load_iwslt15_ted_zh_en(f"tst201{i}") for i in range(4)]
    assert [len(p) for p in parts] == [1570, 1245, 1397, 1261]
    assert list(test["source"]) == [s for p in parts for s in p["source"]]
    ids = list(test["doc_id"])
    assert ids == sorted(ids) and set(ids) == set(range(56))  # talks in order, none split
    assert test[0]["source"].startswith("有一天") and test[0]["target"].startswith("One day, Los Angeles Times")
    windows = document_windows(test.select(range(300)), window=4)
    assert len(windows) == 300 and windows[0]["source"] == test[0]["source"]  # a talk's first window is one sentence
    with pytest.raises(ValueError, match="unknown IWSLT15"):
        load_iwslt15_ted_zh_en("train")
    with pytest.raises(FileNotFoundError, match="pass folder="):
        load_iwslt15_ted_zh_en("dev2010", folder="/nonexistent")


def test_an_iwslt_document_file_that_is_not_line_numbers_is_named(tmp_path):
    import shutil

    for name in ("zh", "en"):
        shutil.copy(DATA / "iwslt15_ted_zh_en" / f"IWSLT15.TED.dev2010.zh-en.{name}.gz", tmp_path)
    (tmp_path / "IWSLT15.TED.dev2010.zh-en.doc").write_text("0\n0,2\n")
    with pytest.raises(ValueError, match=r"IWSLT15\.TED\.dev2010\.zh-en\.doc: '0,2' is not a line number"):
        load_iwslt15_ted_zh_en("dev2010", folder=tmp_path)


def test_group_documents_follows_runs_of_doc_ids():
    assert group_documents(list("abcdef"), [0, 0, 1, 1, 1, 0]) == [["a", "b"], ["c", "d", "e"], ["f"]]
    assert group_documents([], []) == []
    with pytest.raises(ValueError, match="3 values for 2 doc_ids"):
        group_documents([1, 2, 3], [0, 0])
