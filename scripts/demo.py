#!/usr/bin/env python
"""The main job (`make demo`): train a small TaLK translation model on the bundled Multi30k de->en on CPU,
report sacreBLEU on test2016, save the model with its tokenizer and card, and translate a few sentences through
pipeline("translation"). The last line printed is the test BLEU.

    python scripts/demo.py                       # about 11 minutes on 2 CPU cores
    python scripts/demo.py --max_steps 50        # a quick smoke run
"""

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from transformers import pipeline

import talk_hf  # noqa: F401
from talk_hf.training.loop import TrainConfig
from talk_hf.training.prepare import load_pair_splits, prepare_once, prepare_translation_data
from talk_hf.training.run import train_run

ROOT = Path(__file__).resolve().parents[1]

DATA = ROOT / "data" / "multi30k"
SENTENCES = [
    "Ein Mann fährt mit dem Fahrrad die Straße entlang.",
    "Zwei Kinder spielen im Sand am Strand.",
    "Eine Frau in einem roten Kleid singt auf der Bühne.",
]
# A small TaLK model: 3+3 layers, d_model 256 (the paper's IWSLT block structure, scaled down for a CPU budget).
MODEL = dict(d_model=256, encoder_layers=3, decoder_layers=3, encoder_ffn_dim=512, decoder_ffn_dim=512,
             encoder_heads=4, decoder_heads=4, decoder_attention_heads=4, encoder_max_offsets=[1, 3, 7],
             decoder_max_offsets=[1, 3, 7], dropout=0.2, attention_dropout=0.1, offset_dropout=0.1)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", default=str(ROOT / "runs" / "demo"))
    parser.add_argument("--max_steps", type=int, default=500, help="optimizer updates (about 11 minutes on 2 cores)")
    parser.add_argument("--max_minutes", type=float, default=20.0, help="training time cap on slow machines")
    parser.add_argument("--vocab_size", type=int, default=8000)
    parser.add_argument("--test_limit", type=int, default=0, help="score only the first N test sentences (0: all)")
    parser.add_argument("--valid_bleu_sentences", type=int, default=100, help="validation BLEU during training")
    return parser.parse_args(argv)


def prepare(data_dir, vocab_size):
    """data_dir/ from the bundled Multi30k train, val and test2016 files, kept when already prepared with
    `vocab_size` (a folder prepared with another vocabulary size is a ValueError naming both)."""
    stems = {"train": "train", "valid": "val", "test": "test_2016_flickr"}
    files = {name: (DATA / f"{stem}.de.gz", DATA / f"{stem}.en.gz") for name, stem in stems.items()}

    def build():
        prepare_translation_data(data_dir, load_pair_splits(text_files=files), vocab_size=vocab_size)

    prepare_once(data_dir, build, settings={"vocab_size": vocab_size})


def main(argv=None):
    args = parse_args(argv)
    out = Path(args.output_dir)
    start = time.monotonic()
    try:
        prepare(out / "data", args.vocab_size)
    except ValueError as err:  # e.g. the data folder of an earlier demo with another --vocab_size
        sys.exit(f"demo.py: error: {err}")
    shutil.rmtree(out / "talk", ignore_errors=True)  # each demo trains afresh (the data folder is kept)
    config = TrainConfig(
        output_dir=str(out / "talk"), max_tokens=4096, max_steps=args.max_steps, max_minutes=args.max_minutes,
        learning_rate=1e-3, warmup_steps=200, label_smoothing=0.1, eval_every=200, save_every=100,
        keep_checkpoints=3, average_last=3, bleu_sentences=args.valid_bleu_sentences, num_beams=4, max_new_tokens=64,
        seed=1,
    )
    card = {"languages": ["de", "en"], "datasets": ["multi30k"]}
    results = train_run(out / "data", "talk", config, overrides=MODEL, test_split="test", card=card,
                        test_limit=args.test_limit)
    print(json.dumps(results, indent=2))
    translator = pipeline("translation", model=str(out / "talk" / "model"))
    for source, result in zip(SENTENCES, translator(SENTENCES, num_beams=4)):
        print(f"{source}  ->  {result['translation_text']}")
    print(f"model saved to {out / 'talk' / 'model'} ({(time.monotonic() - start) / 60:.1f} minutes in all)")
    print(f"sacreBLEU (Multi30k test2016, de->en, beam 4): {results['test_bleu']:.2f}")
    return results


if __name__ == "__main__":
    main()
