"""Joint BPE tokenizer (talk_hf.tokenization) and the shipped data files. Fast: trains on 64 fixture pairs."""

import gzip
import json
import re
import unicodedata
from pathlib import Path

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from talk_hf.tokenization import SPECIAL_TOKENS, join_sentences, split_sentences, train_joint_bpe

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "data"
FIXTURE = Path(__file__).resolve().parent / "fixtures" / "multi30k_pairs.tsv"
VOCAB = 300
WINDOW = ["Ein Hund rennt über die Wiese.", "Zwei Männer spielen.", "Ein Mädchen klettert."]


def read_pairs():
    with open(FIXTURE, encoding="utf-8") as f:
        return [tuple(line.rstrip("\n").split("\t")) for line in f]


def joint_texts(pairs):
    return [side for pair in pairs for side in pair]


def gz_lines(path):
    with gzip.open(path, "rt", encoding="utf-8", newline="") as f:
        return f.read().splitlines()


@pytest.fixture(scope="module")
def pairs():
    return read_pairs()


@pytest.fixture(scope="module")
def mt_tok(pairs):
    return train_joint_bpe(joint_texts(pairs), VOCAB, model_max_length=256)


@pytest.fixture(scope="module")
def lm_tok(pairs):
    return train_joint_bpe(joint_texts(pairs), VOCAB, add_eos=False)


def plain_ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


# --------------------------------------------------------------------------------------------- special tokens


def test_special_token_ids(mt_tok, lm_tok):
    assert SPECIAL_TOKENS == ["<s>", "<pad>", "</s>", "<unk>", "<sep>"]
    for tok in (mt_tok, lm_tok):
        assert isinstance(tok, PreTrainedTokenizerFast)
        assert tok.convert_tokens_to_ids(SPECIAL_TOKENS) == [0, 1, 2, 3, 4]
        assert (tok.bos_token_id, tok.pad_token_id, tok.eos_token_id, tok.unk_token_id, tok.sep_token_id) == (
            0, 1, 2, 3, 4
        )
        assert tok.sep_token == "<sep>"
        assert set(tok.all_special_ids) == {0, 1, 2, 3, 4}
        assert len(tok) == VOCAB
    assert mt_tok.model_max_length == 256 and lm_tok.model_max_length == 1024


def test_a_single_string_or_an_empty_corpus_is_refused():
    """One string is not a corpus (iterated, it is its characters: no merge could span two of them), and a corpus
    without text learns no token, so every text would encode to <unk>."""
    with pytest.raises(TypeError, match="texts must be an iterable of sentences, not one str"):
        train_joint_bpe("Ein Hund rennt.\nZwei Männer spielen.", VOCAB)
    for corpus in ([], ["", "   "]):
        with pytest.raises(ValueError, match="learned no token: texts held no text"):
            train_joint_bpe(corpus, VOCAB)


def test_unknown_character_maps_to_unk(mt_tok):
    assert "Ω" not in "".join(joint_texts(read_pairs()))
    assert 3 in plain_ids(mt_tok, "Ein Ω")


# ------------------------------------------------------------------------------------ post-processor variants


def test_translation_appends_eos_only(mt_tok, pairs):
    for de, _ in pairs[:8]:
        ids = mt_tok(de)["input_ids"]
        assert ids[-1] == 2 and ids.count(2) == 1
        assert ids[:-1] == plain_ids(mt_tok, de)
        assert 0 not in ids


def test_lm_variant_appends_nothing(lm_tok, mt_tok, pairs):
    for de, en in pairs[:8]:
        ids = lm_tok(en)["input_ids"]
        assert 2 not in ids and 0 not in ids
        assert ids == plain_ids(lm_tok, en)
        # Same training data, so the same vocabulary; only the post-processor differs.
        assert ids + [2] == mt_tok(en)["input_ids"]


def test_add_bos_prepends_bos(pairs):
    tok = train_joint_bpe(joint_texts(pairs), VOCAB, add_eos=False, add_bos=True)
    text = pairs[0][1]
    ids = tok(text)["input_ids"]
    assert ids == [0] + plain_ids(tok, text)


# -------------------------------------------------------------------------------------------------- <sep>


def test_sep_is_one_token_with_no_stray_spaces(mt_tok):
    left, right = "Ein Hund rennt.", "Er bellt."
    ids = mt_tok(f"{left} <sep> {right}")["input_ids"]
    assert ids.count(4) == 1 and 3 not in ids
    # The spaces around <sep> vanish: no lone '▁' piece before or after it.
    assert ids == plain_ids(mt_tok, left) + [4] + plain_ids(mt_tok, right) + [2]
    assert mt_tok(f"{left}<sep>{right}")["input_ids"] == ids
    assert mt_tok.convert_tokens_to_ids(mt_tok.tokenize(f"{left} <sep> {right}")) == ids[:-1]


def test_sep_skipped_by_decode(mt_tok):
    ids = mt_tok("Ein Hund rennt. <sep> Er bellt.")["input_ids"]
    assert mt_tok.decode(ids, skip_special_tokens=True) == "Ein Hund rennt. Er bellt."
    kept = mt_tok.decode(ids)
    assert kept.count("<sep>") == 1 and kept.endswith("</s>")


def test_lowercase_variant(pairs):
    tok = train_joint_bpe(joint_texts(pairs), VOCAB, lowercase=True)
    assert tok("ZWEI MÄNNER <sep> Ein HUND")["input_ids"] == tok("zwei männer <sep> ein hund")["input_ids"]
    assert tok("zwei <sep> hund")["input_ids"].count(4) == 1
    assert tok.decode(tok("Zwei Männer")["input_ids"], skip_special_tokens=True) == "zwei männer"


# ---------------------------------------------------------------------------------------------- round trips


def test_decode_round_trip(mt_tok, pairs):
    for text in joint_texts(pairs):
        ids = mt_tok(text)["input_ids"]
        assert 3 not in ids
        assert mt_tok.decode(ids, skip_special_tokens=True) == unicodedata.normalize("NFKC", text).strip()


def test_whitespace_runs_are_one_space(mt_tok):
    """Tabs, line breaks and repeated spaces separate words as one space does (not <unk>, not extra word starts)."""
    plain = mt_tok("Ein Hund rennt im Park.")["input_ids"]
    assert mt_tok("Ein\tHund  rennt\nim \r\n Park.")["input_ids"] == plain
    assert mt_tok.unk_token_id not in plain


def test_decode_applies_nfkc(mt_tok):
    text = "Ein ﬁsch\u00a0im Wasser"  # 'ﬁ' ligature and a no-break space
    out = mt_tok.decode(mt_tok(text)["input_ids"], skip_special_tokens=True)
    assert out == unicodedata.normalize("NFKC", text) == "Ein fisch im Wasser"


def test_text_target_gives_labels(mt_tok, pairs):
    src = [de for de, _ in pairs[:4]]
    tgt = [en for _, en in pairs[:4]]
    enc = mt_tok(src, text_target=tgt)
    assert set(enc) == {"input_ids", "attention_mask", "labels"}
    assert enc["input_ids"] == mt_tok(src)["input_ids"]
    assert enc["labels"] == mt_tok(tgt)["input_ids"]
    assert enc["labels"] != enc["input_ids"]
    assert all(lab[-1] == 2 for lab in enc["labels"])
    assert [sum(m) for m in enc["attention_mask"]] == [len(x) for x in enc["input_ids"]]


def test_truncation_keeps_eos(mt_tok, pairs):
    src = [de for de, _ in pairs[:4]]
    tgt = [en for _, en in pairs[:4]]
    full = mt_tok(src, text_target=tgt)
    assert all(len(x) > 6 for x in full["input_ids"] + full["labels"])
    enc = mt_tok(src, text_target=tgt, max_length=6, truncation=True)
    for key in ("input_ids", "labels"):
        for short, long in zip(enc[key], full[key]):
            assert short == long[:5] + [2]


def test_padding_uses_pad_id(mt_tok):
    enc = mt_tok(["Ein Hund.", "Zwei Männer spielen im Park."], padding=True)
    short, long = enc["input_ids"]
    assert len(short) == len(long)
    n = sum(enc["attention_mask"][0])
    assert short[n - 1] == 2 and set(short[n:]) == {1}


@pytest.mark.parametrize("variant", ["mt", "lm"])
def test_save_load_round_trip(variant, mt_tok, lm_tok, pairs, tmp_path):
    tok = mt_tok if variant == "mt" else lm_tok
    tok.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert (tmp_path / "tokenizer.json").is_file()
    assert config["tokenizer_class"] in ("TokenizersBackend", "PreTrainedTokenizerFast")
    assert config["sep_token"] == "<sep>" and config["pad_token"] == "<pad>"

    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert isinstance(loaded, PreTrainedTokenizerFast)
    assert loaded.special_tokens_map == tok.special_tokens_map
    assert loaded.convert_tokens_to_ids(SPECIAL_TOKENS) == [0, 1, 2, 3, 4]
    assert loaded.get_vocab() == tok.get_vocab()
    assert loaded.model_max_length == tok.model_max_length
    src = [join_sentences(WINDOW)] + [de for de, _ in pairs]
    tgt = [join_sentences(WINDOW)] + [en for _, en in pairs]
    assert loaded(src, text_target=tgt) == tok(src, text_target=tgt)
    assert (loaded(src[0])["input_ids"][-1] == 2) == (variant == "mt")
    ids = tok(src[0])["input_ids"]
    assert loaded.decode(ids, skip_special_tokens=True) == tok.decode(ids, skip_special_tokens=True)


def test_loads_with_4x_compatible_class_name(mt_tok, tmp_path):
    mt_tok.save_pretrained(tmp_path)
    path = tmp_path / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    path.write_text(json.dumps(config))
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    text = join_sentences(WINDOW)
    assert loaded(text)["input_ids"] == mt_tok(text)["input_ids"]
    assert loaded.sep_token_id == 4


# ---------------------------------------------------------------------------------------- document windows


def test_join_sentences():
    assert join_sentences(["A dog.", " It barks. "]) == "A dog. <sep> It barks."
    assert join_sentences(["x", "y"], sep_token="<S>") == "x <S> y"
    assert join_sentences([]) == ""


def test_window_round_trip(mt_tok):
    window = join_sentences(WINDOW)
    ids = mt_tok(window)["input_ids"]
    assert ids.count(4) == len(WINDOW) - 1
    assert split_sentences(mt_tok.decode(ids), mt_tok.sep_token) == WINDOW
    # A generated batch row: decoder start </s>, the window, </s>, then padding.
    row = [2] + ids + [1, 1]
    assert split_sentences(mt_tok.decode(row)) == WINDOW
    # With the separators skipped the sentences are no longer recoverable.
    assert split_sentences(mt_tok.decode(ids, skip_special_tokens=True)) == [" ".join(WINDOW)]


def test_split_sentences_edge_cases():
    assert split_sentences("a <sep> b</s><pad>") == ["a", "b"]
    assert split_sentences("<s> one </s>") == ["one"]
    assert split_sentences("  ") == []
    assert split_sentences("x <S> y", sep_token="<S>") == ["x", "y"]
    # <unk> goes as skip_special_tokens=True drops it (sliding-window decoding), so windows score as sentences do
    assert [s.split() for s in split_sentences("<s> a <unk> b <sep> <unk> c</s>")] == [["a", "b"], ["c"]]


# ------------------------------------------------------------------------------------------------ data files


def readme_line_counts():
    """{relative path: stated line count} of the gzipped text files in the tables of data/README.md (rows of
    archive members, like wiki_zh_en's, are checked by tests/training/test_data.py)."""
    text = (DATA / "README.md").read_text(encoding="utf-8")
    counts = {}
    for section in re.split(r"^## ", text, flags=re.M)[1:]:
        folder = section.split()[0].rstrip("/")
        for name, lines in re.findall(r"^\s*\| `([^`]+\.gz)` \| [\d,]+ \| ([\d,]+) \|", section, flags=re.M):
            counts[f"{folder}/{name}"] = int(lines.replace(",", ""))
    return counts


def test_readme_lists_all_data_files():
    text = (DATA / "README.md").read_text(encoding="utf-8")
    shipped = {str(p.relative_to(DATA)) for p in DATA.rglob("*.gz")}
    assert set(readme_line_counts()) == shipped - {"wiki_zh_en/zh-en.tar.gz"}
    assert all(f"`{Path(rel).name}`" in text for rel in shipped)
    assert len(shipped) == 21


def test_data_line_counts_match_readme():
    stated = readme_line_counts()
    for rel, n in stated.items():
        assert len(gz_lines(DATA / rel)) == n, rel
    for split in ("train", "val", "test_2016_flickr"):
        de, en = (len(gz_lines(DATA / "multi30k" / f"{split}.{lang}.gz")) for lang in ("de", "en"))
        assert de == en == stated[f"multi30k/{split}.de.gz"]
    assert stated["multi30k/train.en.gz"] == 29000 and stated["tinyshakespeare/input.txt.gz"] == 40000


def test_wikitext2_splits_have_the_official_token_counts():
    from talk_hf.training.corpora import load_wikitext2

    counts = {split: sum(len(line.split()) + 1 for line in load_wikitext2(split))
              for split in ("train", "valid", "test")}
    assert counts == {"train": 2_088_628, "valid": 217_646, "test": 245_569}  # words + one <eos> per line
    assert load_wikitext2("valid")[1] == " = Homarus gammarus = "
    with pytest.raises(ValueError, match="unknown WikiText-2 split 'dev'"):
        load_wikitext2("dev")
    with pytest.raises(FileNotFoundError, match="pass folder="):
        load_wikitext2("test", folder=DATA / "multi30k")


def test_tinyshakespeare_characters():
    with gzip.open(DATA / "tinyshakespeare" / "input.txt.gz", "rt", encoding="utf-8", newline="") as f:
        assert len(f.read()) == 1_115_394


def test_fixture_is_first_64_train_pairs(pairs):
    de, en = (gz_lines(DATA / "multi30k" / f"train.{lang}.gz")[:64] for lang in ("de", "en"))
    assert pairs == list(zip(de, en))
