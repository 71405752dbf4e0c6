#!/usr/bin/env python
"""Where the time of RFA-doc's and Marian's generate() goes at one window of the RFA paper's decoding setting
(`benchmark_generation.py --rows paper`: 6+6 layers, d_model 512, 20 source and 23 new tokens per sentence, greedy,
random weights): each model's wall-clock for one generate() call, then torch.profiler's self CPU time per op for
another call, the ops listed by how much more (or less) time one model spends in them than the other.

    python benchmarks/profile_decoding.py --window 1 --batch 256 --top 20

Ops both models run equally (the linear layers, the output layer, the logits processors, the encoder's attention)
cancel in the difference; what remains is each model's own work: RFA-doc's feature maps, causal state steps and
cross-attention reads against Marian's key/value concatenation and attention. Writes --output (JSON) when given.
"""

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from benchmark_generation import PAPER_SOURCE, PAPER_TARGET, models, source
from timing import environment, require_at_least, save_results


def op_times(model, inputs):
    """(wall-clock seconds of one generate() call, {op: (self CPU ms, calls)} of the next, profiled)."""
    with torch.no_grad():
        model.generate(**inputs)  # warm-up
        start = time.perf_counter()
        model.generate(**inputs)
        seconds = time.perf_counter() - start
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            model.generate(**inputs)
    return seconds, {e.key: (e.self_cpu_time_total / 1e3, e.count) for e in prof.key_averages()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--window", type=int, default=1, help="sentences L per window")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--num_beams", type=int, default=1)
    parser.add_argument("--top", type=int, default=20, help="ops listed")
    parser.add_argument("--output", default=None)
    args = parser.parse_args(argv)
    require_at_least(parser, args, 1, "window", "batch", "num_beams", "top")
    rfa, marian = models("paper")
    new_tokens = PAPER_TARGET * args.window
    inputs = dict(source(args.batch, PAPER_SOURCE * args.window, torch.device("cpu"), torch.Generator().manual_seed(0)),
                  min_new_tokens=new_tokens, max_new_tokens=new_tokens, do_sample=False, num_beams=args.num_beams)
    results = {}
    for name, model in (("rfa_doc", rfa), ("marian", marian)):
        seconds, ops = op_times(model, inputs)
        results[name] = {"seconds": seconds, "tokens_per_s": args.batch * new_tokens / seconds, "ops": ops}
        print(f"{name}: {seconds:.2f} s, {results[name]['tokens_per_s']:.0f} tokens/s; profiled self CPU "
              f"{sum(ms for ms, _ in ops.values()) / 1e3:.2f} s", flush=True)
    a, b = results["rfa_doc"]["ops"], results["marian"]["ops"]
    none = (0.0, 0)
    print("\n| op | RFA-doc ms (calls) | Marian ms (calls) | difference ms |\n|---|---|---|---|")
    for op in sorted(a.keys() | b.keys(), key=lambda k: -abs(a.get(k, none)[0] - b.get(k, none)[0]))[:args.top]:
        (ta, na), (tb, nb) = a.get(op, none), b.get(op, none)
        print(f"| `{op}` | {ta:.0f} ({na}) | {tb:.0f} ({nb}) | {ta - tb:+.0f} |")
    if args.output:
        save_results(args.output, environment("cpu", args), [{"model": name, **r} for name, r in results.items()])


if __name__ == "__main__":
    main()
