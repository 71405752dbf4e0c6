"""Training examples from parallel or monolingual text: joint BPE, encoding, causal-LM blocks, token batching,
collation.

The inputs are datasets with str columns ``"source"`` and ``"target"`` (from :mod:`talk_hf.training.corpora`); the
pipeline is::

    tok = train_tokenizer([train], vocab_size=16000)      # joint BPE, <sep> id 4, </s> appended
    data = encode(windows, tok, max_source_tokens=256, max_target_tokens=256, cache_dir="cache")
    sampler = TokenBatchSampler(data["num_tokens"], max_tokens=4096)
    loader = DataLoader(data.select_columns(["input_ids", "labels"]), batch_sampler=sampler,
                        collate_fn=Seq2SeqCollator(tok.pad_token_id, decoder_start_token_id=tok.eos_token_id))

Nothing is truncated or dropped silently: :func:`encode` removes over-long examples only when limits are given and
logs (warning level) how many, and :func:`lm_blocks` logs the length of the tail it cuts off.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import torch
from torch.utils.data import Sampler

from talk_hf.modeling_base import shift_tokens_right
from talk_hf.tokenization import train_joint_bpe

logger = logging.getLogger(__name__)

__all__ = [
    "Seq2SeqCollator",
    "TokenBatchSampler",
    "encode",
    "lm_blocks",
    "lm_token_stream",
    "stream_blocks",
    "train_tokenizer",
]


# ------------------------------------------------------------------------------------------------- tokenization


def _texts(collections: Iterable[datasets.Dataset]) -> Iterator[str]:
    for ds in collections:
        for batch in ds.select_columns(["source", "target"]).iter(batch_size=1000):
            yield from batch["source"]
            yield from batch["target"]


def train_tokenizer(
    collections: datasets.Dataset | Iterable[datasets.Dataset],
    vocab_size: int,
    lowercase: bool = False,
    min_frequency: int = 2,
    model_max_length: int = 1024,
):
    """Joint BPE over all ``"source"`` and ``"target"`` texts of the given datasets (:func:`train_joint_bpe`).

    Args:
        collections: one Dataset or an iterable of them, each with str columns ``"source"`` and ``"target"``.
            Pass sentence-level data (windows would count every sentence up to ``window`` times); ``<sep>`` is a
            special token (id 4) either way.
        vocab_size: int, target vocabulary size including the 5 special tokens.
        lowercase: lowercase after NFKC.
        min_frequency, model_max_length: passed to :func:`train_joint_bpe`.

    Returns:
        ``PreTrainedTokenizerFast`` (translation flavour: ``</s>`` appended to inputs and labels).
    """
    if isinstance(collections, datasets.Dataset):
        collections = [collections]
    collections = list(collections)
    for ds in collections:
        missing = [c for c in ("source", "target") if c not in ds.column_names]
        if missing:
            raise ValueError(f"train_tokenizer: a dataset has no column(s) {missing}, columns are {ds.column_names}")
    return train_joint_bpe(
        _texts(collections),
        vocab_size,
        lowercase=lowercase,
        add_eos=True,
        min_frequency=min_frequency,
        model_max_length=model_max_length,
    )


def _tokenizer_hash(tokenizer) -> str:
    """A content hash of a tokenizer: a fast one's serialized ``tokenizer.json``; another's (a converted fairseq
    tokenizer) files as ``save_pretrained`` writes them."""
    digest = hashlib.sha256()
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        digest.update(backend.to_str().encode("utf-8"))
        return digest.hexdigest()[:16]
    with tempfile.TemporaryDirectory() as folder:
        tokenizer.save_pretrained(folder)
        for path in sorted(Path(folder).rglob("*")):
            if path.is_file():
                digest.update(path.name.encode("utf-8") + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


# Part of encode's cache key: a cache file written by an encode that checked less is not reused.
ENCODE_VERSION = 2


def _text_special_ids(tokenizer) -> set[int]:
    """The ids of <s>, <pad> and </s>, which text must not spell; not <unk>'s, also where the pad token is the unk
    token (Llama-style tokenizers): text with unknown characters is text."""
    return {tokenizer.bos_token_id, tokenizer.pad_token_id, tokenizer.eos_token_id} - {None, tokenizer.unk_token_id}


def _check_no_special_text(tokenizer, enc, indices: list[int]) -> None:
    """Text that spells ``<s>``, ``<pad>`` or ``</s>`` is encoded as that token (transformers reads special tokens
    out of text): inside a source or target it would start, pad or end the sentence. Refused, naming the row."""
    specials = _text_special_ids(tokenizer)
    leading = tokenizer.num_special_tokens_to_add() - 1  # ids the tokenizer puts before the text (</s> ends it)
    for side, column in (("source", "input_ids"), ("target", "labels")):
        for index, ids in zip(indices, enc[column]):
            found = next((i for i in ids[leading:-1] if i in specials), None)
            if found is not None:
                token = tokenizer.convert_ids_to_tokens(found)
                raise ValueError(f"encode: row {index}'s {side} holds the text {token!r}, which the tokenizer reads "
                                 f"as its special token {token!r} (not as text): remove or rewrite it in the data")


def encode(
    ds: datasets.Dataset,
    tokenizer,
    max_source_tokens: int | None = None,
    max_target_tokens: int | None = None,
    cache_dir: str | os.PathLike | None = None,
) -> datasets.Dataset:
    """Tokenize ``"source"``/``"target"`` into ``"input_ids"``/``"labels"`` (no truncation).

    Args:
        ds: Dataset with str columns ``"source"``, ``"target"`` (other columns are kept).
        tokenizer: a tokenizer that appends ``</s>`` (e.g. from :func:`train_tokenizer`, or a converted fairseq one).
        max_source_tokens, max_target_tokens: optional ints; an example whose ``input_ids`` (resp. ``labels``),
            ``</s>`` included, is longer is REMOVED (never truncated) and the number removed is logged at warning
            level. ``len(ds) - len(result)`` is exactly that number.
        cache_dir: optional folder; the result is written there as an Arrow cache file named after the content of
            ``ds``, the tokenizer and the limits, and a later call with the same inputs loads that file instead of
            tokenizing again.

    Returns:
        Dataset with the columns of ``ds`` plus ``"input_ids"`` and ``"labels"`` (lists of int, each ending in
        ``</s>``) and ``"num_tokens"`` (int, ``max(len(input_ids), len(labels))``: the unit that the padded batch
        size is measured in), in the original order.
    """
    for limit_name, limit in (("max_source_tokens", max_source_tokens), ("max_target_tokens", max_target_tokens)):
        if limit is not None and (not isinstance(limit, int) or limit < 1):
            raise ValueError(f"{limit_name} must be a positive int or None, got {limit!r}")
    missing = [c for c in ("source", "target") if c not in ds.column_names]
    if missing:
        raise ValueError(f"encode: dataset has no column(s) {missing}, columns are {ds.column_names}")
    input_columns = list(ds.column_names)
    key = hashlib.sha256(json.dumps([
        ENCODE_VERSION, ds._fingerprint, _tokenizer_hash(tokenizer), max_source_tokens, max_target_tokens,
    ]).encode()).hexdigest()[:20]

    def tokenize(batch: dict[str, list], indices: list[int]) -> dict[str, list]:
        enc = tokenizer(batch["source"], text_target=batch["target"], add_special_tokens=True)
        if any(not ids or ids[-1] != tokenizer.eos_token_id for ids in enc["labels"]):
            raise ValueError(f"encode: the tokenizer {getattr(tokenizer, 'name_or_path', '')!r} does not end every "
                             "target with </s> (a language-model tokenizer, add_eos=False?): a translation model "
                             "trained on them never learns to stop; use one that appends </s> (train_tokenizer's)")
        _check_no_special_text(tokenizer, enc, indices)
        keep = [
            (max_source_tokens is None or len(src) <= max_source_tokens)
            and (max_target_tokens is None or len(tgt) <= max_target_tokens)
            for src, tgt in zip(enc["input_ids"], enc["labels"])
        ]
        out = {c: [v for v, k in zip(batch[c], keep) if k] for c in input_columns}
        out["input_ids"] = [v for v, k in zip(enc["input_ids"], keep) if k]
        out["labels"] = [v for v, k in zip(enc["labels"], keep) if k]
        out["num_tokens"] = [max(len(s), len(t)) for s, t in zip(out["input_ids"], out["labels"])]
        return out

    kwargs: dict[str, Any] = {"new_fingerprint": key}
    if cache_dir is not None:
        os.makedirs(cache_dir, exist_ok=True)
        kwargs["cache_file_name"] = os.path.join(os.fspath(cache_dir), f"encode-{key}.arrow")
        kwargs["load_from_cache_file"] = True
    else:
        kwargs["keep_in_memory"] = True
    encoded = ds.map(tokenize, batched=True, with_indices=True, remove_columns=input_columns, desc="encode",
                     **kwargs)
    dropped = len(ds) - len(encoded)
    if dropped:
        logger.warning(
            "encode: dropped %d of %d examples longer than max_source_tokens=%s / max_target_tokens=%s",
            dropped,
            len(ds),
            max_source_tokens,
            max_target_tokens,
        )
    return encoded


def appends_eos(tokenizer) -> bool:
    """Whether ``tokenizer("a")`` ends with the tokenizer's ``</s>`` id (a translation tokenizer's contract)."""
    ids = tokenizer("a")["input_ids"]
    return tokenizer.eos_token_id is not None and bool(ids) and ids[-1] == tokenizer.eos_token_id


def lm_blocks(
    texts: Iterable[str], tokenizer, block_size: int, separator_token_id: int | None = None
) -> datasets.Dataset:
    """Fixed-size blocks for causal language models (the ``run_clm`` recipe).

    All texts are tokenized (with the tokenizer's own special tokens, e.g. none for an ``add_eos=False`` LM
    tokenizer), concatenated in order (``separator_token_id`` appended after every text when given) and cut into
    consecutive blocks of ``block_size`` tokens. The tail shorter than a block is dropped and its length is logged
    at warning level.

    Args:
        texts: iterable of str.
        tokenizer: a fast tokenizer.
        block_size: int >= 1.
        separator_token_id: optional int id appended after every text (e.g. ``</s>`` or a newline piece).

    Returns:
        Dataset with ``total // block_size`` rows, columns ``"input_ids"`` and ``"labels"`` (equal lists of
        ``block_size`` ints; the model shifts labels itself) and ``"num_tokens"`` (int, ``block_size``, for
        :class:`TokenBatchSampler`).

    Raises:
        ValueError: block_size < 1, or fewer than ``block_size`` tokens in total (no block at all).
    """
    _check_block_size(block_size)  # before tokenizing anything
    return stream_blocks(lm_token_stream(texts, tokenizer, separator_token_id), block_size)


def _check_block_size(block_size: int) -> None:
    if not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be an int >= 1, got {block_size!r}")


def lm_token_stream(texts: Iterable[str], tokenizer, separator_token_id: int | None = None) -> list[int]:
    """All texts tokenized and concatenated in order, ``separator_token_id`` after each when given -> list of ids.
    A text that spells ``<s>``, ``<pad>`` or ``</s>`` (read as the special token, not as text: an end of sequence
    or padding in the middle of the stream) is refused, naming the text, as ``encode`` refuses it in pairs."""
    specials = _text_special_ids(tokenizer)
    stream: list[int] = []
    texts = list(texts)
    for start in range(0, len(texts), 1000):
        encoded = tokenizer(texts[start : start + 1000], return_special_tokens_mask=True)
        for k, (ids, added) in enumerate(zip(encoded["input_ids"], encoded["special_tokens_mask"])):
            found = next((i for i, a in zip(ids, added) if i in specials and not a), None)
            if found is not None:
                token = tokenizer.convert_ids_to_tokens(found)
                raise ValueError(f"lm_token_stream: text {start + k} holds the text {token!r}, which the tokenizer "
                                 f"reads as its special token {token!r} (not as text): remove or rewrite it in the "
                                 "data")
            stream.extend(ids)
            if separator_token_id is not None:
                stream.append(separator_token_id)
    return stream


def stream_blocks(stream: Sequence[int], block_size: int) -> datasets.Dataset:
    """Consecutive ``block_size``-token blocks of a token stream (the :func:`lm_blocks` dataset); the tail shorter
    than a block is dropped and logged. Raises ValueError for block_size < 1 or a stream shorter than a block."""
    _check_block_size(block_size)
    num_blocks = len(stream) // block_size
    if num_blocks == 0:
        raise ValueError(f"lm_blocks: only {len(stream)} tokens in total, fewer than block_size={block_size}")
    tail = len(stream) - num_blocks * block_size
    if tail:
        logger.warning("lm_blocks: dropped a tail of %d tokens (of %d) after %d blocks", tail, len(stream), num_blocks)
    blocks = [stream[i * block_size : (i + 1) * block_size] for i in range(num_blocks)]
    return datasets.Dataset.from_dict(
        {"input_ids": blocks, "labels": [list(b) for b in blocks], "num_tokens": [block_size] * num_blocks}
    )


# ------------------------------------------------------------------------------------------- batching, collation


class TokenBatchSampler(Sampler[list[int]]):
    """fairseq-style token batching: batches of indices whose padded size fits a token budget.

    Per epoch: the indices are sorted by length (ties in an order shuffled from ``(seed, epoch)`` when ``shuffle``,
    else in index order), cut greedily into batches while ``batch_size * max_len_in_batch <= max_tokens``, and the
    order of the batches is shuffled from ``(seed, epoch)`` (when ``shuffle``; else shortest batches first).
    Every index appears in exactly one batch per epoch. The number of batches does not depend on the epoch (the
    sorted lengths are the same), so ``len()`` is fixed.

    Resuming: ``batches(epoch)`` returns the full list of an epoch, so a trainer can skip the first k exactly.

    Args:
        num_tokens: sequence of ints >= 1 (e.g. ``encoded["num_tokens"]``), the padded size of each example.
        max_tokens: int, the token budget of a batch (padded: size times longest).
        shuffle: shuffle ties and the order of batches per epoch.
        seed: int.

    Raises:
        ValueError: a single example is longer than ``max_tokens`` (its index and length are named), or a length is
        not a positive int.
    """

    def __init__(self, num_tokens: Sequence[int], max_tokens: int, shuffle: bool = True, seed: int = 0):
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive int, got {max_tokens!r}")
        if not isinstance(num_tokens, (list, tuple, np.ndarray, torch.Tensor)):
            num_tokens = num_tokens[:]  # a datasets Column: one Arrow conversion instead of a row-by-row loop
        lengths = np.asarray(num_tokens)
        if lengths.ndim != 1 or (lengths.size and not np.issubdtype(lengths.dtype, np.integer)):
            raise ValueError(f"num_tokens must be a 1-D sequence of ints, got dtype {lengths.dtype} {lengths.shape}")
        lengths = lengths.astype(np.int64)
        if lengths.size and lengths.min() < 1:
            index = int(lengths.argmin())
            raise ValueError(f"example {index} has num_tokens={int(lengths[index])}, expected >= 1")
        if lengths.size and lengths.max() > max_tokens:
            index = int(lengths.argmax())
            raise ValueError(
                f"example {index} has num_tokens={int(lengths[index])} > max_tokens={max_tokens}; "
                "remove over-long examples (encode(max_source_tokens=..., max_target_tokens=...)) or raise max_tokens"
            )
        self.num_tokens = lengths
        self.max_tokens = max_tokens
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self._len = len(self._pack(np.sort(lengths, kind="stable")))

    def _pack(self, sorted_lengths: np.ndarray) -> list[tuple[int, int]]:
        """Greedy packing of ascending lengths: (start, end) ranges into the sorted order."""
        ranges, start = [], 0
        for i, length in enumerate(sorted_lengths.tolist()):
            # ascending order: the new example is the longest in the batch
            if i > start and (i - start + 1) * length > self.max_tokens:
                ranges.append((start, i))
                start = i
        if len(sorted_lengths):
            ranges.append((start, len(sorted_lengths)))
        return ranges

    def set_epoch(self, epoch: int) -> None:
        """Use the order of ``epoch`` for the next ``iter()``."""
        self.epoch = epoch

    def batches(self, epoch: int) -> list[list[int]]:
        """All batches of ``epoch`` in order: a list of lists of int indices (deterministic in (seed, epoch))."""
        n = len(self.num_tokens)
        rng = np.random.default_rng([self.seed, epoch])
        ties = rng.permutation(n) if self.shuffle else np.arange(n)
        order = ties[np.argsort(self.num_tokens[ties], kind="stable")]
        batches = [order[a:b].tolist() for a, b in self._pack(self.num_tokens[order])]
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        return batches

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.batches(self.epoch))

    def __len__(self) -> int:
        return self._len


def pad_right(sequences: Sequence[torch.Tensor], value: int) -> torch.Tensor:
    """1-D int64 tensors of lengths L_i -> (B, max L_i), each right-padded with `value`."""
    return torch.nn.utils.rnn.pad_sequence(list(sequences), batch_first=True, padding_value=value)


class Seq2SeqCollator:
    """Pad a list of encoded examples into a batch of tensors (right padding).

    Args:
        pad_token_id: int, the padding id of ``input_ids`` and ``decoder_input_ids``.
        decoder_start_token_id: int, the first decoder input (``</s>`` in fairseq-style models).

    Calling it on a list of dicts with ``"input_ids"`` and ``"labels"`` (lists or 1-D tensors of int; other keys
    are ignored) returns a dict of int64 tensors:

    - ``input_ids`` (B, S): padded with ``pad_token_id``; ``attention_mask`` (B, S): 1 on tokens, 0 on padding;
    - ``labels`` (B, T): padded with -100 (ignored by the loss);
    - ``decoder_input_ids`` (B, T): ``shift_tokens_right`` of the padded labels (the start token, then labels[:-1],
      -100 as ``pad_token_id``), as transformers' ``DataCollatorForSeq2Seq(model=...)`` builds them.
    """

    def __init__(self, pad_token_id: int, decoder_start_token_id: int):
        self.pad_token_id = pad_token_id
        self.decoder_start_token_id = decoder_start_token_id

    def __call__(self, examples: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        if not examples:
            raise ValueError("Seq2SeqCollator: empty batch")
        for i, example in enumerate(examples):
            for key in ("input_ids", "labels"):
                if key not in example:
                    raise ValueError(f"Seq2SeqCollator: example {i} has no {key!r}")
                if len(example[key]) == 0:
                    raise ValueError(f"Seq2SeqCollator: example {i} has an empty {key!r}")
        sources = [torch.as_tensor(e["input_ids"], dtype=torch.long) for e in examples]
        labels = pad_right([torch.as_tensor(e["labels"], dtype=torch.long) for e in examples], -100)
        input_ids = pad_right(sources, self.pad_token_id)
        attention_mask = pad_right([torch.ones_like(src) for src in sources], 0)
        decoder_input_ids = shift_tokens_right(labels, self.pad_token_id, self.decoder_start_token_id)
        return {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "labels": labels,
            "decoder_input_ids": decoder_input_ids,
        }
