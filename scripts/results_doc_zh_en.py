#!/usr/bin/env python
"""The document-level zh->en results (docs/benchmarks.md): RFA-doc with and without the sentential decay gate vs a
transformers Marian model of the same size, at windows of 1 sentence (sentence level) and 4 sentences (3 sentences of
context), on the bundled Wikipedia zh-en corpus (data/wiki_zh_en). Same data, same number of updates and tokens per
update, trained by the same loop. The test documents (zh2en-test) are translated whole, with the paper's sliding
windows and the model's own translations as the forced target context (window 1: sentence by sentence); the scores
are sacreBLEU over every sentence of every document and d-BLEU over whole documents.

    python scripts/results_doc_zh_en.py --output_dir runs/doc_zh_en --max_steps 120

At window 1 there is no separator inside an example, so the gate never fires: the gated and ungated models are the
same function and only the ungated one is trained. Writes <output_dir>/data_w<N>/ (preprocessed windows; the
tokenizer is trained once on the sentence-level train split and shared), <output_dir>/<row>/ runs, results.json
and results.md, printing the table at the end.
"""

import argparse
from pathlib import Path

from talk_hf.training.loop import TrainConfig
from talk_hf.training.prepare import SUMMARY_FILE, prepare_wiki_zh_en
from talk_hf.training.run import load_prepared, record_result, train_run
from talk_hf.training.tables import RUN_COLUMNS, markdown_table

SIZE = dict(d_model=256, encoder_layers=3, decoder_layers=3, encoder_ffn_dim=512, decoder_ffn_dim=512,
            encoder_attention_heads=4, decoder_attention_heads=4, dropout=0.2, attention_dropout=0.1)
MODELS = {
    "rfa_doc-gate": ("rfa_doc", dict(SIZE, sentential_gate="decay")),
    "rfa_doc-nogate": ("rfa_doc", dict(SIZE, sentential_gate="none")),
    "marian": ("marian", SIZE),
}
ROWS = ["rfa_doc-gate@4", "rfa_doc-nogate@4", "marian@4", "rfa_doc-nogate@1", "marian@1"]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", default="runs/doc_zh_en")
    parser.add_argument("--rows", nargs="+", default=ROWS, help="MODEL@WINDOW with MODEL in " + ", ".join(MODELS))
    parser.add_argument("--max_steps", type=int, default=120)
    parser.add_argument("--max_tokens", type=int, default=4096)
    parser.add_argument("--vocab_size", type=int, default=10000)
    parser.add_argument("--max_tokens_per_example", type=int, default=1000,
                        help="drop longer training windows (a dropped test window is an error)")
    parser.add_argument("--warmup_steps", type=int, default=30)
    parser.add_argument("--num_beams", type=int, default=1, help="beam size at test time (default: greedy)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--test_limit", type=int, default=0, help="score only the first N test windows (0: all)")
    parser.add_argument("--resume", action="store_true",
                        help="continue each row from its last checkpoint (rows without one start afresh)")
    args = parser.parse_args(argv)
    for row in args.rows:
        name, _, window = row.partition("@")
        if name not in MODELS or not window.isdigit() or int(window) < 1:
            parser.error(f"row {row!r} must be MODEL@WINDOW with MODEL in {list(MODELS)} and WINDOW >= 1")
    return args


def prepare(out, window, vocab_size, max_tokens_per_example):
    """data_w<window>/ from the bundled corpus; the tokenizer comes from data_w1 (trained there first)."""
    folder = out / f"data_w{window}"
    if (folder / SUMMARY_FILE).exists():
        return folder
    if window == 1:
        tokenizer = dict(vocab_size=vocab_size)
    else:
        tokenizer = dict(tokenizer=str(prepare(out, 1, vocab_size, max_tokens_per_example) / "tokenizer"))
    prepare_wiki_zh_en(folder, ("train", "dev", "zh2en-test"), window=window,
                       max_tokens_per_example=max_tokens_per_example, keep_all_splits=("zh2en-test",), **tokenizer)
    return folder


def max_new_tokens(data_dir):
    """Room for the longest test reference (window) and then some: a shorter limit would truncate hypotheses."""
    return int(1.25 * max(len(labels) for labels in load_prepared(data_dir, "zh2en-test")["labels"])) + 8


COLUMNS = [
    ("model", lambda r: r["name"]),
    ("window", lambda r: str(r["window"])),
    *RUN_COLUMNS,
    ("valid loss", lambda r: f"{r['valid_loss']:.3f}"),
    ("zh2en-test BLEU", lambda r: f"{r['test_bleu']:.2f}"),
    ("zh2en-test d-BLEU", lambda r: f"{r['test_d_bleu']:.2f}" if "test_d_bleu" in r else "-"),
]


def main(argv=None):
    args = parse_args(argv)
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for row in args.rows:
        name, _, window = row.partition("@")
        window = int(window)
        data_dir = prepare(out, window, args.vocab_size, args.max_tokens_per_example)
        kind, overrides = MODELS[name]
        run_dir = out / f"{name}-w{window}"
        config = TrainConfig(
            output_dir=str(run_dir), max_tokens=args.max_tokens, max_steps=args.max_steps,
            learning_rate=1e-3, warmup_steps=min(args.warmup_steps, args.max_steps), label_smoothing=0.1,
            save_every=max(args.max_steps // 6, 1), keep_checkpoints=3, average_last=3, bleu_sentences=0,
            num_beams=args.num_beams, max_new_tokens=max_new_tokens(data_dir), seed=args.seed,
            resume=args.resume and any((run_dir / "checkpoints").glob("step-*")),
        )
        result = train_run(data_dir, kind, config, overrides=overrides, valid_split="dev", test_split="zh2en-test",
                           document_level=window > 1, test_limit=args.test_limit)
        result.update(name=name, window=window)
        results = record_result(out / "results.json", result, ("name", "window"))
    table = markdown_table(results, COLUMNS)
    (out / "results.md").write_text(table + "\n")
    print(table)
    return results


if __name__ == "__main__":
    main()
