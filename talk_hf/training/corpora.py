"""Corpora as ``datasets.Dataset`` objects: text-file readers, parallel-text loaders (plain text, TSV, JSON lines,
the Hub), the bundled document-level corpora, and document structure (runs of ``doc_id``, sliding windows).

Every pair loader returns a ``datasets.Dataset`` with string columns ``"source"`` and ``"target"`` (one sentence pair
per row, file order kept) and, where documents are known, ``"doc_id"``::

    train = load_wiki_zh_en("train")                     # doc_id, title, section_zh, section_en, source, target
    windows = document_windows(train, window=4)           # one example per sentence: "s1 <sep> s2 <sep> s3 <sep> s4"

Tokenizing and batching these datasets is :mod:`talk_hf.training.data`; writing prepared splits to disk is
:mod:`talk_hf.training.prepare`. Errors are ``ValueError`` naming the file, line and field at fault.
"""

from __future__ import annotations

import codecs
import gzip
import io
import json
import os
import re
import tarfile
import zlib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import datasets

from ..tokenization import LINE_BREAK, SEP_TOKEN, join_sentences

__all__ = [
    "IWSLT15_ZH_EN_SETS",
    "WIKI_ZH_EN_ARCHIVE",
    "WIKI_ZH_EN_SPLITS",
    "count_documents",
    "decode_lines",
    "document_windows",
    "group_documents",
    "load_hub_pairs",
    "load_iwslt15_ted_zh_en",
    "load_json_pairs",
    "load_text_pairs",
    "load_tsv_pairs",
    "load_wiki_zh_en",
    "load_wikitext2",
    "one_line",
    "read_lines",
    "reverse_pairs",
    "saved_without_split",
    "split_lines",
    "write_lines",
]


WIKI_ZH_EN_ARCHIVE = Path(__file__).resolve().parents[2] / "data" / "wiki_zh_en" / "zh-en.tar.gz"
WIKI_ZH_EN_SPLITS = ("train", "dev", "zh2en-test", "en2zh-test")
IWSLT15_ZH_EN_DIR = Path(__file__).resolve().parents[2] / "data" / "iwslt15_ted_zh_en"
IWSLT15_ZH_EN_SETS = ("dev2010", "tst2010", "tst2011", "tst2012", "tst2013")
WIKITEXT2_DIR = Path(__file__).resolve().parents[2] / "data" / "wikitext2"
WIKITEXT2_SPLITS = ("train", "valid", "test")


# --------------------------------------------------------------------------------------------------- file loaders


def _column(ds: datasets.Dataset, name: str) -> list:
    """A whole column as a Python list (``ds[name][:]``: one Arrow conversion; iterating ``ds[name]``, a lazy
    ``datasets`` Column, would format the rows one by one)."""
    values = ds[name][:]
    return values if isinstance(values, list) else list(values)


def read_lines(path: str | os.PathLike) -> list[str]:
    """All lines of a (possibly gzipped, when the name ends in ``.gz``) UTF-8 file without their line ends; a
    leading UTF-8 byte order mark is not part of the text.

    Universal newlines: ``\n``, ``\r\n`` and ``\r`` end a line; other Unicode line separators (U+2028, U+0085,
    ...) stay inside the line, unlike ``str.splitlines``. An empty line stays an empty string; a final line end
    does not start another line.

    Raises:
        ValueError: the file is not valid UTF-8, or a file whose lines end in ``\n`` holds a lone ``\r`` (which
        would end a line that ``wc -l`` and line-aligned tools count as one, shifting every line after it against
        an aligned file); the error names the file and the line. A file named ``.gz`` that is not gzip data, or
        whose gzip data is truncated or corrupt, is a ValueError naming it.
    """
    path = os.fspath(path)
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except gzip.BadGzipFile as err:
        raise ValueError(f"{path}: named .gz but not gzip data, or corrupt gzip data ({err})") from None
    except (EOFError, zlib.error) as err:
        raise ValueError(f"{path}: truncated or corrupt gzip data ({type(err).__name__}: {err})") from None
    return decode_lines(raw, path)


def decode_lines(raw: bytes, name: str) -> list[str]:
    """The lines of `raw` UTF-8 bytes by the rules of :func:`read_lines` (the same errors, naming `name`: a file,
    or "stdin" for what a script reads from standard input)."""
    start = len(codecs.BOM_UTF8) if raw.startswith(codecs.BOM_UTF8) else 0
    try:
        text = raw[start:].decode("utf-8")
    except UnicodeDecodeError as err:
        at = start + err.start
        line = raw.count(b"\n", 0, at) + 1
        raise ValueError(f"{name}: line {line} is not valid UTF-8 ({err.reason} at byte {at})") from None
    stray = re.search(r"\r(?!\n)", text) if "\n" in text else None
    if stray:
        line = text.count("\n", 0, stray.start()) + 1
        raise ValueError(f"{name}: line {line} holds a carriage return (\\r) not followed by \\n, in a text whose "
                         "lines end in \\n: it would split the line in two and shift every line after it; remove it")
    return split_lines(text)


def one_line(text: str) -> str:
    """`text` with each line break (``\r\n``, ``\r`` or ``\n``, as a byte-level tokenizer can decode) made a space."""
    return LINE_BREAK.sub(" ", text)


def write_lines(path: str | os.PathLike, lines: Iterable[str]) -> None:
    """Write `lines` as UTF-8, each ended by ``\n``, so that :func:`read_lines` reads back one line per entry: a
    line break inside an entry becomes a space (:func:`one_line`); entries without one read back unchanged."""
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write("".join(one_line(line) + "\n" for line in lines))


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
        ValueError: a line is not valid JSON, or lacks a field, or a text field is not a string, or a document id is
        neither a string nor an integer, or the file's ids mix the two (``1`` and ``"1"`` would be one document);
        file, line and field are named.
    """
    path = os.fspath(path)
    roles = {"source": source_key, "target": target_key}
    if doc_key is not None:
        roles["doc_id"] = doc_key
    columns: dict[str, list[str]] = {name: [] for name in roles}
    id_type = None  # str or int: the type of the file's first document id
    for number, line in enumerate(read_lines(path), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: line {number} is not valid JSON ({err})") from None
        for name, key in roles.items():
            value = _get_key(record, key, path, number, require_str=name != "doc_id")
            if name == "doc_id":
                id_type = _doc_id_type(value, id_type, path, number, key)
                value = str(value)
            columns[name].append(value)
    return datasets.Dataset.from_dict(columns)


def _doc_id_type(value: Any, id_type: type | None, path: str, number: int, key: str) -> type:
    """The type of a JSON document id (str or int), checked against the file's earlier ids' type."""
    kind = type(value) if type(value) in (str, int) else None
    if kind is None:
        raise ValueError(f"{path}: line {number} field {key!r} is {json.dumps(value)}, expected a string or an "
                         "integer document id")
    if id_type is not None and kind is not id_type:
        raise ValueError(f"{path}: line {number} field {key!r} is {json.dumps(value)}, a{'n' * (kind is int)} "
                         f"{kind.__name__} where earlier ids are {id_type.__name__}s: 1 and \"1\" would be one "
                         "document; use one type")
    return kind


def _saved_dataset(name: str) -> datasets.Dataset | datasets.DatasetDict | None:
    """The Dataset or DatasetDict a ``save_to_disk`` folder `name` holds; None when `name` is no such folder."""
    local = Path(name)
    if local.is_dir() and ((local / "state.json").exists() or (local / "dataset_dict.json").exists()):
        return datasets.load_from_disk(str(local))
    return None


def saved_without_split(name: str) -> bool:
    """Whether `name` is a folder of one ``Dataset.save_to_disk`` with no split recorded (``Dataset.from_dict`` and
    the like record none): :func:`load_hub_pairs` gives it for any split name."""
    saved = _saved_dataset(name)
    return isinstance(saved, datasets.Dataset) and saved.split is None


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
    loaded = _saved_dataset(name)
    if loaded is not None:
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
        text = raw.decode("utf-8-sig")
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
        starts = _document_start_lines(Path(f"{stem}.doc"))
        if not starts or starts[0] != 0 or starts != sorted(set(starts)) or starts[-1] >= len(source):
            raise ValueError(f"{stem}.doc: document starts must begin at 0 and increase below {len(source)}")
        first_doc = columns["doc_id"][-1] + 1 if columns["doc_id"] else 0
        bounds = starts + [len(source)]
        for doc, (begin, end) in enumerate(zip(bounds, bounds[1:])):
            columns["doc_id"] += [first_doc + doc] * (end - begin)
        columns["source"] += source
        columns["target"] += target
    return datasets.Dataset.from_dict(columns)


def _document_start_lines(path: Path) -> list[int]:
    """The whitespace-separated line numbers of an IWSLT ``.doc`` file (the first line of each talk)."""
    fields = path.read_text(encoding="utf-8-sig").split()
    bad = next((field for field in fields if not re.fullmatch(r"[0-9]+", field)), None)
    if bad is not None:
        raise ValueError(f"{path}: {bad!r} is not a line number (the file lists each talk's first line)")
    return [int(field) for field in fields]


def load_wikitext2(split: str, folder: str | os.PathLike | None = None) -> list[str]:
    """The lines of one split of the bundled WikiText-2 (tokenised, v1; Merity et al., 2016): one paragraph or
    heading per line, blank lines kept (each is one ``<eos>`` of the standard token stream).

    Args:
        split: ``"train"`` (36,718 lines, 2,088,628 tokens counting one ``<eos>`` per line), ``"valid"`` (3,760 /
            217,646) or ``"test"`` (4,358 / 245,569).
        folder: the folder holding ``wiki.<split>.tokens.gz`` (default ``data/wikitext2`` of the source tree).

    Raises:
        ValueError: unknown split.
        FileNotFoundError: the file is not there (an installed package has no ``data/``: pass ``folder``).
    """
    if split not in WIKITEXT2_SPLITS:
        raise ValueError(f"unknown WikiText-2 split {split!r}, expected one of {list(WIKITEXT2_SPLITS)}")
    path = (Path(folder) if folder is not None else WIKITEXT2_DIR) / f"wiki.{split}.tokens.gz"
    if not path.is_file():
        raise FileNotFoundError(f"no WikiText-2 file at {path}: it ships in the talk_hf source tree "
                                "(data/wikitext2), not in the installed package; pass folder= its folder")
    return read_lines(path)


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

    Example i covers sentences ``[max(i - window + 1, doc_start), i]`` of its document (blank ones aside), joined
    with :func:`talk_hf.tokenization.join_sentences` on both sides, so the last sentence of every window is sentence i
    and a window never crosses a document boundary (the first ``window - 1`` sentences of a document get shorter
    windows). A blank sentence (its source empty or whitespace only) is left out of the other sentences' windows, as
    document translation leaves it out (`talk_hf.translate_documents`), and its own window is itself alone: the
    sentences before and after it take the sentences around it as context. ``window=1`` gives the sentence-level
    data unchanged (texts stripped).

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
    out: dict[str, list] = {"source": [], "target": [], "doc_id": doc_ids, "num_context": []}
    context: list[int] = []  # the rows of the current document's last window - 1 sentences that are not blank
    for i, start in enumerate(_document_starts(doc_ids)):
        if start == i:
            context = []
        blank = not sources[i].strip()
        rows = [i] if blank else [*context, i]
        out["source"].append(join_sentences([sources[k] for k in rows], sep_token))
        out["target"].append(join_sentences([targets[k] for k in rows], sep_token))
        out["num_context"].append(len(rows) - 1)
        if not blank and window > 1:
            context = rows[-(window - 1):]
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
