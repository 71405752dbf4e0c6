#!/usr/bin/env python
"""The language-model results (docs/benchmarks.md): the TaLK causal LM vs a transformers GPT-2 model of about the same
size on the bundled tiny Shakespeare (data/tinyshakespeare), same BPE blocks, same number of updates and tokens per
update, trained by the same loop; the score is perplexity on the held-out last 10% of the text.

    python scripts/results_lm.py --output_dir runs/lm --max_steps 150

Writes <output_dir>/data/ (tokenizer and 128-token blocks), <output_dir>/<model>/ runs, results.json and
results.md, printing the table at the end.
"""

import argparse
from pathlib import Path

from talk_hf.training.corpora import read_lines
from talk_hf.training.loop import TrainConfig
from talk_hf.training.prepare import SUMMARY_FILE, prepare_lm_data
from talk_hf.training.run import record_result, train_run
from talk_hf.training.tables import RUN_COLUMNS, markdown_table

ROOT = Path(__file__).resolve().parents[1]

CORPUS = ROOT / "data" / "tinyshakespeare" / "input.txt.gz"
SIZE = dict(d_model=256, decoder_layers=4, dropout=0.1)
ROWS = {
    # TaLK LM layer: GLU input projection (2 d^2) + output projection (d^2) + offsets, then the FFN
    "talk_lm": dict(SIZE, decoder_ffn_dim=1024, decoder_heads=4, decoder_max_offsets=[3, 7, 15, 31],
                    final_layer_norm=True),  # pre-norm layers: normalise before the output projection, as GPT-2 does
    # GPT-2 layer: attention (4 d^2) then the FFN; a 768-wide FFN brings it to the TaLK model's size
    "gpt2": dict(SIZE, decoder_ffn_dim=768, decoder_attention_heads=4, attention_dropout=0.1),
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", default="runs/lm")
    parser.add_argument("--corpus", default=str(CORPUS), help="plain-text corpus (default: bundled tiny Shakespeare)")
    parser.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS))
    parser.add_argument("--max_steps", type=int, default=150)
    parser.add_argument("--warmup_steps", type=int, default=40)
    parser.add_argument("--max_tokens", type=int, default=8192, help="tokens per update (64 blocks of 128)")
    parser.add_argument("--block_size", type=int, default=128)
    parser.add_argument("--vocab_size", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=1)
    return parser.parse_args(argv)


def prepare(out, corpus, block_size, vocab_size):
    """out/data/: blocks of the corpus, its last 10% of lines held out as 'valid' (kept when already prepared)."""
    folder = out / "data"
    if not (folder / SUMMARY_FILE).exists():
        prepare_lm_data(folder, {"train": read_lines(corpus)}, holdout=0.1, block_size=block_size,
                        vocab_size=vocab_size)
    return folder


COLUMNS = [
    ("model", lambda r: r["model"]),
    *RUN_COLUMNS,
    ("held-out loss", lambda r: f"{r['valid_loss']:.3f}"),
    ("held-out perplexity", lambda r: f"{r['valid_ppl']:.2f}"),
]


def main(argv=None):
    args = parse_args(argv)
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    data_dir = prepare(out, args.corpus, args.block_size, args.vocab_size)
    results = []
    for kind in args.rows:
        config = TrainConfig(
            output_dir=str(out / kind), max_tokens=args.max_tokens, max_steps=args.max_steps, learning_rate=1e-3,
            warmup_steps=min(args.warmup_steps, args.max_steps), label_smoothing=0.0, save_every=max(args.max_steps // 3, 1),
            keep_checkpoints=3, bleu_sentences=0, seed=args.seed,
        )
        row = train_run(data_dir, kind, config, overrides=ROWS[kind])
        results = record_result(out / "results.json", row, ("model",))
    table = markdown_table(results, COLUMNS)
    (out / "results.md").write_text(table + "\n")
    print(table)
    return results


if __name__ == "__main__":
    main()
