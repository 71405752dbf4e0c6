#!/usr/bin/env python
"""The Multi30k de->en results tables (README, docs/benchmarks.md): TaLK vs DynamicConv vs LightConv vs a
transformers Marian baseline, same data, same tokens per update, near-equal parameter counts, trained by the same loop.

    python scripts/results_multi30k.py --data runs/demo/data --output_dir runs/results

Two stages, each resumable (run the command again, with --resume for the final stage, and it continues):
- tune: every model trains at every point of one grid of peak learning rates x warm-ups for the same short budget
  (--grid_steps updates); the point whose final weights have the lowest validation loss is the model's setting.
  Every run is scored on test2016 too, and recorded in grid.json as it finishes; grid.md lists them all and
  short_budget.md the chosen point of each model (which model learns fastest at that budget).
- final: one run per model with its chosen setting, validated every --eval_every updates, until the validation loss
  has not improved for --patience evaluations or --max_steps (the last 3 checkpoints averaged); results.md, and the
  validation loss curves of every model in valid_loss.png. --resume continues an interrupted final run.

Prepare --data with `make demo` (or scripts/preprocess.py). Runs go to <output_dir>/grid/<model>/<point>/ and
<output_dir>/final/<model>/.
"""

import argparse
from pathlib import Path

from talk_hf.training import tuning
from talk_hf.training.loop import TrainConfig
from talk_hf.training.prepare import read_summary
from talk_hf.training.run import train_run
from talk_hf.training.tables import RUN_COLUMNS

SIZE = dict(d_model=256, encoder_layers=3, decoder_layers=3, decoder_attention_heads=4, dropout=0.2,
            attention_dropout=0.1)
ROWS = {
    "talk": dict(SIZE, encoder_ffn_dim=512, decoder_ffn_dim=512, encoder_heads=4, decoder_heads=4,
                 encoder_max_offsets=[1, 3, 7], decoder_max_offsets=[1, 3, 7], offset_dropout=0.1),
    "dynamic_conv": dict(SIZE, encoder_ffn_dim=512, decoder_ffn_dim=512, encoder_conv_heads=4, decoder_conv_heads=4,
                         encoder_kernel_sizes=[3, 7, 15], decoder_kernel_sizes=[3, 7, 15], weight_dropout=0.1),
    "lightconv": dict(SIZE, encoder_ffn_dim=512, decoder_ffn_dim=512, encoder_conv_heads=4, decoder_conv_heads=4,
                      encoder_kernel_sizes=[3, 7, 15], decoder_kernel_sizes=[3, 7, 15], weight_dropout=0.1),
    # self-attention has 4 d^2 weights per layer where the conv blocks have 2 d^2: a 256-wide FFN evens it out
    "marian": dict(SIZE, encoder_ffn_dim=256, decoder_ffn_dim=256, encoder_attention_heads=4),
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="runs/demo/data")
    parser.add_argument("--output_dir", default="runs/results")
    parser.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS))
    tuning.add_arguments(parser, learning_rates=[1e-3, 2e-3, 4e-3], warmup_steps=[100, 300], grid_steps=300,
                         max_steps=8000, eval_every=200, patience=3)
    parser.add_argument("--max_tokens", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--test_limit", type=int, default=0, help="score only the first N test sentences (0: all)")
    args = parser.parse_args(argv)
    tuning.check_arguments(parser, args)
    try:
        read_summary(args.data)
    except FileNotFoundError as err:
        parser.error(f"--data {err} (make demo prepares runs/demo/data)")
    return args


GRID_COLUMNS = [
    ("model", lambda r: r["model"]),
    ("learning rate", lambda r: f"{r['learning_rate']:g}"),
    ("warm-up", lambda r: str(r["warmup_steps"])),
    *RUN_COLUMNS,
    ("valid loss", lambda r: f"{r['valid_loss']:.3f}"),
    ("test2016 BLEU", lambda r: f"{r['test_bleu']:.2f}"),
    ("chrF", lambda r: f"{r['test_chrf']:.2f}"),
]
COLUMNS = [
    *GRID_COLUMNS[:3],
    *RUN_COLUMNS,
    *tuning.STOP_COLUMNS,
    *GRID_COLUMNS[-3:],
]


def trainer(args):
    """train(ident, folder, learning_rate, warmup_steps, **loop) of every row: the same loop settings but these."""

    def train(ident, folder, learning_rate, warmup_steps, **loop):
        kind = ident["model"]
        config = TrainConfig(output_dir=str(folder), max_tokens=args.max_tokens, learning_rate=learning_rate,
                             warmup_steps=warmup_steps, label_smoothing=0.1, bleu_sentences=0, num_beams=4,
                             max_new_tokens=64, seed=args.seed, **loop)
        return train_run(args.data, kind, config, overrides=ROWS[kind], test_split="test", test_limit=args.test_limit)

    return train


def main(argv=None):
    args = parse_args(argv)
    out = Path(args.output_dir)
    return tuning.run_and_tabulate(args, out, [{"model": kind} for kind in args.rows], trainer(args),
                                   [{"model": kind} for kind in ROWS], GRID_COLUMNS, COLUMNS)


if __name__ == "__main__":
    main()
