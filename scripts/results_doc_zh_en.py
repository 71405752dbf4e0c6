#!/usr/bin/env python
"""The document-level zh->en results (docs/benchmarks.md): RFA-doc with and without the sentential decay gate vs a
transformers Marian model of the same size, at windows of 1 sentence (sentence level) and 4 sentences (3 sentences of
context), on the bundled Wikipedia zh-en corpus (data/wiki_zh_en). Same data, same tokens per update, trained by the
same loop. The test documents (zh2en-test) are translated whole, with the paper's sliding windows and the model's own
translations as the forced target context (window 1: sentence by sentence); the scores are sacreBLEU over every
sentence of every document and d-BLEU over whole documents.

    python scripts/results_doc_zh_en.py --output_dir runs/doc_zh_en

Two stages, each resumable (run the command again, with --resume for the final stage, and it continues), as in
scripts/results_multi30k.py: tune (every row at every point of one grid of learning rates x warm-ups, --grid_steps
updates each, chosen on the dev loss among the points whose dev source gain reaches --grid_min_source_gain; the test
documents are translated by the final runs only, and by every grid point too with --grid_test; grid.md, short_budget.md)
and final (one run per row at its setting until the dev loss stops improving for --patience validations or --max_steps;
results.md, valid_loss.png). With --init_from_sentence_level a row of window > 1 starts from the final model of its
family's window-1 row (RFA-doc rows from the ungated one: its gate weights keep their initialisation), which must have
run first. With --setting LEARNING_RATE WARMUP_STEPS there is no grid: every row trains at that one setting for the same
budget (a fixed-budget comparison, marked fixed_setting).

The grid's budget and its source-gain threshold come from docs/benchmarks.md ("The document rows' grid on one
GPU"): after 300 updates no point read its source yet, and the lowest dev loss belonged to learning rates at which
longer runs collapsed their encoders (a decoder that is a language model of English scores nearly as well).

At window 1 there is no separator inside an example, so the gate never fires: the gated and ungated models are the
same function and only the ungated one is trained. Writes <output_dir>/data_w<N>/ (preprocessed windows; the
tokenizer is trained once on the sentence-level train split and shared), <output_dir>/grid/ and final/ runs, and
the tables.
"""

import argparse
from pathlib import Path

from talk_hf.training import tuning
from talk_hf.training.loop import TrainConfig
from talk_hf.training.prepare import SUMMARY_FILE, prepare_once, prepare_wiki_zh_en
from talk_hf.training.run import load_prepared, train_run
from talk_hf.training.tables import RUN_COLUMNS

# the corpus of this checkout (a non-editable install of talk_hf has no data/ beside the package)
WIKI_ZH_EN = Path(__file__).resolve().parents[1] / "data" / "wiki_zh_en" / "zh-en.tar.gz"

SIZE = dict(d_model=256, encoder_layers=3, decoder_layers=3, encoder_ffn_dim=512, decoder_ffn_dim=512,
            encoder_attention_heads=4, decoder_attention_heads=4, dropout=0.2, attention_dropout=0.1)
MODELS = {
    "rfa_doc-gate": ("rfa_doc", dict(SIZE, sentential_gate="decay")),
    "rfa_doc-nogate": ("rfa_doc", dict(SIZE, sentential_gate="none")),
    "marian": ("marian", SIZE),
}
SENTENCE_LEVEL = {"rfa_doc-gate": "rfa_doc-nogate", "rfa_doc-nogate": "rfa_doc-nogate", "marian": "marian"}
ROWS = ["rfa_doc-nogate@1", "marian@1", "rfa_doc-gate@4", "rfa_doc-nogate@4", "marian@4"]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", default="runs/doc_zh_en")
    parser.add_argument("--rows", nargs="+", default=ROWS, help="MODEL@WINDOW with MODEL in " + ", ".join(MODELS))
    tuning.add_arguments(parser, learning_rates=[5e-4, 1e-3, 2e-3], warmup_steps=[300, 1000], grid_steps=1500,
                         max_steps=20000, eval_every=300, patience=3, min_source_gain=0.1)
    parser.add_argument("--init_from_sentence_level", action="store_true",
                        help="rows of window > 1 start from their family's window-1 final model")
    parser.add_argument("--max_tokens", type=int, default=4096)
    parser.add_argument("--vocab_size", type=int, default=10000)
    parser.add_argument("--max_tokens_per_example", type=int, default=1000,
                        help="drop longer training windows (a dropped test window is an error)")
    parser.add_argument("--num_beams", type=int, default=1, help="beam size at test time (default: greedy)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--test_limit", type=int, default=0, help="score only the first N test windows (0: all)")
    parser.add_argument("--grid_test", action="store_true",
                        help="translate the test set at every grid point too (the grid chooses on the dev set, and "
                             "a model at the grid's budget may loop to the length limit on every test window)")
    args = parser.parse_args(argv)
    tuning.check_arguments(parser, args)
    for row in args.rows:
        name, _, window = row.partition("@")
        if name not in MODELS or not window.isdigit() or int(window) < 1:
            parser.error(f"row {row!r} must be MODEL@WINDOW with MODEL in {list(MODELS)} and WINDOW >= 1")
    return args


def ident(row):
    """"rfa_doc-gate@4" -> {"name": "rfa_doc-gate", "window": 4}"""
    name, _, window = row.partition("@")
    return {"name": name, "window": int(window)}


def prepare(out, window, vocab_size, max_tokens_per_example):
    """data_w<window>/ from the bundled corpus, prepared once (`prepare_once`; a folder prepared with other settings
    is refused); the tokenizer comes from data_w1 (trained there first)."""
    folder = out / f"data_w{window}"
    settings = {"window": window, "max_tokens_per_example": max_tokens_per_example}
    if window == 1:
        tokenizer = dict(vocab_size=vocab_size)
        settings["vocab_size"] = vocab_size
    elif (folder / SUMMARY_FILE).exists():
        tokenizer = {}
    else:
        tokenizer = dict(tokenizer=str(prepare(out, 1, vocab_size, max_tokens_per_example) / "tokenizer"))
    return prepare_once(folder, lambda: prepare_wiki_zh_en(folder, ("train", "dev", "zh2en-test"), window=window,
                                                           archive=WIKI_ZH_EN,
                                                           max_tokens_per_example=max_tokens_per_example,
                                                           keep_all_splits=("zh2en-test",), **tokenizer),
                        settings=settings)


def max_new_tokens(data_dir):
    """Room for the longest test reference of the sentence-level data (data_w1) and then some: a shorter limit would
    truncate hypotheses. Documents are translated a sentence at a time (the limit applies to each new sentence, the
    forced prefix not counted), so it is the same for every window."""
    return int(1.25 * max(len(labels) for labels in load_prepared(data_dir, "zh2en-test")["labels"])) + 8


def sentence_level_model(out, row):
    """The final model of the window-1 row `row` starts from (--init_from_sentence_level)."""
    folder = out / "final" / tuning.row_folder({"name": SENTENCE_LEVEL[row["name"]], "window": 1}) / "model"
    if not folder.exists():
        raise tuning.MissingRunError(f"{row['name']}@{row['window']} starts from {folder}, which does not exist: run "
                         f"{SENTENCE_LEVEL[row['name']]}@1 to its end first")
    return folder


GRID_COLUMNS = [
    ("model", lambda r: r["name"]),
    ("window", lambda r: str(r["window"])),
    ("learning rate", lambda r: f"{r['learning_rate']:g}"),
    ("warm-up", lambda r: str(r["warmup_steps"])),
    *RUN_COLUMNS,
    ("dev loss", lambda r: f"{r['valid_loss']:.3f}"),
    # the dev loss the right sources save over swapped ones: about 0 for an encoder that stopped reading its input
    ("dev source gain", lambda r: f"{r['valid_source_gain']:.2f}" if "valid_source_gain" in r else "-"),
    ("zh2en-test BLEU", lambda r: f"{r['test_bleu']:.2f}" if "test_bleu" in r else "-"),  # grid: --grid_test
    ("zh2en-test d-BLEU", lambda r: f"{r['test_d_bleu']:.2f}" if "test_d_bleu" in r else "-"),
]
COLUMNS = [
    *GRID_COLUMNS[:4],
    *RUN_COLUMNS,
    *tuning.STOP_COLUMNS,
    *GRID_COLUMNS[-4:],
    ("zh2en-test chrF", lambda r: f"{r['test_chrf']:.2f}" if "test_chrf" in r else "-"),
    # windows that dropped context sentences to fit the model's positions (Marian's 1,024; RFA-doc has no limit)
    ("test windows shortened", lambda r: str(r["test_context_shortened"]) if "test_context_shortened" in r else "-"),
]


def trainer(args, out, test=True):
    """train(ident, folder, learning_rate, warmup_steps, **loop) of every row; `test`: translate and score the test
    documents after training."""

    def train(row, folder, learning_rate, warmup_steps, **loop):
        data_dir = prepare(out, row["window"], args.vocab_size, args.max_tokens_per_example)
        sentences = prepare(out, 1, args.vocab_size, args.max_tokens_per_example)
        kind, overrides = MODELS[row["name"]]
        init = sentence_level_model(out, row) if args.init_from_sentence_level and row["window"] > 1 else None
        config = TrainConfig(output_dir=str(folder), max_tokens=args.max_tokens, learning_rate=learning_rate,
                             warmup_steps=warmup_steps, label_smoothing=0.1, bleu_sentences=0,
                             num_beams=args.num_beams, max_new_tokens=max_new_tokens(sentences), seed=args.seed, **loop)
        return train_run(data_dir, kind, config, overrides=overrides, valid_split="dev",
                         test_split="zh2en-test" if test else None,
                         document_level=row["window"] > 1, test_limit=args.test_limit, init_from=init)

    return train


def main(argv=None):
    args = parse_args(argv)
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = dict.fromkeys([*ROWS, *args.rows])  # the table's rows, and any other window asked for
    return tuning.run_and_tabulate(args, out, [ident(row) for row in args.rows], trainer(args, out),
                                   [ident(row) for row in rows], GRID_COLUMNS, COLUMNS,
                                   grid_train=trainer(args, out, test=args.grid_test))


if __name__ == "__main__":
    main()
