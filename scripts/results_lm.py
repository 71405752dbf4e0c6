#!/usr/bin/env python
"""The language-model results (docs/benchmarks.md): the TaLK causal LM vs a transformers GPT-2 model of the same size,
on the bundled WikiText-2 (data/wikitext2: its train, valid and test splits) and tiny Shakespeare (data/tinyshakespeare:
the first 90% of the lines for training, the next 5% for validation, the last 5% for testing); per corpus one BPE
and the same 128-token blocks for both models, the same tokens per update, trained by the same loop.

    python scripts/results_lm.py --output_dir runs/lm --corpora wikitext2 tinyshakespeare

Two stages, each resumable (run the command again, with --resume for the final stage, and it continues), as in
scripts/results_multi30k.py:
- tune: every model trains at every point of one grid of peak learning rates x warm-ups for the same short budget
  (--grid_steps updates); the point with the lowest validation loss is the model's setting (grid.json, grid.md,
  short_budget.md);
- final: one run per model with its setting until the validation loss has not improved for --patience validations
  or --max_steps; its test perplexity goes to results.md, the validation loss curves to valid_loss.png.

Writes <output_dir>/data_<corpus>/ (tokenizer and blocks), <output_dir>/grid/ and final/ runs, and the tables.
"""

import argparse
from pathlib import Path

from talk_hf.training import tuning
from talk_hf.training.corpora import load_wikitext2, read_lines
from talk_hf.training.loop import TrainConfig
from talk_hf.training.prepare import prepare_lm_data, prepare_once
from talk_hf.training.run import train_run
from talk_hf.training.tables import RUN_COLUMNS

ROOT = Path(__file__).resolve().parents[1]
# the corpora of this checkout (a non-editable install of talk_hf has no data/ beside the package)
SHAKESPEARE = ROOT / "data" / "tinyshakespeare" / "input.txt.gz"
WIKITEXT2 = ROOT / "data" / "wikitext2"
SIZE = dict(d_model=256, decoder_layers=4, dropout=0.1)
ROWS = {
    # TaLK LM layer: GLU input projection (2 d^2) + output projection (d^2) + offsets, then the FFN
    "talk_lm": dict(SIZE, decoder_ffn_dim=1024, decoder_heads=4, decoder_max_offsets=[3, 7, 15, 31],
                    final_layer_norm=True),  # pre-norm layers: normalise before the output projection, as GPT-2 does
    # GPT-2 layer: attention (4 d^2) then the FFN; a 768-wide FFN brings it to the TaLK model's size
    "gpt2": dict(SIZE, decoder_ffn_dim=768, decoder_attention_heads=4, attention_dropout=0.1),
}
CORPORA = ("wikitext2", "tinyshakespeare")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", default="runs/lm")
    parser.add_argument("--corpora", nargs="+", default=list(CORPORA), choices=CORPORA)
    parser.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS))
    tuning.add_arguments(parser, learning_rates=[1e-3, 2e-3, 4e-3], warmup_steps=[100, 300], grid_steps=300,
                         max_steps=8000, eval_every=200, patience=3)
    parser.add_argument("--max_tokens", type=int, default=8192, help="tokens per update (64 blocks of 128)")
    parser.add_argument("--block_size", type=int, default=128)
    parser.add_argument("--vocab_size", type=int, default=8000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    tuning.check_arguments(parser, args)
    return args


def corpus_texts(corpus):
    """{"train", "valid", "test": lines} of a bundled corpus."""
    if corpus == "wikitext2":
        return {split: load_wikitext2(split, folder=WIKITEXT2) for split in ("train", "valid", "test")}
    lines = read_lines(SHAKESPEARE)
    valid, test = round(len(lines) * 0.90), round(len(lines) * 0.95)
    return {"train": lines[:valid], "valid": lines[valid:test], "test": lines[test:]}


def prepare(out, corpus, block_size, vocab_size):
    """out/data_<corpus>/ (kept when already prepared with these settings, refused when with others; shards
    started together prepare it once)."""
    folder = out / f"data_{corpus}"
    return prepare_once(folder, lambda: prepare_lm_data(folder, corpus_texts(corpus), block_size=block_size,
                                                        vocab_size=vocab_size),
                        settings={"block_size": block_size, "vocab_size": vocab_size})


GRID_COLUMNS = [
    ("corpus", lambda r: r["corpus"]),
    ("model", lambda r: r["model"]),
    ("learning rate", lambda r: f"{r['learning_rate']:g}"),
    ("warm-up", lambda r: str(r["warmup_steps"])),
    *RUN_COLUMNS,
    ("valid loss", lambda r: f"{r['valid_loss']:.3f}"),
    ("valid perplexity", lambda r: f"{r['valid_ppl']:.2f}"),
]
COLUMNS = [
    *GRID_COLUMNS[:4],
    *RUN_COLUMNS,
    *tuning.STOP_COLUMNS,
    *GRID_COLUMNS[-2:],
    ("test perplexity", lambda r: f"{r['test_ppl']:.2f}"),
]


def trainer(args, data):
    """train(ident, folder, learning_rate, warmup_steps, **loop) of every row; data: {corpus: prepared folder}."""

    def train(ident, folder, learning_rate, warmup_steps, **loop):
        config = TrainConfig(output_dir=str(folder), max_tokens=args.max_tokens, learning_rate=learning_rate,
                             warmup_steps=warmup_steps, label_smoothing=0.0, bleu_sentences=0, seed=args.seed, **loop)
        kind = ident["model"]
        return train_run(data[ident["corpus"]], kind, config, overrides=ROWS[kind], test_split="test")

    return train


def main(argv=None):
    args = parse_args(argv)
    out = Path(args.output_dir)
    data = {corpus: prepare(out, corpus, args.block_size, args.vocab_size) for corpus in args.corpora}
    idents = [{"corpus": corpus, "model": kind} for corpus in args.corpora for kind in args.rows]
    every = [{"corpus": corpus, "model": kind} for corpus in CORPORA for kind in ROWS]
    return tuning.run_and_tabulate(args, out, idents, trainer(args, data), every, GRID_COLUMNS, COLUMNS)


if __name__ == "__main__":
    main()
