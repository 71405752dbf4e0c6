#!/usr/bin/env python
"""The Multi30k de->en results table (README, docs/benchmarks.md): TaLK vs DynamicConv vs LightConv vs a transformers
Marian baseline, same data, same number of updates and tokens per update, near-equal parameter counts, trained by the
same loop.

    python scripts/results_multi30k.py --data runs/demo/data --output_dir runs/results --max_steps 500

Prepare --data with `make demo` (or scripts/preprocess.py). Writes <output_dir>/<model>/ runs, results.json and
results.md (a markdown table), printing the table at the end.
"""

import argparse
from pathlib import Path

from talk_hf.training.loop import TrainConfig
from talk_hf.training.run import record_result, train_run
from talk_hf.training.tables import RUN_COLUMNS, markdown_table

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
    parser.add_argument("--max_steps", type=int, default=500)
    parser.add_argument("--max_tokens", type=int, default=4096)
    parser.add_argument("--learning_rate", type=float, default=1e-3, help="peak learning rate of every row")
    parser.add_argument("--warmup_steps", type=int, default=200, help="inverse-sqrt warm-up of every row")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--test_limit", type=int, default=0, help="score only the first N test sentences (0: all)")
    return parser.parse_args(argv)


COLUMNS = [
    ("model", lambda r: r["model"]),
    *RUN_COLUMNS,
    ("valid loss", lambda r: f"{r['valid_loss']:.3f}"),
    ("test2016 BLEU", lambda r: f"{r['test_bleu']:.2f}"),
]


def main(argv=None):
    args = parse_args(argv)
    out = Path(args.output_dir)
    results = []
    for kind in args.rows:
        config = TrainConfig(
            output_dir=str(out / kind), max_tokens=args.max_tokens, max_steps=args.max_steps,
            learning_rate=args.learning_rate, warmup_steps=args.warmup_steps, label_smoothing=0.1, save_every=100,
            keep_checkpoints=3, average_last=3,
            bleu_sentences=0, num_beams=4, max_new_tokens=64, seed=args.seed,
        )
        row = train_run(args.data, kind, config, overrides=ROWS[kind], test_split="test", test_limit=args.test_limit)
        results = record_result(out / "results.json", row, ("model",))
    table = markdown_table(results, COLUMNS)
    (out / "results.md").write_text(table + "\n")
    print(table)
    return results


if __name__ == "__main__":
    main()
