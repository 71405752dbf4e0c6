"""Parallel-text datasets for training: loading, document windows, joint BPE, encoding, token batching, collation.

Every loader returns a ``datasets.Dataset`` with string columns ``"source"`` and ``"target"`` (one sentence pair per
row, file order kept) and, where documents are known, ``"doc_id"``. The pipeline is::

    train = load_wiki_zh_en("train")                     # doc_id, title, section_zh, section_en, source, target
    tok = train_tokenizer([train], vocab_size=16000)      # joint BPE, <sep> id 4, </s> appended
    windows = document_windows(train, window=4)           # one example per sentence: "s1 <sep> s2 <sep> s3 <sep> s4"
    data = encode(windows, tok, max_source_tokens=256, max_target_tokens=256, cache_dir="cache")
    sampler = TokenBatchSampler(data["num_tokens"], max_tokens=4096)
    loader = DataLoader(data.select_columns(["input_ids", "labels"]), batch_sampler=sampler,
                        collate_fn=Seq2SeqCollator(tok.pad_token_id, decoder_start_token_id=tok.eos_token_id))

Errors are ``ValueError`` naming the file, line and field at fault. Nothing is truncated or dropped silently:
:func:`encode` removes over-long examples only when limits are given and logs (warning level) how many, and
:func:`lm_blocks` logs the length of the tail it cuts off.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import logging
import os
import tarfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import torch
from torch.utils.data import Sampler

from talk_hf.tokenization import SEP_TOKEN, join_sentences, train_joint_bpe

logger = logging.getLogger(__name__)

__all__ = [
    "WIKI_ZH_EN_ARCHIVE",
    "WIKI_ZH_EN_SPLITS",
    "Seq2SeqCollator",
    "TokenBatchSampler",
    "document_windows",
    "group_documents",
    "encode",
    "lm_blocks",
    "lm_token_stream",
    "load_hub_pairs",
    "load_json_pairs",
    "load_text_pairs",
    "load_tsv_pairs",
    "load_wiki_zh_en",
    "load_iwslt15_ted_zh_en",
    "count_documents",
    "read_lines",
    "reverse_pairs",
    "split_lines",
    "stream_blocks",
    "train_tokenizer",
]

WIKI_ZH_EN_ARCHIVE = Path(__file__).resolve().parents[2] / "data" / "wiki_zh_en" / "zh-en.tar.gz"
WIKI_ZH_EN_SPLITS = ("train", "dev", "zh2en-test", "en2zh-test")
IWSLT15_ZH_EN_DIR = Path(__file__).resolve().parents[2] / "data" / "iwslt15_ted_zh_en"
IWSLT15_ZH_EN_SETS = ("dev2010", "tst2010", "tst2011", "tst2012", "tst2013")


# --------------------------------------------------------------------------------------------------- file loaders


def _column(ds: datasets.Dataset, name: str) -> list:
    """A whole column as a Python list (``ds[name][:]``: one Arrow conversion; iterating ``ds[name]``, a lazy
    ``datasets`` Column, would format the rows one by one)."""
    values = ds[name][:]
    return values if isinstance(values, list) else list(values)


def read_lines(path: str | os.PathLike) -> list[str]:
    """All lines of a (possibly gzipped, when the name ends in ``.gz``) UTF-8 file without their line ends.

    Universal newlines: ``\n``, ``\r\n`` and ``\r`` end a line; other Unicode line separators (U+2028, U+0085,
    ...) stay inside the line, unlike ``str.splitlines``. An empty line stays an empty string; a final line end
    does not start another line.

    Raises:
        ValueError: the file is not valid UTF-8 (names the file and the line).
    """
    path = os.fspath(path)
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        raw = f.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        raise ValueError(f"{path}: line {line} is not valid UTF-8 ({err.reason} at byte {err.start})") from None
    return split_lines(text)


def write_lines(path: str | os.PathLike, lines: Iterable[str]) -> None:
    """Write `lines` as UTF-8, each ended by ``\n`` (read back unchanged by :func:`read_lines`)."""
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write("".join(line + "\n" for line in lines))


def split_lines(text: str) -> list[str]:
    """Lines of a text by the rule of :func:`read_lines` (universal newlines only, so U+2028 and the like stay
    inside a line)."""
    return [line[:-1] if line.endswith("\n") else line for line in io.StringIO(text, newline=None)]


def load_text_pairs(source_file: str | os.PathLike, target_file: str | os.PathLike) -> datasets.Dataset:
    """Sentence pairs from two aligned plain-text files (line i of one translates line i of the other).

    Args:
        source_file, target_file: UTF-8 text, one sentence per line; gzipped when the name ends in ``.gz``.

    Returns:
        Dataset with N rows and str columns ``"source"``, ``"target"`` (lines without the line end; empty lines are
        kept as empty strings, so the alignment is never shifted).

    Raises:
        ValueError: the two files have different line counts (both files and counts are named), or a file is not
        valid UTF-8.
    """
    sources, targets = read_lines(source_file), read_lines(target_file)
    if len(sources) != len(targets):
        raise ValueError(
            f"line counts differ: {os.fspath(source_file)} has {len(sources)} lines, "
            f"{os.fspath(target_file)} has {len(targets)} lines"
        )
    return datasets.Dataset.from_dict({"source": sources, "target": targets})


def _column_index(column: int | str, header: list[str] | None, path: str, role: str) -> int:
    """Index of a TSV column given as a 0-based int or as a header name."""
    if isinstance(column, int):
        return column
    if header is None:
        raise ValueError(f"{path}: {role} {column!r} is a column name but the file has no header (give an int index)")
    if column not in header:
        raise ValueError(f"{path}: {role} {column!r} is not in the header {header}")
    return header.index(column)


def load_tsv_pairs(
    path: str | os.PathLike,
    source_column: int | str,
    target_column: int | str,
    doc_column: int | str | None = None,
) -> datasets.Dataset:
    """Sentence pairs from a tab-separated file (plain split on tabs, no quoting; ``.gz`` supported).

    Args:
        path: the TSV file.
        source_column, target_column, doc_column: 0-based int indices (the file has no header), or str column names
            (then the first line is a header naming the columns). ``doc_column`` is optional: consecutive rows with
            the same value form one document.

    Returns:
        Dataset with str columns ``"source"``, ``"target"`` and, with ``doc_column``, str ``"doc_id"``.

    Raises:
        ValueError: a line has a different number of fields than the first line (e.g. a tab inside a sentence),
        a column index is out of range, or a column name is not in the header; the message names the file, the
        line and the field.
    """
    path = os.fspath(path)
    lines = read_lines(path)
    by_name = any(isinstance(c, str) for c in (source_column, target_column, doc_column) if c is not None)
    if by_name and any(isinstance(c, int) for c in (source_column, target_column, doc_column)):
        raise ValueError(f"{path}: give all columns as names (header) or all as int indices, not a mix")
    header, first_line = None, 1
    if by_name:
        if not lines:
            raise ValueError(f"{path}: empty file, expected a header line")
        header, lines, first_line = lines[0].split("\t"), lines[1:], 2
    width = len(header) if header is not None else (len(lines[0].split("\t")) if lines else 0)
    roles = {"source": source_column, "target": target_column}
    if doc_column is not None:
        roles["doc_id"] = doc_column
    indices = {name: _column_index(col, header, path, f"{name} column") for name, col in roles.items()}
    for name, index in indices.items():
        if lines and not 0 <= index < width:
            raise ValueError(f"{path}: {name} column {roles[name]!r} is out of range, lines have {width} fields")
    columns: dict[str, list[str]] = {name: [] for name in indices}
    for number, line in enumerate(lines, start=first_line):
        fields = line.split("\t")
        if len(fields) != width:
            raise ValueError(
                f"{path}: line {number} has {len(fields)} tab-separated fields, expected {width} "
                f"(as on line {first_line - 1 if header is not None else 1})"
            )
        for name, index in indices.items():
            columns[name].append(fields[index])
    return datasets.Dataset.from_dict(columns)


def _get_key(record: Any, key: str, path: str, number: int, require_str: bool = True) -> Any:
    """``record[key]`` for a JSON object; a dotted key ``"translation.de"`` looks into nested objects."""
    value = record
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            raise ValueError(f"{path}: line {number} has no field {key!r}")
        value = value[part]
    if require_str and not isinstance(value, str):
        raise ValueError(f"{path}: line {number} field {key!r} is {type(value).__name__}, expected a string")
    return value


def load_json_pairs(
    path: str | os.PathLike, source_key: str, target_key: str, doc_key: str | None = None
) -> datasets.Dataset:
    """Sentence pairs from a JSON-lines file (one JSON object per line; ``.gz`` supported).

    Args:
        path: the file. Blank lines are allowed and skipped (they hold no record).
        source_key, target_key, doc_key: field names; a dotted name looks into nested objects, e.g.
            ``"translation.de"`` for ``{"translation": {"de": ..., "en": ...}}``. ``doc_key`` is optional
            (consecutive records with the same value form one document).

    Returns:
        Dataset with str columns ``"source"``, ``"target"`` and, with ``doc_key``, ``"doc_id"`` (stored as str).

    Raises:
        ValueError: a line is not valid JSON, or lacks a field, or the field is not a string (file, line and field
        are named).
    """
    path = os.fspath(path)
    roles = {"source": source_key, "target": target_key}
    if doc_key is not None:
        roles["doc_id"] = doc_key
    columns: dict[str, list[str]] = {name: [] for name in roles}
    for number, line in enumerate(read_lines(path), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: line {number} is not valid JSON ({err})") from None
        for name, key in roles.items():
            value = _get_key(record, key, path, number, require_str=name != "doc_id")
            columns[name].append(str(value) if name == "doc_id" else value)
    return datasets.Dataset.from_dict(columns)


def load_hub_pairs(
    name: str,
    split: str,
    source_lang: str,
    target_lang: str,
    config: str | None = None,
    cache_dir: str | os.PathLike | None = None,
) -> datasets.Dataset:
    """Sentence pairs from a Hub dataset (``datasets.load_dataset``) or a local dataset folder.

    Args:
        name: a Hub id (e.g. ``"bentrevett/multi30k"``; needs the network), a local folder of data files that
            ``load_dataset`` understands (``train.jsonl``, ``test.parquet``, ...), or a folder written by
            ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk`` (read with ``datasets.load_from_disk``).
        split: the split name, e.g. ``"train"``.
        source_lang, target_lang: the language codes: keys of a ``translation`` dict column (the standard layout
            of WMT-style datasets) or, without one, the names of two plain string columns.
        config: the dataset configuration (e.g. ``"de-en"``), if it has several.
        cache_dir: the ``datasets`` cache folder for ``load_dataset`` (default: the ``datasets`` default).

    Returns:
        Dataset with str columns ``"source"``, ``"target"`` (and ``"doc_id"`` when the dataset has that column).

    Raises:
        ValueError: the split is missing, or neither layout has the two languages (names the dataset and columns).
    """
    local = Path(name)
    if local.is_dir() and ((local / "state.json").exists() or (local / "dataset_dict.json").exists()):
        loaded = datasets.load_from_disk(str(local))
        if isinstance(loaded, datasets.DatasetDict):
            if split not in loaded:
                raise ValueError(f"{name}: no split {split!r}, splits are {list(loaded)}")
            loaded = loaded[split]
        elif split != (loaded.split or split):
            raise ValueError(f"{name}: holds split {loaded.split!r}, not {split!r}")
    else:
        loaded = datasets.load_dataset(
            name, config, split=split, cache_dir=os.fspath(cache_dir) if cache_dir is not None else None
        )
    columns = loaded.column_names

    def _side_names() -> tuple[str, str] | None:
        if "translation" in columns:
            return None
        missing = [lang for lang in (source_lang, target_lang) if lang not in columns]
        if missing:
            raise ValueError(
                f"{name} ({split}): no 'translation' column and no column(s) {missing}; columns are {columns}"
            )
        return source_lang, target_lang

    sides = _side_names()
    if sides is None:
        pairs = _column(loaded, "translation")
        for number, pair in enumerate(pairs):
            for lang in (source_lang, target_lang):
                if not isinstance(pair, dict) or not isinstance(pair.get(lang), str):
                    raise ValueError(f"{name} ({split}): row {number} 'translation' has no string for {lang!r}")
        data = {"source": [p[source_lang] for p in pairs], "target": [p[target_lang] for p in pairs]}
    else:
        data = {"source": _column(loaded, sides[0]), "target": _column(loaded, sides[1])}
        for side, lang in zip(("source", "target"), sides):
            for number, value in enumerate(data[side]):
                if not isinstance(value, str):
                    raise ValueError(f"{name} ({split}): row {number} column {lang!r} is {type(value).__name__}")
    if "doc_id" in columns:
        data["doc_id"] = _column(loaded, "doc_id")
    return datasets.Dataset.from_dict(data)


def load_wiki_zh_en(split: str, archive: str | os.PathLike | None = None) -> datasets.Dataset:
    """One split of the bundled document-level Wikipedia zh-en corpus (Dobreva, Zhou & Bawden, LREC 2020).

    Args:
        split: ``"train"`` (26,505 pairs, 693 documents), ``"dev"`` (2,020 / 75), ``"zh2en-test"`` (875 / 30) or
            ``"en2zh-test"`` (1,147 / 22).
        archive: the ``zh-en.tar.gz`` to read (default ``data/wiki_zh_en/zh-en.tar.gz`` of the source tree, where
            the package runs from a checkout).

    Returns:
        Dataset, in file order, with columns ``"doc_id"`` (int, 0-based index of the document in the split: a
        document is a run of consecutive lines with the same page title, so a title that occurs in two separate
        runs gives two documents), str ``"title"`` (page title), ``"section_zh"``, ``"section_en"`` (section titles;
        ``"Introduction"`` is the untitled lead section), ``"source"`` (Chinese) and ``"target"`` (English). For the
        en->zh direction swap the two text columns.

    Raises:
        ValueError: unknown split, or a line without exactly 5 tab-separated fields (names the archive member and
        line).
        FileNotFoundError: no archive there (an installed package has no ``data/``: pass ``archive``).
    """
    if split not in WIKI_ZH_EN_SPLITS:
        raise ValueError(f"unknown wiki zh-en split {split!r}, expected one of {list(WIKI_ZH_EN_SPLITS)}")
    archive = Path(archive) if archive is not None else WIKI_ZH_EN_ARCHIVE
    if not archive.is_file():
        raise FileNotFoundError(
            f"no wiki zh-en archive at {archive}: the corpus ships in the talk_hf source tree "
            "(data/wiki_zh_en/zh-en.tar.gz), not in the installed package; pass archive= its path"
        )
    member = f"zh-en/{split}.zh-en"
    with tarfile.open(archive, "r:gz") as tar:
        try:
            handle = tar.extractfile(member)
        except KeyError:
            raise ValueError(f"{archive}: no member {member!r}") from None
        raw = handle.read()
    where = f"{archive}:{member}"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{where}: not valid UTF-8 ({err})") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    names = ("title", "section_zh", "section_en", "source", "target")
    columns: dict[str, list] = {"doc_id": [], **{n: [] for n in names}}
    doc, previous = -1, None
    for number, line in enumerate(lines, start=1):
        fields = line.rstrip("\r").split("\t")
        if len(fields) != len(names):
            raise ValueError(f"{where}: line {number} has {len(fields)} tab-separated fields, expected {len(names)}")
        if fields[0] != previous:
            doc, previous = doc + 1, fields[0]
        columns["doc_id"].append(doc)
        for n, value in zip(names, fields):
            columns[n].append(value)
    return datasets.Dataset.from_dict(columns)


def load_iwslt15_ted_zh_en(split: str, folder: str | os.PathLike | None = None) -> datasets.Dataset:
    """IWSLT15 TED zh-en development and test talks with their document boundaries (the RFA-doc paper's test set:
    tst2010-2013, as prepared by Miculicich et al., 2018). Only these sets are bundled (data/iwslt15_ted_zh_en).

    Args:
        split: ``"dev2010"`` (887 sentences, 8 talks), ``"tst2010"`` .. ``"tst2013"``, or ``"test"`` (the four test
            sets in order: 5,473 sentences, 56 talks).
        folder: the folder holding the files (default ``data/iwslt15_ted_zh_en`` of the source tree).

    Returns:
        Dataset, in file order, with columns ``"doc_id"`` (int, 0-based talk index within the split),
        ``"source"`` (Chinese, untokenised) and ``"target"`` (English, untokenised).

    Raises:
        ValueError: unknown split; sides of different lengths; document starts that do not begin at line 0, are
        not increasing or lie beyond the last line (naming the file).
        FileNotFoundError: the files are not there (an installed package has no ``data/``: pass ``folder``).
    """
    sets = IWSLT15_ZH_EN_SETS[1:] if split == "test" else (split,)
    if split != "test" and split not in IWSLT15_ZH_EN_SETS:
        raise ValueError(f"unknown IWSLT15 TED zh-en split {split!r}, expected one of "
                         f"{[*IWSLT15_ZH_EN_SETS, 'test']}")
    folder = Path(folder) if folder is not None else IWSLT15_ZH_EN_DIR
    if not folder.is_dir():
        raise FileNotFoundError(f"no IWSLT15 TED zh-en files in {folder}: they ship in the talk_hf source tree "
                                "(data/iwslt15_ted_zh_en), not in the installed package; pass folder= their path")
    columns: dict[str, list] = {"doc_id": [], "source": [], "target": []}
    for name in sets:
        stem = folder / f"IWSLT15.TED.{name}.zh-en"
        source, target = (read_lines(f"{stem}.{lang}.gz") for lang in ("zh", "en"))
        if len(source) != len(target):
            raise ValueError(f"{stem}: {len(source)} Chinese lines but {len(target)} English lines")
        starts = [int(line) for line in Path(f"{stem}.doc").read_text(encoding="utf-8").split()]
        if not starts or starts[0] != 0 or starts != sorted(set(starts)) or starts[-1] >= len(source):
            raise ValueError(f"{stem}.doc: document starts must begin at 0 and increase below {len(source)}")
        first_doc = columns["doc_id"][-1] + 1 if columns["doc_id"] else 0
        bounds = starts + [len(source)]
        for doc, (begin, end) in enumerate(zip(bounds, bounds[1:])):
            columns["doc_id"] += [first_doc + doc] * (end - begin)
        columns["source"] += source
        columns["target"] += target
    return datasets.Dataset.from_dict(columns)


# ------------------------------------------------------------------------------------------------ document windows


def _document_starts(doc_ids: Sequence[Any]) -> list[int]:
    """For each row, the index of the first row of its document (runs of equal consecutive ``doc_ids``)."""
    starts, start = [], 0
    for i, doc in enumerate(doc_ids):
        if i > 0 and doc != doc_ids[i - 1]:
            start = i
        starts.append(start)
    return starts


def group_documents(values: Sequence[Any], doc_ids: Sequence[Any]) -> list[list[Any]]:
    """Rows in document order -> one list per document (a run of equal consecutive ``doc_ids``)."""
    if len(values) != len(doc_ids):
        raise ValueError(f"{len(values)} values for {len(doc_ids)} doc_ids")
    documents = []
    for value, start, i in zip(values, _document_starts(doc_ids), range(len(doc_ids))):
        if start == i:
            documents.append([])
        documents[-1].append(value)
    return documents


def document_windows(ds: datasets.Dataset, window: int, sep_token: str = SEP_TOKEN) -> datasets.Dataset:
    """Sliding windows over documents (RFA-doc training data, stride 1, one example per sentence).

    Example i covers sentences ``[max(i - window + 1, doc_start), i]`` of its document, joined with
    :func:`talk_hf.tokenization.join_sentences` on both sides, so the last sentence of every window is sentence i
    and a window never crosses a document boundary (the first ``window - 1`` sentences of a document get shorter
    windows). ``window=1`` gives the sentence-level data unchanged (texts stripped).

    Args:
        ds: Dataset with str columns ``"source"``, ``"target"`` and, for ``window > 1``, ``"doc_id"`` (a document
            is a run of consecutive rows with the same value). Without ``"doc_id"`` (only allowed for
            ``window=1``) every row is its own document and gets its row index as doc_id.
        window: int >= 1, the window length L in sentences (context size c = L - 1).
        sep_token: the separator between sentences.

    Returns:
        Dataset with ``len(ds)`` rows and columns ``"source"``, ``"target"`` (str windows), ``"doc_id"`` (as in
        ``ds``) and ``"num_context"`` (int, the number of sentences before the current one, ``<= window - 1``).

    Raises:
        ValueError: window < 1, missing columns, or a sentence already containing ``sep_token`` (row and side named;
        it would be read as a sentence boundary).
    """
    if not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be an int >= 1, got {window!r}")
    missing = [c for c in ("source", "target") if c not in ds.column_names]
    if missing:
        raise ValueError(f"document_windows: dataset has no column(s) {missing}, columns are {ds.column_names}")
    if "doc_id" in ds.column_names:
        doc_ids = _column(ds, "doc_id")
    elif window == 1:
        doc_ids = list(range(len(ds)))
    else:
        raise ValueError(f"document_windows: window={window} needs a 'doc_id' column, columns are {ds.column_names}")
    sources, targets = _column(ds, "source"), _column(ds, "target")
    for side, texts in (("source", sources), ("target", targets)):
        for i, text in enumerate(texts):
            if sep_token in text:
                raise ValueError(f"document_windows: row {i} {side} already contains the separator {sep_token!r}")
    starts = _document_starts(doc_ids)
    out: dict[str, list] = {"source": [], "target": [], "doc_id": doc_ids, "num_context": []}
    for i, start in enumerate(starts):
        first = max(i - window + 1, start)
        out["source"].append(join_sentences(sources[first : i + 1], sep_token))
        out["target"].append(join_sentences(targets[first : i + 1], sep_token))
        out["num_context"].append(i - first)
    return datasets.Dataset.from_dict(out)


def count_documents(ds: datasets.Dataset) -> int:
    """Number of documents in ``ds``: runs of consecutive rows with the same ``"doc_id"`` (rows without that column
    are each their own document, so ``len(ds)``)."""
    if "doc_id" not in ds.column_names:
        return len(ds)
    doc_ids = _column(ds, "doc_id")
    return sum(1 for i in range(len(doc_ids)) if i == 0 or doc_ids[i] != doc_ids[i - 1])


def reverse_pairs(ds: datasets.Dataset) -> datasets.Dataset:
    """The same dataset with the ``"source"`` and ``"target"`` columns swapped (translation the other way)."""
    for column in ("source", "target"):
        if column not in ds.column_names:
            raise ValueError(f"reverse_pairs: dataset has no column {column!r}, columns are {ds.column_names}")
    swap = "__reverse_pairs_source__"
    return ds.rename_column("source", swap).rename_column("target", "source").rename_column(swap, "target")


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
    """A content hash of a fast tokenizer (its serialized ``tokenizer.json``)."""
    return hashlib.sha256(tokenizer.backend_tokenizer.to_str().encode("utf-8")).hexdigest()[:16]


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
        tokenizer: a fast tokenizer that appends ``</s>`` (e.g. from :func:`train_tokenizer`).
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
    key = hashlib.sha256(
        json.dumps([ds._fingerprint, _tokenizer_hash(tokenizer), max_source_tokens, max_target_tokens]).encode()
    ).hexdigest()[:20]

    def tokenize(batch: dict[str, list]) -> dict[str, list]:
        enc = tokenizer(batch["source"], text_target=batch["target"], add_special_tokens=True)
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
    encoded = ds.map(tokenize, batched=True, remove_columns=input_columns, desc="encode", **kwargs)
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
    """All texts tokenized and concatenated in order, ``separator_token_id`` after each when given -> list of ids."""
    stream: list[int] = []
    texts = list(texts)
    for start in range(0, len(texts), 1000):
        for ids in tokenizer(texts[start : start + 1000])["input_ids"]:
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


class Seq2SeqCollator:
    """Pad a list of encoded examples into a batch of tensors (right padding).

    Args:
        pad_token_id: int, the padding id of ``input_ids`` and ``decoder_input_ids``.
        decoder_start_token_id: int, the first decoder input (``</s>`` in fairseq-style models).

    Calling it on a list of dicts with ``"input_ids"`` and ``"labels"`` (lists or 1-D tensors of int; other keys
    are ignored) returns a dict of int64 tensors:

    - ``input_ids`` (B, S): padded with ``pad_token_id``; ``attention_mask`` (B, S): 1 on tokens, 0 on padding;
    - ``labels`` (B, T): padded with -100 (ignored by the loss);
    - ``decoder_input_ids`` (B, T): ``[start] + labels[:-1]`` per example, padded with ``pad_token_id``.
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
        labels = [torch.as_tensor(e["labels"], dtype=torch.long) for e in examples]
        batch, src_len, tgt_len = len(examples), max(map(len, sources)), max(map(len, labels))
        input_ids = torch.full((batch, src_len), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((batch, src_len), dtype=torch.long)
        padded_labels = torch.full((batch, tgt_len), -100, dtype=torch.long)
        decoder_input_ids = torch.full((batch, tgt_len), self.pad_token_id, dtype=torch.long)
        for i, (src, tgt) in enumerate(zip(sources, labels)):
            input_ids[i, : len(src)] = src
            attention_mask[i, : len(src)] = 1
            padded_labels[i, : len(tgt)] = tgt
            decoder_input_ids[i, 0] = self.decoder_start_token_id
            decoder_input_ids[i, 1 : len(tgt)] = tgt[:-1]
        return {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "labels": padded_labels,
            "decoder_input_ids": decoder_input_ids,
        }
