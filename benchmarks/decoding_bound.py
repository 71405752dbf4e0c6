#!/usr/bin/env python
"""The floor of a decoding step at the RFA paper's setting (benchmark_generation.py --rows paper), for RFA-doc and
Marian: what each model must compute and move per generated token, and the speed-up over Marian that this leaves
RFA-doc on the machine it runs on.

Per generated token the two decoders do the same weight multiply-adds (per layer the q, k, v and output projections
of self-attention, the query and output projections of cross-attention, the FFN; then the output layer), shared by
the batch. What differs is the decoding state each layer moves for each sequence (fp32):

  Marian   self-attention keys and values of the t tokens so far, read by attention and copied by the cache's
           append (`torch.cat`: read t, write t + 1): about 3 x 2 t d x 4 bytes; the cross-attention keys and values
           of the S source tokens, read: 2 S d x 4 bytes.
  RFA-doc  the causal state (H, 2 Dc, dh + 1), read and written in place: 2 x 4 H 2Dc (dh + 1) bytes; the source
           side of cross-attention, read: its keys and values, 4 S H (2 Dx + dh + 1) bytes, or for long sources its
           state, 4 H 2Dx (dh + 1) bytes (`rfa_cross_source` keeps the smaller); and it computes the random feature
           maps of its causal queries and keys and its cross-attention queries.

The machine is measured in this process: the weights' time of one step at batch B (Marian's decoder linear layers
and output layer on a (B, 1, d) input, in order), the memory bandwidth (an in-place add over 512 MB: every byte read
and written) and the feature maps of one step at batch B (the `rfa_feature_map` op, three calls per layer). The floor
of a token is

    weights / B  +  state bytes / bandwidth  (+ feature maps / B for RFA-doc)

and the bound on RFA-doc's speed-up is Marian's floor over RFA-doc's. It leaves out what both pay alike and what
neither needs (softmax, layer norms, generate()'s own work): a measured speed-up can come out above the bound when
Marian spends more than its floor.

    python benchmarks/decoding_bound.py --batch_scale 0.25 --windows 1 4 15 30 60 --output bound.json
Prints a markdown table; writes --output (JSON) when given.
"""

import argparse

import torch

from benchmark_generation import LONGER_BATCH, PAPER_BATCH, PAPER_SOURCE, PAPER_TARGET, models
from talk_hf.rfa import rfa_feature_map
from talk_hf.training.tables import markdown_table
from timing import environment, median_seconds, require_at_least, require_positive, save_results

FP32 = 4


def marian_state_bytes(window, d):
    """Bytes of decoding state a Marian decoder layer moves per sequence and token, averaged over the window's
    steps: (self-attention, cross-attention)."""
    steps, source = PAPER_TARGET * window, PAPER_SOURCE * window
    mean_cached = (steps + 1) / 2  # tokens in the self-attention cache, averaged over the steps
    return 3 * 2 * mean_cached * d * FP32, 2 * source * d * FP32


def rfa_state_bytes(window, heads, head_dim, causal_frequencies, cross_frequencies):
    """The same for an RFA-doc decoder layer: (causal state read and written, cross-attention source read)."""
    source = PAPER_SOURCE * window
    causal = 2 * FP32 * heads * 2 * causal_frequencies * (head_dim + 1)
    keys = FP32 * source * heads * (2 * cross_frequencies + head_dim + 1)
    state = FP32 * heads * 2 * cross_frequencies * (head_dim + 1)
    return causal, min(keys, state)


def decoder_linears(marian):
    """Marian's decoder linear layers in the order a step runs them, then the output layer."""
    linears = []
    for layer in marian.model.decoder.layers:
        attn, cross = layer.self_attn, layer.encoder_attn
        linears += [attn.q_proj, attn.k_proj, attn.v_proj, attn.out_proj, cross.q_proj, cross.out_proj,
                    layer.fc1, layer.fc2]
    return linears + [marian.lm_head]


@torch.no_grad()
def weights_seconds(marian, batch):
    """Seconds of one decoding step's weight products at `batch` sequences."""
    d = marian.config.d_model
    inputs = {n: torch.randn(batch, 1, n) for n in {d, marian.config.decoder_ffn_dim}}
    linears = decoder_linears(marian)
    return median_seconds(lambda: [linear(inputs[linear.in_features]) for linear in linears], "cpu", iters=10)


def bandwidth_bytes_per_s(megabytes=512):
    """Bytes per second of an in-place add over a buffer far larger than the caches (every byte read and written)."""
    buffer = torch.zeros(megabytes * 2**20 // FP32)
    return 2 * buffer.numel() * FP32 / median_seconds(lambda: buffer.add_(1.0), "cpu", iters=5)


@torch.no_grad()
def feature_seconds(rfa, batch):
    """Seconds of one step's feature maps at `batch` sequences: causal queries and keys, cross-attention queries,
    in every decoder layer."""
    config = rfa.config
    heads, head_dim = config.decoder_attention_heads, config.d_model // config.decoder_attention_heads
    x = torch.randn(batch, 1, heads, head_dim)
    calls = []
    for layer in rfa.model.decoder.layers:
        causal, cross = layer.mixer.features, layer.cross_attention.features
        calls += [(causal.projection, causal.tau), (causal.projection, causal.tau), (cross.projection, cross.tau)]
    return median_seconds(lambda: [rfa_feature_map(x, projection, tau) for projection, tau in calls], "cpu", iters=10)


def bound_row(window, batch, weights_s, bandwidth, features_s, config):
    heads = config.decoder_attention_heads
    head_dim, layers = config.d_model // heads, config.decoder_layers
    marian = marian_state_bytes(window, config.d_model)
    rfa = rfa_state_bytes(window, heads, head_dim, config.causal_num_frequencies, config.cross_num_frequencies)
    marian_s = weights_s / batch + layers * sum(marian) / bandwidth
    rfa_s = weights_s / batch + layers * sum(rfa) / bandwidth + features_s / batch
    return {"window": window, "batch": batch, "marian_self_kb": marian[0] / 1e3, "marian_cross_kb": marian[1] / 1e3,
            "rfa_causal_kb": rfa[0] / 1e3, "rfa_cross_kb": rfa[1] / 1e3, "weights_ms": weights_s * 1e3,
            "features_ms": features_s * 1e3, "marian_floor_tokens_per_s": 1 / marian_s,
            "rfa_floor_tokens_per_s": 1 / rfa_s, "speedup_bound": marian_s / rfa_s}


COLUMNS = [
    ("window L", lambda r: str(r["window"])),
    ("batch", lambda r: str(r["batch"])),
    ("state per layer, token and sequence: Marian self + cross / RFA-doc causal + cross (KB)",
     lambda r: f"{r['marian_self_kb']:.0f} + {r['marian_cross_kb']:.0f} / {r['rfa_causal_kb']:.0f} + "
               f"{r['rfa_cross_kb']:.0f}"),
    ("weights per step (ms)", lambda r: f"{r['weights_ms']:.1f}"),
    ("feature maps per step (ms)", lambda r: f"{r['features_ms']:.1f}"),
    ("floor tokens/s: RFA-doc / Marian",
     lambda r: f"{r['rfa_floor_tokens_per_s']:.0f} / {r['marian_floor_tokens_per_s']:.0f}"),
    ("speed-up bound", lambda r: f"{r['speedup_bound']:.2f}x"),
]


def table(rows, bandwidth):
    return (f"memory bandwidth (in-place add, read + write): {bandwidth / 1e9:.1f} GB/s\n\n"
            + markdown_table(rows, COLUMNS))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    windows = sorted({**PAPER_BATCH, **LONGER_BATCH})
    parser.add_argument("--windows", type=int, nargs="+", default=[1, 4, 15], choices=windows)
    parser.add_argument("--batch_scale", type=float, default=0.25, help="the paper's batch sizes times this")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--bandwidth_mb", type=int, default=512, help="buffer of the bandwidth measurement (MB)")
    parser.add_argument("--output", default=None, help="JSON path for the rows (none: the table only)")
    args = parser.parse_args(argv)
    require_at_least(parser, args, 1, "threads", "bandwidth_mb")
    require_positive(parser, args, "batch_scale")
    if args.threads:
        torch.set_num_threads(args.threads)
    rfa, marian = models("paper")
    bandwidth = bandwidth_bytes_per_s(args.bandwidth_mb)
    rows = []
    for window in args.windows:
        batch = max(1, round({**PAPER_BATCH, **LONGER_BATCH}[window] * args.batch_scale))
        rows.append(bound_row(window, batch, weights_seconds(marian, batch), bandwidth, feature_seconds(rfa, batch),
                              rfa.config))
    print(table(rows, bandwidth))
    if args.output:
        save_results(args.output, environment("cpu", args), rows)
    return rows


if __name__ == "__main__":
    main()
