"""Prepared data folders, the input of ``scripts/train.py`` and :func:`talk_hf.training.run.train_run`.

A prepared folder holds::

    tokenizer/        the tokenizer (``save_pretrained``)
    <split>/          one ``Dataset.save_to_disk`` folder per split; translation: source, target, doc_id, num_context,
                      input_ids, labels, num_tokens; language modelling: input_ids, labels, num_tokens
    preprocess.json   {"args": the settings, "tokenizer": {"vocab_size", "trained_on"}, "splits": per-split counts}

Each ``prepare_*`` function writes one and returns the ``preprocess.json`` contents::

    splits = load_pair_splits(text_files={"train": ("train.de.gz", "train.en.gz"), "valid": ("val.de", "val.en")})
    prepare_translation_data("runs/m30k/data", splits, vocab_size=8000)
    prepare_wiki_zh_en("runs/wiki4/data", window=4, vocab_size=16000, max_tokens_per_example=512)
    prepare_lm_data("runs/lm/data", {"train": read_lines("input.txt.gz")}, holdout=0.1, block_size=128)

Every input is checked before anything is written: a ``ValueError`` leaves ``output_dir`` untouched.
"""

from __future__ import annotations

import fcntl
import shutil
import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import datasets

from ..tokenization import SEP_TOKEN, document_separator, token_id, train_joint_bpe

from .corpora import (
    WIKI_ZH_EN_SPLITS,
    count_documents,
    document_windows,
    load_hub_pairs,
    load_json_pairs,
    load_text_pairs,
    load_tsv_pairs,
    load_wiki_zh_en,
    reverse_pairs,
    saved_without_split,
)
from .data import appends_eos, encode, lm_token_stream, stream_blocks, train_tokenizer

logger = logging.getLogger(__name__)

__all__ = [
    "SUMMARY_FILE",
    "read_summary",
    "load_pair_splits",
    "prepare_once",
    "prepare_lm_data",
    "prepare_translation_data",
    "prepare_wiki_zh_en",
    "save_prepared",
]

SUMMARY_FILE = "preprocess.json"
PathLike = str | os.PathLike


def read_summary(folder: PathLike) -> dict:
    """The ``SUMMARY_FILE`` contents of a prepared data folder; FileNotFoundError naming the folder where it has none
    (not prepared, or its preparation did not finish)."""
    summary = Path(folder) / SUMMARY_FILE
    if not summary.is_file():
        raise FileNotFoundError(f"{folder} is not a prepared data folder (it has no {SUMMARY_FILE}): write one with "
                                f"scripts/preprocess.py --output_dir {folder}")
    return json.loads(summary.read_text(encoding="utf-8"))


def prepare_once(output_dir: PathLike, build: Callable[[], Any], settings: Mapping[str, Any] | None = None) -> Path:
    """``output_dir``, prepared by ``build()`` unless it holds ``SUMMARY_FILE`` (written last: a finished
    preparation). Processes started together with one output folder take turns (an exclusive lock on
    ``<output_dir>.lock``): one prepares, the others then find it prepared, instead of rewriting the files another
    process already reads.

    settings: optional ``{name: value}`` that ``build()`` records under ``"args"`` in ``SUMMARY_FILE``; a folder
    prepared with other values is a ValueError naming them (it is never silently used in their place)."""
    output = Path(output_dir)
    if not (output / SUMMARY_FILE).exists():
        output.parent.mkdir(parents=True, exist_ok=True)
        with open(output.with_name(output.name + ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (output / SUMMARY_FILE).exists():
                build()
    _check_prepared_with(output, settings or {})
    return output


def _check_prepared_with(output: Path, settings: Mapping[str, Any]) -> None:
    recorded = json.loads((output / SUMMARY_FILE).read_text(encoding="utf-8")).get("args", {})
    differ = {name: (recorded.get(name), value) for name, value in settings.items() if recorded.get(name) != value}
    if differ:
        described = ", ".join(f"{name}={old!r} (asked for {new!r})" for name, (old, new) in differ.items())
        raise ValueError(f"{output} was prepared with {described}: choose another output folder, or remove this one "
                         "to prepare it again")


# ------------------------------------------------------------------------------------------------ loading pairs


def load_pair_splits(
    text_files: Mapping[str, tuple[PathLike, PathLike]] | None = None,
    tsv_files: Mapping[str, PathLike] | None = None,
    json_files: Mapping[str, PathLike] | None = None,
    hub_dataset: str | None = None,
    *,
    source_column: int | str = 0,
    target_column: int | str = 1,
    doc_column: int | str | None = None,
    source_key: str = "source",
    target_key: str = "target",
    doc_key: str | None = None,
    hub_splits: Sequence[str] = ("train", "validation", "test"),
    hub_config: str | None = None,
    source_lang: str | None = None,
    target_lang: str | None = None,
    cache_dir: PathLike | None = None,
) -> dict[str, datasets.Dataset]:
    """Sentence-level splits from exactly one kind of input (the loaders of :mod:`talk_hf.training.corpora`).

    Args:
        text_files: split name -> (source file, target file), aligned plain text (:func:`load_text_pairs`).
        tsv_files: split name -> TSV file, read with ``source_column``, ``target_column``, ``doc_column``
            (:func:`load_tsv_pairs`).
        json_files: split name -> JSON-lines file, read with ``source_key``, ``target_key``, ``doc_key``
            (:func:`load_json_pairs`).
        hub_dataset: a Hub id or local dataset folder; ``hub_splits`` of it are loaded with ``hub_config``,
            ``source_lang``, ``target_lang`` and ``cache_dir`` (:func:`load_hub_pairs`).

    Returns:
        dict split name -> Dataset with str columns ``"source"``, ``"target"`` (and ``"doc_id"`` where the input has
        documents), in the order given.

    Raises:
        ValueError: none or several kinds of input, an empty one, repeated ``hub_splits``, ``hub_dataset`` without
        both languages, several ``hub_splits`` of one dataset saved without a split name, or an error of the loader
        (naming the file, line and field).
    """
    given = {"text_files": text_files, "tsv_files": tsv_files, "json_files": json_files, "hub_dataset": hub_dataset}
    kinds = [name for name, value in given.items() if value is not None]
    if len(kinds) != 1:
        raise ValueError(f"load_pair_splits: give exactly one kind of input, got {kinds or 'none'}")
    if not given[kinds[0]]:
        raise ValueError(f"load_pair_splits: {kinds[0]} is empty")
    if text_files is not None:
        return {name: load_text_pairs(source, target) for name, (source, target) in text_files.items()}
    if tsv_files is not None:
        return {
            name: load_tsv_pairs(path, source_column, target_column, doc_column) for name, path in tsv_files.items()
        }
    if json_files is not None:
        return {name: load_json_pairs(path, source_key, target_key, doc_key) for name, path in json_files.items()}
    if not (source_lang and target_lang):
        raise ValueError(f"load_pair_splits: hub_dataset {hub_dataset!r} needs source_lang and target_lang")
    _check_unique(hub_splits, "hub_splits")
    if len(hub_splits) > 1 and saved_without_split(hub_dataset):
        raise ValueError(f"{hub_dataset} holds one dataset saved without a split name, which cannot be "
                         f"{len(hub_splits)} splits ({', '.join(hub_splits)}): save a DatasetDict of them, or ask for "
                         "one split (--hub_splits train)")
    return {
        name: load_hub_pairs(hub_dataset, name, source_lang, target_lang, hub_config, cache_dir=cache_dir)
        for name in hub_splits
    }


# ----------------------------------------------------------------------------------------- translation folders


def prepare_translation_data(
    output_dir: PathLike,
    splits: Mapping[str, datasets.Dataset],
    *,
    tokenizer: PathLike | Any | None = None,
    tokenizer_splits: Sequence[str] = ("train",),
    vocab_size: int = 8000,
    min_frequency: int = 2,
    lowercase: bool = False,
    window: int = 1,
    reverse: bool = False,
    max_tokens_per_example: int | None = None,
    keep_all_splits: Sequence[str] = (),
    cache_dir: PathLike | None = None,
    args: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Write a prepared translation folder: tokenizer, document windows encoded per split, ``preprocess.json``.

    Args:
        output_dir: the folder to write (created; existing splits of the same names are overwritten).
        splits: split name -> sentence-level Dataset with str columns ``"source"``, ``"target"`` and, for
            ``window > 1``, ``"doc_id"`` (e.g. from :func:`load_pair_splits`).
        tokenizer: a saved tokenizer folder or a tokenizer object to use; ``None`` trains a joint BPE
            (:func:`train_tokenizer`) of ``vocab_size`` entries on ``tokenizer_splits`` with ``min_frequency`` and
            ``lowercase``.
        window: int >= 1, the document window length in sentences (:func:`document_windows`; 1: sentence level).
        reverse: swap source and target before anything else (e.g. zh->en data for en->zh).
        max_tokens_per_example: optional int; examples whose source or target is longer, ``</s>`` included, are
            dropped (never truncated) and counted in ``"dropped"``.
        keep_all_splits: split names that must keep every example (test sets: every window is scored); a drop there
            raises ``ValueError`` before anything is written.
        cache_dir: optional ``datasets`` cache folder for the encoded splits (:func:`encode`).
        args: JSON-serialisable settings recorded as ``"args"`` in ``preprocess.json`` (a CLI passes its parsed
            flags); default: the settings of this call.

    Returns:
        The ``preprocess.json`` contents: ``{"args": dict, "tokenizer": {"vocab_size": int, "trained_on": list of
        split names or None}, "splits": {name: {"sentences", "documents" (None without doc_id), "examples", "kept",
        "dropped", "num_tokens_total", "num_tokens_max"}}}``.

    Raises:
        ValueError: no splits, ``window < 1``, ``tokenizer_splits`` or ``keep_all_splits`` not among the splits,
        windows without ``doc_id``, a sentence containing the separator, or dropped examples in ``keep_all_splits``.
    """
    if not splits:
        raise ValueError("prepare_translation_data: no splits given")
    if not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be an int >= 1, got {window!r}")
    _check_known(keep_all_splits, splits, "keep_all_splits")
    if tokenizer is None:
        _check_known(tokenizer_splits, splits, "tokenizer_splits")
    settings = {
        "output_dir": os.fspath(output_dir), "splits": list(splits), "tokenizer": _tokenizer_name(tokenizer),
        "tokenizer_splits": list(tokenizer_splits), "vocab_size": vocab_size, "min_frequency": min_frequency,
        "lowercase": lowercase, "window": window, "reverse": reverse, "max_tokens_per_example": max_tokens_per_example,
        "keep_all_splits": list(keep_all_splits), "cache_dir": None if cache_dir is None else os.fspath(cache_dir),
    }
    empty = [name for name, ds in splits.items() if len(ds) == 0]
    if empty:
        raise ValueError(f"split(s) {empty} hold no sentence pairs")
    if reverse:
        splits = {name: reverse_pairs(ds) for name, ds in splits.items()}
    trained_on = None if tokenizer is not None else list(tokenizer_splits)
    tokenizer = _load_tokenizer(tokenizer)
    sep_token = SEP_TOKEN if tokenizer is None else document_separator(tokenizer)
    if window > 1 and tokenizer is not None and token_id(tokenizer, sep_token) is None:
        raise ValueError(f"window={window} joins sentences with a separator token, and the tokenizer "
                         f"{settings['tokenizer']!r} has no {sep_token!r} in its vocabulary (its end-of-sequence token "
                         "cannot be one): add one (tokenizer.add_special_tokens({'sep_token': '<sep>'}) and resize the "
                         "model's embeddings) or use window=1")
    windows = {name: document_windows(ds, window, sep_token=sep_token) for name, ds in splits.items()}
    if tokenizer is None:
        tokenizer = train_tokenizer([splits[name] for name in tokenizer_splits], vocab_size, lowercase=lowercase,
                                    min_frequency=min_frequency)
    encoded = {name: encode(examples, tokenizer, max_tokens_per_example, max_tokens_per_example, cache_dir=cache_dir)
               for name, examples in windows.items()}
    emptied = [name for name, ds in encoded.items() if len(ds) == 0]
    if emptied:
        raise ValueError(f"every example of split(s) {emptied} is longer than max_tokens_per_example="
                         f"{max_tokens_per_example}: raise the limit")
    counts = {name: _translation_counts(splits[name], windows[name], encoded[name]) for name in splits}
    dropped = {name: counts[name]["dropped"] for name in keep_all_splits if counts[name]["dropped"]}
    if dropped:
        raise ValueError(f"examples longer than max_tokens_per_example={max_tokens_per_example} would be dropped from "
                         f"{dropped} (keep_all_splits); raise the limit so that every example is kept")
    return save_prepared(output_dir, tokenizer, encoded, counts, settings if args is None else args, trained_on)


def prepare_wiki_zh_en(
    output_dir: PathLike,
    splits: Sequence[str] = WIKI_ZH_EN_SPLITS,
    *,
    archive: PathLike | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """:func:`prepare_translation_data` on splits of the bundled document-level Wikipedia zh-en corpus
    (:func:`load_wiki_zh_en`; zh source, en target, ``reverse=True`` for en->zh).

    Args:
        output_dir: the folder to write.
        splits: names among ``"train"``, ``"dev"``, ``"zh2en-test"``, ``"en2zh-test"`` (default: all four).
        archive: the ``zh-en.tar.gz`` to read (default: the one in the source tree's ``data/wiki_zh_en``).
        **kwargs: the keyword arguments of :func:`prepare_translation_data` (``window``, ``vocab_size``,
            ``tokenizer``, ``max_tokens_per_example``, ...).

    Returns:
        The ``preprocess.json`` contents (see :func:`prepare_translation_data`).

    Raises:
        ValueError: a repeated or unknown split name, or an error of :func:`prepare_translation_data`.
    """
    _check_unique(splits, "splits")
    loaded = {name: load_wiki_zh_en(name, archive=archive) for name in splits}
    return prepare_translation_data(output_dir, loaded, **kwargs)


def _translation_counts(sentences: datasets.Dataset, windows: datasets.Dataset, encoded: datasets.Dataset) -> dict:
    """The ``preprocess.json`` counts of one translation split."""
    num_tokens = encoded["num_tokens"][:]
    return {
        "sentences": len(sentences),
        "documents": count_documents(sentences) if "doc_id" in sentences.column_names else None,
        "examples": len(windows),
        "kept": len(encoded),
        "dropped": len(windows) - len(encoded),
        "num_tokens_total": int(sum(num_tokens)),
        "num_tokens_max": int(max(num_tokens, default=0)),
    }


# -------------------------------------------------------------------------------------------- language modelling


def prepare_lm_data(
    output_dir: PathLike,
    texts: Mapping[str, Sequence[str]],
    *,
    block_size: int = 128,
    holdout: float = 0.0,
    tokenizer: PathLike | Any | None = None,
    tokenizer_splits: Sequence[str] = ("train",),
    vocab_size: int = 8000,
    min_frequency: int = 2,
    lowercase: bool = False,
    args: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Write a prepared causal-LM folder: tokenizer, fixed-size token blocks per split, ``preprocess.json``.

    Every line of a split is tokenized (no ``</s>`` from the tokenizer itself) and followed by ``</s>`` in the token
    stream; the stream is cut into consecutive blocks of ``block_size`` tokens (:func:`stream_blocks`), the tail
    shorter than a block counted in ``"tail_tokens_dropped"``.

    Args:
        output_dir: the folder to write.
        texts: split name -> list of str lines (e.g. :func:`talk_hf.training.corpora.read_lines` of a text file).
        block_size: int >= 1, tokens per block.
        holdout: a fraction in [0, 1): the last ``holdout`` of the lines of ``"train"`` become the ``"valid"`` split
            (then ``texts`` needs ``"train"`` and no ``"valid"``).
        tokenizer: a saved tokenizer folder or a tokenizer object; ``None`` trains a BPE (``add_eos=False``) of
            ``vocab_size`` entries on ``tokenizer_splits`` with ``min_frequency`` and ``lowercase``.
        args: settings recorded as ``"args"`` in ``preprocess.json``; default: the settings of this call.

    Returns:
        The ``preprocess.json`` contents, with per-split counts ``{"lines", "blocks", "tokens_total",
        "tokens_in_blocks", "tail_tokens_dropped"}``.

    Raises:
        ValueError: no texts, ``block_size < 1``, ``holdout`` outside [0, 1) or without a ``"train"`` split (or with
        a ``"valid"`` one), ``tokenizer_splits`` not among the splits, or a split shorter than one block.
    """
    if not texts:
        raise ValueError("prepare_lm_data: no texts given")
    if not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be an int >= 1, got {block_size!r}")
    settings = {
        "output_dir": os.fspath(output_dir), "splits": list(texts), "block_size": block_size, "holdout": holdout,
        "tokenizer": _tokenizer_name(tokenizer), "tokenizer_splits": list(tokenizer_splits),
        "vocab_size": vocab_size, "min_frequency": min_frequency, "lowercase": lowercase,
    }
    texts = _hold_out(texts, holdout)
    trained_on = None if tokenizer is not None else list(tokenizer_splits)
    tokenizer = _load_tokenizer(tokenizer)
    if tokenizer is not None and appends_eos(tokenizer):
        raise ValueError(f"the tokenizer {settings['tokenizer']!r} appends </s> to every encoding (a translation "
                         "tokenizer?); prepare_lm_data puts one </s> after every line itself, so each line would end "
                         "in two: use a tokenizer without it (train_joint_bpe(..., add_eos=False))")
    if tokenizer is None:
        _check_known(tokenizer_splits, texts, "tokenizer_splits")
        corpus = (line for name in tokenizer_splits for line in texts[name])
        tokenizer = train_joint_bpe(corpus, vocab_size, lowercase=lowercase, add_eos=False,
                                    min_frequency=min_frequency)
    blocks, counts = {}, {}
    for name, lines in texts.items():
        stream = lm_token_stream(lines, tokenizer, separator_token_id=tokenizer.eos_token_id)
        try:
            blocks[name] = stream_blocks(stream, block_size)
        except ValueError as err:
            raise ValueError(f"split {name!r}: {err}") from None
        in_blocks = len(blocks[name]) * block_size
        counts[name] = {"lines": len(lines), "blocks": len(blocks[name]), "tokens_total": len(stream),
                        "tokens_in_blocks": in_blocks, "tail_tokens_dropped": len(stream) - in_blocks}
    return save_prepared(output_dir, tokenizer, blocks, counts, settings if args is None else args, trained_on)


def _hold_out(texts: Mapping[str, Sequence[str]], fraction: float) -> dict[str, list[str]]:
    """``texts`` with the last ``fraction`` of the ``"train"`` lines moved into a new ``"valid"`` split."""
    texts = {name: list(lines) for name, lines in texts.items()}
    if not fraction:
        return texts
    if not 0 < fraction < 1:
        raise ValueError(f"holdout must be in [0, 1), got {fraction!r}")
    if "train" not in texts or "valid" in texts:
        raise ValueError(f"holdout needs a 'train' split and no 'valid' one, got {list(texts)}")
    lines = texts["train"]
    cut = round(len(lines) * (1 - fraction))
    texts["train"], texts["valid"] = lines[:cut], lines[cut:]
    return texts


# ------------------------------------------------------------------------------------------------------ helpers


def save_prepared(
    output_dir: PathLike,
    tokenizer,
    splits: Mapping[str, datasets.Dataset],
    counts: Mapping[str, Mapping[str, Any]],
    args: Mapping[str, Any],
    trained_on: Sequence[str] | None,
) -> dict[str, Any]:
    """Write ``<output_dir>/tokenizer/``, each split (``save_to_disk``) and ``<output_dir>/preprocess.json`` (UTF-8,
    indented), and return the latter's contents:
    ``{"args": args, "tokenizer": {"vocab_size": len(tokenizer), "trained_on": trained_on}, "splits": counts}``."""
    output = Path(output_dir)
    _remove_previous(output)
    output.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(output / "tokenizer")
    for name, ds in splits.items():
        ds.save_to_disk(str(output / name))
        logger.info("%s: %s", name, counts[name])
    summary = {
        "args": dict(args),
        "tokenizer": {"vocab_size": len(tokenizer), "trained_on": None if trained_on is None else list(trained_on)},
        "splits": {name: dict(c) for name, c in counts.items()},
    }
    text = json.dumps(summary, indent=2, ensure_ascii=False) + "\n"
    (output / SUMMARY_FILE).write_text(text, encoding="utf-8")
    return summary


def _remove_previous(output: Path) -> None:
    """Remove an earlier preparation of ``output``: its ``SUMMARY_FILE`` first (a rewrite stopped part way is then
    not taken for a finished one), then its splits and tokenizer, so that no split of other settings or another
    tokenizer stays beside the new ones. A folder that holds a tokenizer but no ``SUMMARY_FILE`` (a preparation
    stopped part way, whose splits are unknown) is a ValueError."""
    summary = output / SUMMARY_FILE
    if summary.exists():
        previous = json.loads(summary.read_text(encoding="utf-8"))
        summary.unlink()
        for name in [*previous.get("splits", {}), "tokenizer"]:
            shutil.rmtree(output / name, ignore_errors=True)
    elif (output / "tokenizer").exists():
        raise ValueError(f"{output} holds a tokenizer but no {SUMMARY_FILE} (a preparation stopped part way?): "
                         "remove the folder or choose another")


def _load_tokenizer(tokenizer: PathLike | Any | None):
    """A tokenizer object: loaded with ``AutoTokenizer.from_pretrained`` when given as a folder."""
    if isinstance(tokenizer, (str, os.PathLike)):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(os.fspath(tokenizer))
    return tokenizer


def _tokenizer_name(tokenizer: PathLike | Any | None) -> str | None:
    """How ``preprocess.json`` names a tokenizer argument: its folder, or the loaded tokenizer's ``name_or_path``."""
    if tokenizer is None or isinstance(tokenizer, (str, os.PathLike)):
        return None if tokenizer is None else os.fspath(tokenizer)
    return getattr(tokenizer, "name_or_path", None) or type(tokenizer).__name__


def _check_unique(names: Sequence[str], what: str) -> None:
    if len(set(names)) != len(names):
        raise ValueError(f"{what} repeat: {list(names)}")


def _check_known(names: Sequence[str], splits: Mapping[str, Any], what: str) -> None:
    missing = [name for name in names if name not in splits]
    if missing:
        raise ValueError(f"{what} {missing} are not among the splits {list(splits)}")
