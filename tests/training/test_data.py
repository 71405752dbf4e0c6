"""talk_hf.training.data: joint BPE, encoding, token batching, collation, LM blocks.

Fast: the 64-pair fixture; tokenizers have a few hundred entries.
"""

import logging
import os
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch

from talk_hf.tokenization import EOS_ID, SEP_ID, join_sentences, split_sentences, train_joint_bpe
from talk_hf.training.data import Seq2SeqCollator, TokenBatchSampler, encode, lm_blocks, train_tokenizer

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "multi30k_pairs.tsv"
LOGGER = "talk_hf.training.data"


def fixture_pairs():
    with open(FIXTURE, encoding="utf-8") as f:
        return [tuple(line.rstrip("\n").split("\t")) for line in f]


@pytest.fixture(scope="module")
def pairs_ds():
    pairs = fixture_pairs()
    return datasets.Dataset.from_dict({"source": [p[0] for p in pairs], "target": [p[1] for p in pairs]})


@pytest.fixture(scope="module")
def tok(pairs_ds):
    return train_tokenizer([pairs_ds], 300)


# ------------------------------------------------------------------------------------------------ tokenizer


def test_train_tokenizer_is_joint_and_keeps_sep(tok, pairs_ds):
    assert tok.sep_token_id == SEP_ID and tok.eos_token_id == EOS_ID and tok.pad_token_id == 1
    toy = datasets.Dataset.from_dict({"source": ["xyzzy qq"] * 10, "target": ["plugh kk"] * 10})
    joint = train_tokenizer([toy], 60)
    vocab = joint.get_vocab()
    assert "▁xyzzy" in vocab and "▁plugh" in vocab  # merges learned from both sides
    window = join_sentences(["Ein Hund rennt.", "Zwei Männer.", "A dog runs."])
    ids = tok(window)["input_ids"]
    assert ids.count(SEP_ID) == 2 and ids[-1] == EOS_ID
    assert split_sentences(tok.decode(ids)) == ["Ein Hund rennt.", "Zwei Männer.", "A dog runs."]


def test_train_tokenizer_lowercase(pairs_ds):
    lower = train_tokenizer(pairs_ds, 300, lowercase=True)
    assert lower("Ein HUND")["input_ids"] == lower("ein hund")["input_ids"]
    cased = train_tokenizer(pairs_ds, 300)
    assert cased("Ein HUND")["input_ids"] != cased("ein hund")["input_ids"]


# ------------------------------------------------------------------------------------------------ encode


def test_encode_adds_eos_and_num_tokens(tok, pairs_ds, caplog):
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        out = encode(pairs_ds, tok)
    assert not caplog.records  # nothing dropped, nothing to report
    assert out.column_names == ["source", "target", "input_ids", "labels", "num_tokens"]
    assert len(out) == len(pairs_ds)
    for row in out.select(range(10)):
        plain_src = tok(row["source"], add_special_tokens=False)["input_ids"]
        plain_tgt = tok(row["target"], add_special_tokens=False)["input_ids"]
        assert row["input_ids"] == plain_src + [EOS_ID]
        assert row["labels"] == plain_tgt + [EOS_ID]
        assert row["num_tokens"] == max(len(plain_src), len(plain_tgt)) + 1


def test_encode_drops_and_reports(tok, pairs_ds, caplog):
    src_len = [len(tok(s)["input_ids"]) for s in pairs_ds["source"]]
    tgt_len = [len(tok(t)["input_ids"]) for t in pairs_ds["target"]]
    max_src, max_tgt = int(np.median(src_len)), int(np.median(tgt_len)) + 2
    keep = [s <= max_src and t <= max_tgt for s, t in zip(src_len, tgt_len)]
    expected_dropped = keep.count(False)
    assert 0 < expected_dropped < len(keep)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        out = encode(pairs_ds, tok, max_source_tokens=max_src, max_target_tokens=max_tgt)
    assert len(out) == len(pairs_ds) - expected_dropped
    assert out["source"] == [s for s, k in zip(pairs_ds["source"], keep) if k]  # order kept, the right ones
    assert max(len(x) for x in out["input_ids"]) <= max_src and max(len(x) for x in out["labels"]) <= max_tgt
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(f"dropped {expected_dropped} of {len(pairs_ds)}" in m for m in messages), messages


class _CachedOnly:
    """Same tokenizer content (hash) as the wrapped one, but tokenizing fails: proves a cache hit."""

    def __init__(self, tok):
        self.backend_tokenizer = tok.backend_tokenizer

    def __call__(self, *args, **kwargs):
        raise AssertionError("tokenizer called: the cache file was not reused")


def test_encode_cache_reuse(tok, pairs_ds, tmp_path):
    cache = tmp_path / "cache"
    first = encode(pairs_ds, tok, max_source_tokens=40, cache_dir=cache)
    files = sorted(cache.glob("encode-*.arrow"))
    assert len(files) == 1 and first.cache_files[0]["filename"] == str(files[0])
    mtime = os.path.getmtime(files[0])
    second = encode(pairs_ds, _CachedOnly(tok), max_source_tokens=40, cache_dir=cache)
    assert second.cache_files[0]["filename"] == str(files[0]) and os.path.getmtime(files[0]) == mtime
    assert second.to_dict() == first.to_dict()
    with pytest.raises(AssertionError, match="cache file was not reused"):  # other limits: another cache file
        encode(pairs_ds, _CachedOnly(tok), max_source_tokens=41, cache_dir=cache)


@pytest.mark.parametrize("side", ["source", "target"])
@pytest.mark.parametrize("text", ["use </s> here", "<pad> first", "an <s> tag"])
def test_encode_refuses_text_that_spells_a_special_token(tok, pairs_ds, side, text):
    """The tokenizer reads "</s>" in text as its end-of-sequence token: mid-sentence it would end the target."""
    rows = pairs_ds.select(range(3)).to_dict()
    rows[side][2] = text
    with pytest.raises(ValueError, match=rf"row 2's {side} holds the text '<"):
        encode(datasets.Dataset.from_dict(rows), tok)


def test_encode_rejects_bad_limits(tok, pairs_ds):
    with pytest.raises(ValueError, match="max_source_tokens"):
        encode(pairs_ds, tok, max_source_tokens=0)


# ------------------------------------------------------------------------------------------------ sampler


def random_lengths(n=500, seed=1):
    return np.random.default_rng(seed).integers(1, 51, size=n).tolist()


def test_sampler_covers_every_index_once_within_budget():
    lengths, budget = random_lengths(), 200
    sampler = TokenBatchSampler(lengths, budget, seed=3)
    for epoch in range(3):
        batches = sampler.batches(epoch)
        flat = [i for b in batches for i in b]
        assert sorted(flat) == list(range(len(lengths)))
        assert all(len(b) * max(lengths[i] for i in b) <= budget for b in batches)
        assert len(batches) == len(sampler)


def test_sampler_greedy_fill_without_shuffle():
    lengths, budget = random_lengths(), 200
    batches = TokenBatchSampler(lengths, budget, shuffle=False).batches(0)
    flat = [i for b in batches for i in b]
    assert [lengths[i] for i in flat] == sorted(lengths)  # sorted by length
    assert flat == sorted(range(len(lengths)), key=lambda i: (lengths[i], i))  # ties in index order
    for batch, following in zip(batches, batches[1:]):  # greedy: the next example would not have fitted
        assert (len(batch) + 1) * lengths[following[0]] > budget
    assert batches == TokenBatchSampler(lengths, budget, shuffle=False).batches(5)


def test_sampler_deterministic_per_seed_and_epoch():
    lengths = random_lengths()
    a, b = TokenBatchSampler(lengths, 200, seed=7), TokenBatchSampler(lengths, 200, seed=7)
    assert a.batches(2) == b.batches(2)
    assert a.batches(0) != a.batches(1)
    assert TokenBatchSampler(lengths, 200, seed=8).batches(2) != a.batches(2)
    a.set_epoch(4)
    assert list(iter(a)) == b.batches(4)


def test_sampler_shuffles_ties():
    sampler = TokenBatchSampler([5] * 40, 20, seed=0)  # batches of 4 equal-length examples
    batches = sampler.batches(0)
    assert all(len(b) == 4 for b in batches) and len(sampler) == 10
    assert sorted(i for b in batches for i in b) == list(range(40))
    assert [i for b in batches for i in b] != list(range(40))
    assert any(sorted(b) != list(range(b[0], b[0] + 4)) for b in batches)  # ties mixed, not only blocks reordered


def test_sampler_oversize_example():
    with pytest.raises(ValueError, match=r"example 3 has num_tokens=300 > max_tokens=256"):
        TokenBatchSampler([10, 20, 30, 300, 40], 256)
    with pytest.raises(ValueError, match="example 1 has num_tokens=0"):
        TokenBatchSampler([3, 0], 256)


def test_sampler_with_dataloader(tok, pairs_ds):
    data = encode(pairs_ds, tok)
    sampler = TokenBatchSampler(data["num_tokens"], 128, seed=0)
    collator = Seq2SeqCollator(tok.pad_token_id, tok.eos_token_id)
    loader = torch.utils.data.DataLoader(
        data.with_format(columns=["input_ids", "labels"]), batch_sampler=sampler, collate_fn=collator
    )
    seen = 0
    for batch in loader:
        b, s = batch["input_ids"].shape
        assert b * max(s, batch["labels"].shape[1]) <= 128
        seen += b
    assert seen == len(data)


# ------------------------------------------------------------------------------------------------ collator


def test_collator_pads_and_shifts():
    collate = Seq2SeqCollator(pad_token_id=1, decoder_start_token_id=2)
    batch = collate([
        {"input_ids": [5, 6, 7, 2], "labels": [8, 9, 2], "source": "ignored"},
        {"input_ids": torch.tensor([10, 2]), "labels": [11, 12, 13, 14, 2]},
    ])
    assert set(batch) == {"input_ids", "attention_mask", "labels", "decoder_input_ids"}
    assert all(t.dtype == torch.long for t in batch.values())
    assert batch["input_ids"].tolist() == [[5, 6, 7, 2], [10, 2, 1, 1]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert batch["labels"].tolist() == [[8, 9, 2, -100, -100], [11, 12, 13, 14, 2]]
    # shift_tokens_right of the padded labels, as DataCollatorForSeq2Seq(model=...) builds them (the shorter row's
    # positions past its end hold the shifted </s> and padding; their labels are -100)
    assert batch["decoder_input_ids"].tolist() == [[2, 8, 9, 2, 1], [2, 11, 12, 13, 14]]
    with pytest.raises(ValueError, match="example 0 has no 'labels'"):
        collate([{"input_ids": [1]}])


# ------------------------------------------------------------------------------------------------ LM blocks


@pytest.mark.parametrize("add_bos", [False, True])
@pytest.mark.parametrize("text", ["the price was <s>ten</s> five", "<pad> first"])
def test_lm_blocks_refuse_text_that_spells_a_special_token(pairs_ds, text, add_bos):
    """As encode does for pairs: "</s>" in a line would put an end of sequence in the middle of the stream; the
    special tokens the tokenizer itself adds (a BOS) are not text."""
    lm_tok = train_joint_bpe(pairs_ds["target"], 200, add_eos=False, add_bos=add_bos)
    texts = pairs_ds["target"][:3]
    assert len(lm_blocks(texts, lm_tok, 4)) > 0
    with pytest.raises(ValueError, match=r"text 3 holds the text '<(s|/s|pad)>', which the tokenizer reads"):
        lm_blocks([*texts, text], lm_tok, 4)


def test_lm_text_with_unknown_characters_is_text_where_the_pad_token_is_unk(pairs_ds):
    """Llama-style tokenizers use <unk> as their pad token: an unknown character is no spelled special token."""
    lm_tok = train_joint_bpe(pairs_ds["target"], 200, add_eos=False)
    lm_tok.pad_token = lm_tok.unk_token
    blocks = lm_blocks([*pairs_ds["target"][:3], "a dog ☃ runs"], lm_tok, 4)
    assert lm_tok.unk_token_id in [i for block in blocks["input_ids"] for i in block]


def test_lm_blocks(pairs_ds, caplog):
    lm_tok = train_joint_bpe(pairs_ds["target"], 200, add_eos=False)
    texts = pairs_ds["target"][:20]
    stream = [i for t in texts for i in lm_tok(t)["input_ids"]]
    block = 16
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        out = lm_blocks(texts, lm_tok, block)
    assert len(out) == len(stream) // block
    assert out["input_ids"] == [stream[k * block : (k + 1) * block] for k in range(len(out))]
    assert out["labels"] == out["input_ids"] and set(out["num_tokens"]) == {block}
    tail = len(stream) % block
    assert tail  # the assertion below is meaningful
    assert any(f"dropped a tail of {tail} tokens" in r.getMessage() for r in caplog.records)
    with_sep = lm_blocks(texts, lm_tok, block, separator_token_id=EOS_ID)
    flat = [i for b in with_sep["input_ids"] for i in b]
    assert EOS_ID not in stream and flat.count(EOS_ID) >= len(texts) - 1
    assert flat == [i for t in texts for i in lm_tok(t)["input_ids"] + [EOS_ID]][: len(flat)]
    with pytest.raises(ValueError, match="fewer than block_size"):
        lm_blocks(["kurz"], lm_tok, 1000)
