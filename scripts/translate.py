#!/usr/bin/env python
"""Translate a file (or stdin) with a saved talk_hf model through pipeline("translation").

    python scripts/translate.py --model runs/demo/talk/model --input sentences.de > sentences.en
    echo "Ein Hund rennt." | python scripts/translate.py --model user/talk-multi30k --trust_remote_code
"""

import argparse
import sys

from transformers import pipeline

import talk_hf  # noqa: F401  (registers the models and the translation task)
from talk_hf.training.corpora import decode_lines, one_line, read_lines, write_lines
from evaluate_model import generation_settings  # scripts/evaluate_model.py: the same settings as it scores with


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="saved model folder or Hub repo id")
    parser.add_argument("--input", help="one sentence per line, UTF-8 (.gz fine; default: stdin, read by the same "
                                        "rules); a leading byte order mark is dropped")
    parser.add_argument("--output", help="where to write translations (default: stdout)")
    parser.add_argument("--num_beams", type=int, help="default: the model's generation_config (4 if unset)")
    parser.add_argument("--length_penalty", type=float, help="default: the model's generation_config (1.0 if unset)")
    parser.add_argument("--max_new_tokens", type=int, help="default: the model's generation_config (128 if unset)")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--trust_remote_code", action="store_true", help="needed for Hub repos saved with code")
    return parser.parse_args(argv)


def translate_lines(translator, lines, args):
    """Translate a list of lines; empty lines stay empty (kept so outputs align with inputs). Beam size, length
    penalty and new-token limit: the flags given, else the model's saved generation settings (as
    scripts/evaluate_model.py scores it)."""
    texts = [line.strip() for line in lines]
    todo = [t for t in texts if t]
    generation = generation_settings(translator.model.generation_config, args)
    results = translator(todo, batch_size=args.batch_size, **generation) if todo else []
    it = iter(r["translation_text"] for r in results)
    return [next(it) if t else "" for t in texts]


def main(argv=None):
    args = parse_args(argv)
    lines = read_lines(args.input) if args.input else decode_lines(sys.stdin.buffer.read(), "stdin")
    translator = pipeline("translation", model=args.model, trust_remote_code=args.trust_remote_code)
    translations = translate_lines(translator, lines, args)
    if args.output:
        write_lines(args.output, translations)
    else:
        sys.stdout.write("".join(one_line(t) + "\n" for t in translations))
    return translations


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except (ValueError, FileNotFoundError) as err:  # the input's refusals (e.g. not UTF-8), each naming its cause
        sys.exit(f"translate.py: error: {err}")
