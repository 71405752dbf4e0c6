#!/usr/bin/env python
"""Prepare translation data for scripts/train.py: load pairs, train a joint BPE tokenizer, build document windows,
encode, and save.

    # plain-text files, one sentence per line (.gz fine); split names are free, train.py expects train/valid
    python scripts/preprocess.py --output_dir runs/multi30k/data --vocab_size 10000 \\
        --split train=data/multi30k/train.de.gz,data/multi30k/train.en.gz \\
        --split valid=data/multi30k/val.de.gz,data/multi30k/val.en.gz \\
        --split test=data/multi30k/test_2016_flickr.de.gz,data/multi30k/test_2016_flickr.en.gz
    # tab-separated pairs (columns by 0-based index, or by header name)
    python scripts/preprocess.py --output_dir D --tsv train=pairs.tsv --source_column 0 --target_column 1
    # JSON lines (dotted keys look into nested objects)
    python scripts/preprocess.py --output_dir D --json train=t.jsonl --source_key translation.de \\
        --target_key translation.en
    # a Hub dataset with a "translation" column (needs the network) or a local dataset folder
    python scripts/preprocess.py --output_dir D --hub_dataset bentrevett/multi30k --source_lang de --target_lang en
    # the bundled document-level Wikipedia zh-en corpus, 4-sentence windows (RFA-doc, context size 3)
    python scripts/preprocess.py --output_dir D --wiki_zh_en --window 4 --vocab_size 16000 \\
        --max_tokens_per_example 512
    # a causal-LM corpus: blocks of 128 tokens, the last 10% of the lines held out as 'valid'
    python scripts/preprocess.py --output_dir D --lm_text train=data/tinyshakespeare/input.txt.gz \\
        --lm_holdout 0.1 --block_size 128 --vocab_size 4000

Writes <output-dir>/tokenizer/ (save_pretrained), <output-dir>/<split>/ (Dataset.save_to_disk with source, target,
doc_id, num_context, input_ids, labels, num_tokens; LM splits: input_ids, labels, num_tokens) and
<output-dir>/preprocess.json (arguments and per-split counts, including the examples dropped by
--max_tokens_per_example and the LM tail tokens that fill no block). The work is done by
talk_hf.training.prepare.
"""

import argparse
import logging
import sys
from pathlib import Path

DESCRIPTION = __doc__.split("\n\n")[0]
# the corpus of this checkout (a non-editable install of talk_hf has no data/ beside the package)
WIKI_ZH_EN = Path(__file__).resolve().parents[1] / "data" / "wiki_zh_en" / "zh-en.tar.gz"


def _named_path(value):
    """'NAME=PATH' -> (name, path)."""
    name, sep, path = value.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=PATH, got {value!r}")
    return name, path


def _named_pair(value):
    """'NAME=SRC,TGT' -> (name, src, tgt)."""
    name, sep, files = value.partition("=")
    parts = files.split(",")
    if not sep or not name or len(parts) != 2 or not all(parts):
        raise argparse.ArgumentTypeError(f"expected NAME=SOURCE_FILE,TARGET_FILE, got {value!r}")
    return name, parts[0], parts[1]


def _column(value):
    """A TSV column: an int index when the value is all digits, else a header name."""
    return int(value) if value.isdigit() else value


def _names(value):
    names = [v for v in value.split(",") if v]
    if not names:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of names, got {value!r}")
    return names


def build_parser():
    parser = argparse.ArgumentParser(
        description=DESCRIPTION,
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    text = parser.add_argument_group("plain-text input (one sentence per line, line i of SRC translates line i of TGT)")
    text.add_argument("--source_file", help="source side of the 'train' split (with --target_file)")
    text.add_argument("--target_file", help="target side of the 'train' split (with --source_file)")
    text.add_argument("--split", dest="splits", metavar="NAME=SRC,TGT", type=_named_pair, action="append", default=[],
                      help="a split from two aligned text files (repeatable; .gz allowed)")
    tsv = parser.add_argument_group("TSV input (tab-separated, no quoting)")
    tsv.add_argument("--tsv", metavar="NAME=PATH", type=_named_path, action="append", default=[],
                     help="a split from a TSV file (repeatable)")
    tsv.add_argument("--source_column", type=_column, default=0,
                     help="source column: 0-based index, or a header name (then line 1 is a header); default 0")
    tsv.add_argument("--target_column", type=_column, default=1, help="target column (index or name); default 1")
    tsv.add_argument("--doc_column", type=_column, default=None,
                     help="optional document column: consecutive rows with the same value form a document")
    js = parser.add_argument_group("JSON-lines input")
    js.add_argument("--json", metavar="NAME=PATH", type=_named_path, action="append", default=[],
                    help="a split from a JSON-lines file (repeatable)")
    js.add_argument("--source_key", default="source",
                    help="source field; dotted keys look into nested objects, e.g. translation.de (default: source)")
    js.add_argument("--target_key", default="target", help="target field (default: target)")
    js.add_argument("--doc_key", default=None, help="optional document field")
    hub = parser.add_argument_group("Hub input (datasets.load_dataset; a local dataset folder also works)")
    hub.add_argument("--hub_dataset", metavar="NAME", help="Hub dataset id or local folder")
    hub.add_argument("--hub_config", default=None, help="dataset configuration, e.g. de-en")
    hub.add_argument("--hub_splits", type=_names, default=["train", "validation", "test"],
                     help="comma-separated splits to load (default: train,validation,test)")
    hub.add_argument("--source_lang", default=None, help="source language key of the 'translation' column (or column)")
    hub.add_argument("--target_lang", default=None, help="target language key of the 'translation' column (or column)")
    wiki = parser.add_argument_group("bundled Wikipedia zh-en corpus (data/wiki_zh_en; zh source, en target)")
    wiki.add_argument("--wiki_zh_en", action="store_true", help="use the bundled document-level zh-en corpus")
    wiki.add_argument("--wiki_splits", type=_names, default=["train", "dev", "zh2en-test", "en2zh-test"],
                      help="comma-separated splits (default: train,dev,zh2en-test,en2zh-test)")
    lm = parser.add_argument_group("language-model input (plain text for a causal LM, instead of translation pairs)")
    lm.add_argument("--lm_text", metavar="NAME=PATH", type=_named_path, action="append", default=[],
                    help="a split from a UTF-8 text file; every line is one text, followed by </s> in the token "
                         "stream (repeatable; .gz fine)")
    lm.add_argument("--lm_holdout", type=float, default=0.0,
                    help="move the last FRACTION of the lines of the 'train' text into a 'valid' split (e.g. 0.1)")
    lm.add_argument("--block_size", type=int, default=128, help="LM block length in tokens (default 128)")
    proc = parser.add_argument_group("processing")
    proc.add_argument("--reverse", action="store_true", help="swap source and target (e.g. en->zh)")
    proc.add_argument("--tokenizer", default=None,
                      help="use this saved tokenizer (folder) instead of training one")
    proc.add_argument("--tokenizer_splits", type=_names, default=["train"],
                      help="comma-separated splits the tokenizer is trained on (default: train)")
    proc.add_argument("--vocab_size", type=int, default=8000, help="joint BPE vocabulary size (default 8000)")
    proc.add_argument("--min_frequency", type=int, default=2, help="minimum pair count of a BPE merge (default 2)")
    proc.add_argument("--lowercase", action="store_true", help="lowercase the text in the tokenizer")
    proc.add_argument("--window", type=int, default=1,
                      help="document window length in sentences (1: sentence level; >1 needs document ids)")
    proc.add_argument("--max_tokens_per_example", type=int, default=None,
                      help="drop (never truncate) examples whose source or target exceeds this many tokens, </s> "
                           "included; the count is written to preprocess.json")
    proc.add_argument("--keep_all_splits", type=_names, default=None,
                      help="comma-separated splits that must keep every example: a --max_tokens_per_example that "
                           "would drop one of theirs is an error (default: the splits whose name contains 'test', "
                           "whose every sentence is scored)")
    proc.add_argument("--cache_dir", default=None, help="datasets cache folder for the encoded splits (optional)")
    parser.add_argument("--output_dir", required=True, help="folder to write tokenizer/, <split>/, preprocess.json")
    return parser


def check_args(args, parser):
    """Exit with a usage error unless the flags describe exactly one kind of input with consistent settings."""
    from talk_hf.tokenization import MIN_VOCAB_SIZE

    if (args.source_file is None) != (args.target_file is None):
        parser.error("--source_file and --target_file go together")
    text_pairs = text_pair_files(args)
    kinds = [name for name, used in (("text files", text_pairs), ("--tsv", args.tsv), ("--json", args.json),
                                     ("--hub_dataset", args.hub_dataset), ("--wiki_zh_en", args.wiki_zh_en),
                                     ("--lm_text", args.lm_text)) if used]
    if len(kinds) != 1:
        parser.error(f"give exactly one kind of input, got {kinds or 'none'}")
    if args.window < 1:
        parser.error("--window must be >= 1")
    if args.tokenizer is None and args.vocab_size < MIN_VOCAB_SIZE:
        parser.error(f"--vocab_size must be >= {MIN_VOCAB_SIZE} (the special tokens and at least one more), "
                     f"got {args.vocab_size}")
    if args.hub_dataset and not (args.source_lang and args.target_lang):
        parser.error("--hub_dataset needs --source_lang and --target_lang")
    names = split_names(args)
    if len(set(names)) != len(names):
        parser.error(f"split names repeat: {names}")
    if args.lm_text:
        if args.block_size < 1:
            parser.error("--block_size must be >= 1")
        pair_only = [flag for flag, used in (("--window", args.window != 1), ("--reverse", args.reverse),
                                             ("--max_tokens_per_example", args.max_tokens_per_example is not None),
                                             ("--keep_all_splits", args.keep_all_splits is not None),
                                             ("--cache_dir", args.cache_dir is not None)) if used]
        if pair_only:
            parser.error(f"{', '.join(pair_only)} apply to translation pairs, not to --lm_text")
        if args.lm_holdout:
            if not 0 < args.lm_holdout < 1:
                parser.error(f"--lm_holdout must be in (0, 1), got {args.lm_holdout}")
            if "train" not in names or "valid" in names:
                parser.error("--lm_holdout needs a 'train' text and no 'valid' one")
            names = [*names, "valid"]
    if args.tokenizer is not None:  # a given tokenizer is used as it is: the flags that train one do not apply
        training = [f"--{name}" for name in ("vocab_size", "min_frequency", "lowercase", "tokenizer_splits")
                    if getattr(args, name) != parser.get_default(name)]
        if training:
            parser.error(f"{', '.join(training)} train a tokenizer: with --tokenizer (used as it is) they do not apply")
    missing = [name for name in args.tokenizer_splits if name not in names]
    if args.tokenizer is None and missing:
        parser.error(f"--tokenizer_splits {missing} are not among the splits {names}")


def text_pair_files(args):
    """[(split, source file, target file)] from --source_file/--target_file and --split."""
    text_pairs = list(args.splits)
    if args.source_file is not None:
        text_pairs.insert(0, ("train", args.source_file, args.target_file))
    return text_pairs


def split_names(args):
    """The names of the splits the flags ask for, in order (before --lm_holdout adds 'valid')."""
    if args.lm_text:
        return [name for name, _ in args.lm_text]
    if args.hub_dataset:
        return list(args.hub_splits)
    if args.wiki_zh_en:
        return list(args.wiki_splits)
    return [name for name, *_ in text_pair_files(args) or args.tsv or args.json]


def main(argv=None):
    """Parse the arguments, prepare and save every split; returns the preprocess.json contents (a dict)."""
    from talk_hf.training.corpora import read_lines
    from talk_hf.training.prepare import load_pair_splits, prepare_lm_data, prepare_translation_data, prepare_wiki_zh_en

    parser = build_parser()
    args = parser.parse_args(argv)
    check_args(args, parser)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    common = dict(tokenizer=args.tokenizer, tokenizer_splits=args.tokenizer_splits, vocab_size=args.vocab_size,
                  min_frequency=args.min_frequency, lowercase=args.lowercase, args=vars(args))
    if args.lm_text:
        texts = {name: read_lines(path) for name, path in args.lm_text}
        return prepare_lm_data(args.output_dir, texts, block_size=args.block_size, holdout=args.lm_holdout, **common)
    processing = dict(common, window=args.window, reverse=args.reverse,
                      max_tokens_per_example=args.max_tokens_per_example, cache_dir=args.cache_dir)
    if args.wiki_zh_en:
        processing["keep_all_splits"] = kept_whole(args, args.wiki_splits)
        return prepare_wiki_zh_en(args.output_dir, args.wiki_splits, archive=WIKI_ZH_EN, **processing)
    splits = load_pair_splits(
        text_files={name: (source, target) for name, source, target in text_pair_files(args)} or None,
        tsv_files=dict(args.tsv) or None, json_files=dict(args.json) or None, hub_dataset=args.hub_dataset,
        source_column=args.source_column, target_column=args.target_column, doc_column=args.doc_column,
        source_key=args.source_key, target_key=args.target_key, doc_key=args.doc_key, hub_splits=args.hub_splits,
        hub_config=args.hub_config, source_lang=args.source_lang, target_lang=args.target_lang,
        cache_dir=args.cache_dir,
    )
    processing["keep_all_splits"] = kept_whole(args, splits)
    return prepare_translation_data(args.output_dir, splits, **processing)


def kept_whole(args, names):
    """The splits that must keep every example: --keep_all_splits, else those named like a test set."""
    return args.keep_all_splits if args.keep_all_splits is not None else [n for n in names if "test" in n]


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except (ValueError, FileNotFoundError) as err:  # a missing input file, text that is not UTF-8 ...
        sys.exit(f"preprocess.py: error: {err}")
