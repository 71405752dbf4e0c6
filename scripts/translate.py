#!/usr/bin/env python
"""Translate a file (or stdin) with a saved talk_hf model through pipeline("translation").

    python scripts/translate.py --model runs/demo/talk/model --input sentences.de > sentences.en
    echo "Ein Hund rennt." | python scripts/translate.py --model user/talk-multi30k --trust_remote_code
"""

import argparse
import sys

from transformers import pipeline

import talk_hf  # noqa: F401  (registers the models and the translation task)
from talk_hf.training.corpora import read_lines, split_lines


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="saved model folder or Hub repo id")
    parser.add_argument("--input", help="one sentence per line, UTF-8 (.gz fine; default: stdin); a leading byte "
                                        "order mark is dropped")
    parser.add_argument("--output", help="where to write translations (default: stdout)")
    parser.add_argument("--num_beams", type=int, default=4)
    parser.add_argument("--length_penalty", type=float, default=1.0)
    parser.add_argument("--max_new_tokens", type=int, default=128)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--trust_remote_code", action="store_true", help="needed for Hub repos saved with code")
    return parser.parse_args(argv)


def translate_lines(translator, lines, args):
    """Translate a list of lines; empty lines stay empty (kept so outputs align with inputs)."""
    texts = [line.strip() for line in lines]
    todo = [t for t in texts if t]
    results = translator(todo, batch_size=args.batch_size, num_beams=args.num_beams,
                         length_penalty=args.length_penalty, max_new_tokens=args.max_new_tokens) if todo else []
    it = iter(r["translation_text"] for r in results)
    return [next(it) if t else "" for t in texts]


def main(argv=None):
    args = parse_args(argv)
    translator = pipeline("translation", model=args.model, trust_remote_code=args.trust_remote_code)
    lines = read_lines(args.input) if args.input else split_lines(sys.stdin.read().removeprefix("\ufeff"))
    translations = translate_lines(translator, lines, args)
    out = open(args.output, "w", encoding="utf-8") if args.output else sys.stdout
    out.write("".join(t + "\n" for t in translations))
    if args.output:
        out.close()
    return translations


if __name__ == "__main__":
    main()
