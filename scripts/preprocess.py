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
--max_tokens_per_example and the LM tail tokens that fill no block). The work is done by talk_hf.training.data.
"""

import argparse
import json
import logging
import sys
from pathlib import Path

DESCRIPTION = __doc__.split("\n\n")[0]


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
    proc.add_argument("--cache_dir", default=None, help="datasets cache folder for the encoded splits (optional)")
    parser.add_argument("--output_dir", required=True, help="folder to write tokenizer/, <split>/, preprocess.json")
    return parser


def text_pair_files(args, parser):
    """[(split, source file, target file)] from --source_file/--target_file and --split; exits unless exactly one
    kind of input was given."""
    text_pairs = list(args.splits)
    if (args.source_file is None) != (args.target_file is None):
        parser.error("--source_file and --target_file go together")
    if args.source_file is not None:
        text_pairs.insert(0, ("train", args.source_file, args.target_file))
    kinds = [name for name, used in (("text files", text_pairs), ("--tsv", args.tsv), ("--json", args.json),
                                     ("--hub_dataset", args.hub_dataset), ("--wiki_zh_en", args.wiki_zh_en),
                                     ("--lm_text", args.lm_text)) if used]
    if len(kinds) != 1:
        parser.error(f"give exactly one kind of input, got {kinds or 'none'}")
    return text_pairs


def load_splits(args, parser):
    """The sentence-level splits named by the arguments: dict name -> Dataset(source, target[, doc_id, ...])."""
    from talk_hf.training import data

    text_pairs = text_pair_files(args, parser)
    if args.hub_dataset and not (args.source_lang and args.target_lang):
        parser.error("--hub_dataset needs --source_lang and --target_lang")
    if text_pairs:
        items = [(name, lambda s=s, t=t: data.load_text_pairs(s, t)) for name, s, t in text_pairs]
    elif args.tsv:
        items = [(name, lambda p=p: data.load_tsv_pairs(p, args.source_column, args.target_column, args.doc_column))
                 for name, p in args.tsv]
    elif args.json:
        items = [(name, lambda p=p: data.load_json_pairs(p, args.source_key, args.target_key, args.doc_key))
                 for name, p in args.json]
    elif args.hub_dataset:
        items = [(name, lambda n=name: data.load_hub_pairs(args.hub_dataset, n, args.source_lang, args.target_lang,
                                                           args.hub_config, cache_dir=args.cache_dir))
                 for name in args.hub_splits]
    else:
        items = [(name, lambda n=name: data.load_wiki_zh_en(n)) for name in args.wiki_splits]
    names = [name for name, _ in items]
    if len(set(names)) != len(names):
        parser.error(f"split names repeat: {names}")
    splits = {name: load() for name, load in items}
    if args.reverse:
        splits = {name: data.reverse_pairs(ds) for name, ds in splits.items()}
    return splits


def lm_texts(args, parser):
    """The LM splits: dict name -> list of lines (the 'valid' split cut from the end of 'train' with --lm_holdout)."""
    from talk_hf.training import data

    names = [name for name, _ in args.lm_text]
    if len(set(names)) != len(names):
        parser.error(f"split names repeat: {names}")
    texts = {name: data.read_lines(path) for name, path in args.lm_text}
    if args.lm_holdout:
        if not 0 < args.lm_holdout < 1:
            parser.error(f"--lm_holdout must be in (0, 1), got {args.lm_holdout}")
        if "train" not in texts or "valid" in texts:
            parser.error("--lm_holdout needs a 'train' text and no 'valid' one")
        lines = texts["train"]
        cut = round(len(lines) * (1 - args.lm_holdout))
        texts["train"], texts["valid"] = lines[:cut], lines[cut:]
    return texts


def prepare_lm(args, parser, texts, output):
    """Tokenizer (no </s> appended by the tokenizer itself) and fixed-size blocks per split of `texts` (from
    `lm_texts`); -> (tokenizer, per-split counts)."""
    from transformers import AutoTokenizer

    from talk_hf.tokenization import train_joint_bpe
    from talk_hf.training import data

    if args.tokenizer is not None:
        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    else:
        missing = [name for name in args.tokenizer_splits if name not in texts]
        if missing:
            parser.error(f"--tokenizer_splits {missing} are not among the splits {list(texts)}")
        corpus = (line for name in args.tokenizer_splits for line in texts[name])
        tokenizer = train_joint_bpe(corpus, args.vocab_size, lowercase=args.lowercase, add_eos=False,
                                    min_frequency=args.min_frequency)
    tokenizer.save_pretrained(output / "tokenizer")
    counts = {}
    for name, lines in texts.items():
        stream = data.lm_token_stream(lines, tokenizer, separator_token_id=tokenizer.eos_token_id)
        blocks = data.stream_blocks(stream, args.block_size)
        blocks.save_to_disk(str(output / name))
        total = len(stream)
        counts[name] = {"lines": len(lines), "blocks": len(blocks), "tokens_total": total,
                        "tokens_in_blocks": len(blocks) * args.block_size,
                        "tail_tokens_dropped": total - len(blocks) * args.block_size}
        logging.getLogger("preprocess").info("%s: %s", name, counts[name])
    return tokenizer, counts


def main(argv=None):
    """Parse the arguments, prepare and save every split; returns the preprocess.json contents (a dict)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.window < 1:
        parser.error("--window must be >= 1")
    if args.lm_text:
        text_pair_files(args, parser)  # exits if another kind of input was given too
        if args.block_size < 1:
            parser.error("--block_size must be >= 1")
        if args.window != 1 or args.reverse:
            parser.error("--window and --reverse apply to translation pairs, not to --lm_text")
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
        texts = lm_texts(args, parser)
        output = Path(args.output_dir)
        output.mkdir(parents=True, exist_ok=True)
        tokenizer, counts = prepare_lm(args, parser, texts, output)
        return write_summary(args, output, tokenizer, counts)

    from transformers import AutoTokenizer

    from talk_hf.tokenization import SEP_TOKEN
    from talk_hf.training import data

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    splits = load_splits(args, parser)
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer) if args.tokenizer is not None else None
    sep_token = tokenizer.sep_token if tokenizer is not None else SEP_TOKEN
    windows = {name: data.document_windows(ds, args.window, sep_token=sep_token) for name, ds in splits.items()}
    if tokenizer is None:
        missing = [name for name in args.tokenizer_splits if name not in splits]
        if missing:
            parser.error(f"--tokenizer_splits {missing} are not among the splits {list(splits)}")
        tokenizer = data.train_tokenizer([splits[n] for n in args.tokenizer_splits], args.vocab_size,
                                         lowercase=args.lowercase, min_frequency=args.min_frequency)
    output = Path(args.output_dir)
    output.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(output / "tokenizer")
    counts = {}
    for name, sentences in splits.items():
        encoded = data.encode(windows[name], tokenizer, args.max_tokens_per_example, args.max_tokens_per_example,
                              cache_dir=args.cache_dir)
        encoded.save_to_disk(str(output / name))
        num_tokens = encoded["num_tokens"][:]
        counts[name] = {
            "sentences": len(sentences),
            "documents": data.count_documents(sentences) if "doc_id" in sentences.column_names else None,
            "examples": len(windows[name]),
            "kept": len(encoded),
            "dropped": len(windows[name]) - len(encoded),
            "num_tokens_total": int(sum(num_tokens)),
            "num_tokens_max": int(max(num_tokens, default=0)),
        }
        logging.getLogger("preprocess").info("%s: %s", name, counts[name])
    return write_summary(args, output, tokenizer, counts)


def write_summary(args, output, tokenizer, counts):
    summary = {
        "args": vars(args),
        "tokenizer": {"vocab_size": len(tokenizer), "trained_on": None if args.tokenizer else args.tokenizer_splits},
        "splits": counts,
    }
    (output / "preprocess.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return summary


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except ValueError as err:
        sys.exit(f"preprocess.py: error: {err}")
