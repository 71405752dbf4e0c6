#!/usr/bin/env python
"""Benchmark the token mixers against their baselines, in one process (ratios, not absolute claims).

For each sequence length: TaLK (compiled), TaLK reference, DynamicConv k=3 and k=31 (compiled; k=31 also from logits:
softmax fused into the op, and the unfused fp32 softmax + cast + op that it replaces; and in training, with
DropConnect 0.1 drawn inside the op, against softmax + cast + F.dropout + op), causal RFA with a
decay gate (compiled, and its pure-PyTorch chunked form; F = 64 random features per head, values from x; on CUDA in
fp32 also the chunked kernels' tensor-core (TF32) products, which `rfa_causal` does not choose, against its exact
fp32 products), and
torch.nn.functional.scaled_dot_product_attention, forward and forward+backward (in which every input that has a
gradient in training requires one: x, TaLK's offsets, DynamicConv's weights, RFA's q/k features and decay, so that
each op and its baseline do the same backward work; the gradients returned by torch.autograd.grad, none added into
an earlier call's .grad); plus two copies of the input, the memory floor of a one-pass
op: `x.clone()` (allocates its output, as every op here does; on CPU a large fresh allocation pays its page faults)
and `out.copy_(x)` into a buffer allocated once (the bandwidth floor alone). Median of timed iterations after warm-up
(CUDA events on GPU).

    python benchmarks/benchmark_ops.py --device cpu --batch 4 --channels 512 --heads 8 --lengths 256 1024 4096
    # CPU, steady-state allocations (freed memory stays mapped, as in a training loop: no first-touch page faults)
    GLIBC_TUNABLES=glibc.malloc.mmap_threshold=4294967295:glibc.malloc.trim_threshold=4294967295 \
        python benchmarks/benchmark_ops.py --device cpu ...
    python benchmarks/benchmark_ops.py --device cuda --batch 10 --channels 1024 --heads 16 --lengths 10 100 1000 10000 \
        --dtype bfloat16
Writes --output (JSON) and prints a markdown table.
"""

import argparse
import json
import statistics

import torch
import torch.nn.functional as F

from talk_hf import _kernels, ops
from talk_hf.backend import needs_grad
from talk_hf.rfa import DEFAULT_EPS
from talk_hf.training.plot import pyplot, save_figure
from talk_hf.training.tables import markdown_table
from timing import environment, median_seconds, require_at_least, require_divisible, require_positive, save_results


def interleaved_ratio(fn, baseline, device, pairs):
    """Median over `pairs` of (time of fn / time of baseline), one call each, alternating: slow drifts of the
    machine (other tenants, clock changes) cancel in each pair."""
    ratios = [median_seconds(fn, device, 0, 1) / median_seconds(baseline, device, 0, 1) for _ in range(pairs)]
    return statistics.median(ratios)


def cases(x, heads, max_offset, leaves=None):
    """name -> callable() returning the output of one forward.

    With x.requires_grad (the forward+backward cases) every input that has a gradient in training requires one too,
    so that each op and its baseline do the same backward work: TaLK's offsets, DynamicConv's weights (or logits),
    RFA's q/k features and decay gate (the compiled kernel's backward computes them all whatever is asked), and SDPA's
    q, k, v (views of x). Without it (the forward-only cases) no input does. `leaves`: a list that receives each fresh
    leaf that requires a gradient, in the order they are made."""
    B, T, C = x.shape
    grad = x.requires_grad

    def leaf(t):  # a fresh leaf that requires a gradient in the fwd+bwd cases (a dense copy of an expanded view)
        if not grad:
            return t
        t = t.detach().clone().requires_grad_()
        if leaves is not None:
            leaves.append(t)
        return t

    g = torch.Generator(device="cpu").manual_seed(0)
    ol = leaf(torch.rand(B, T, heads, generator=g).to(x))
    orr = leaf(torch.rand(B, T, heads, generator=g).to(x))
    w3 = leaf(torch.rand(B, T, heads, 3, generator=g).softmax(-1).to(x))
    w31 = leaf(torch.rand(B, T, heads, 31, generator=g).softmax(-1).to(x))
    l31 = leaf(torch.randn(B, T, heads, 31, generator=g).to(x))  # kernel logits

    def qkv():
        return x.view(B, T, heads, C // heads).transpose(1, 2)

    proj = ops.rfa_random_projection(heads, 32, C // heads, generator=g).to(x.device)
    # q and k features (one tensor for both; with grad, autograd and the kernel compute both gradients), and the
    # (B, T, H) decay of the gate: in training they come from the q/k projections and the gate projection
    phi = leaf(ops.rfa_feature_map(torch.randn(B, T, heads, C // heads, generator=g).to(x.device), proj))
    decay = leaf(torch.where(torch.rand(B, T, 1, generator=g) < 0.05, 0.9, 1.0).expand(B, T, heads).to(phi))

    fns = {
        "talk": lambda: ops.talk_conv(x, ol, orr, max_offset, max_offset),
        "talk_ref": lambda: ops.talk_conv_ref(x, ol, orr, max_offset, max_offset),
        "dynamic_conv_k3": lambda: ops.dynamic_conv(x, w3, 1),
        "dynamic_conv_k31": lambda: ops.dynamic_conv(x, w31, 15),
        "dynamic_conv_k31_fused_softmax": lambda: ops.dynamic_conv(x, l31, 15, softmax=True),
        "dynamic_conv_k31_unfused_softmax": lambda: ops.dynamic_conv(x, l31.float().softmax(-1).to(x.dtype), 15),
        "dynamic_conv_k31_dropconnect": lambda: ops.dynamic_conv(x, l31, 15, softmax=True, weight_dropout=0.1),
        "dynamic_conv_k31_unfused_dropconnect": lambda: ops.dynamic_conv(
            x, F.dropout(l31.float().softmax(-1).to(x.dtype), 0.1, training=True), 15),
        "rfa": lambda: ops.rfa_causal_compiled(phi, phi, x.view(B, T, heads, C // heads), decay)[0],
        "rfa_chunked": lambda: ops.rfa_causal_chunked(phi, phi, x.view(B, T, heads, C // heads), decay)[0],
        "sdpa": lambda: F.scaled_dot_product_attention(qkv(), qkv(), qkv()),
    }
    if x.is_cuda and x.dtype == torch.float32:  # the chunked kernels' tensor-core products, asked of the op itself
        v = x.view(B, T, heads, C // heads)
        # the op saves a state every 64 steps for a backward (rfa_causal's default chunk), none without one
        fns["rfa_tf32"] = lambda: _kernels.rfa_causal(
            phi, phi, v, decay, None, DEFAULT_EPS, 64 if needs_grad(phi, v) else 0, True)[0]
    return fns


def fwd_bwd_cases(x, heads, max_offset):
    """name -> callable() running one forward + backward of `cases` on a copy of x that requires a gradient, and
    returning the gradients of x and of every fresh leaf (None for a leaf the op does not read). torch.autograd.grad
    hands them back without storing them in .grad: each call computes them afresh, as a training step's backward
    after its gradients are set to None does, and adds nothing into an earlier call's."""
    xg = x.detach().requires_grad_()
    leaves = [xg]
    return {name: forward_backward(fn, leaves) for name, fn in cases(xg, heads, max_offset, leaves).items()}


def forward_backward(fn, leaves):
    """callable() running fn() and the backward of its output (a gradient of ones) to `leaves`: their gradients."""
    def run():
        out = fn()
        return torch.autograd.grad(out, leaves, torch.ones_like(out), allow_unused=True)
    return run


def measure(args, T):
    device, dtype = args.device, getattr(torch, args.dtype)
    x = torch.randn(args.batch, T, args.channels, device=device, dtype=dtype)
    row = {"n": T, "copy_ms": 1e3 * median_seconds(lambda: x.clone(), device, args.warmup, args.iters, args.budget)}
    buffer = torch.empty_like(x)
    row["copy_into_ms"] = 1e3 * median_seconds(lambda: buffer.copy_(x), device, args.warmup, args.iters, args.budget)
    with_grad = fwd_bwd_cases(x, args.heads, args.max_offset)  # inputs built once, outside the timed calls
    forward = cases(x, args.heads, args.max_offset)
    for name, fn in forward.items():
        if name == "sdpa" and T > args.max_sdpa_length:
            continue
        row[f"{name}_fwd_ms"] = 1e3 * median_seconds(fn, device, args.warmup, args.iters, args.budget)
        if torch.device(device).type == "cuda":  # memory the forward allocates beyond its inputs, at its peak
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            fn()
            row[f"{name}_fwd_peak_MB"] = (torch.cuda.max_memory_allocated() - before) / 2**20
        row[f"{name}_fwdbwd_ms"] = 1e3 * median_seconds(with_grad[name], device, 1, args.iters, args.budget)
    bytes_moved = 2 * x.numel() * x.element_size()  # read + write
    row["copy_GBps"] = bytes_moved / row["copy_into_ms"] / 1e6
    row["talk_vs_copy"] = row["talk_fwd_ms"] / row["copy_ms"]
    row["talk_vs_copy_into"] = row["talk_fwd_ms"] / row["copy_into_ms"]
    row["talk_vs_copy_interleaved"] = interleaved_ratio(forward["talk"], lambda: x.clone(), device, 2 * args.iters)
    row["talk_vs_copy_into_interleaved"] = interleaved_ratio(forward["talk"], lambda: buffer.copy_(x), device,
                                                             2 * args.iters)
    row["talk_fraction_of_copy_bandwidth"] = row["copy_into_ms"] / row["talk_fwd_ms"]
    if "sdpa_fwd_ms" in row:
        row["sdpa_over_talk"] = row["sdpa_fwd_ms"] / row["talk_fwd_ms"]
    row["dynamic_conv_k31_over_talk"] = row["dynamic_conv_k31_fwd_ms"] / row["talk_fwd_ms"]
    for mode in ("fwd", "fwdbwd"):
        row[f"softmax_unfused_over_fused_{mode}"] = (row[f"dynamic_conv_k31_unfused_softmax_{mode}_ms"]
                                                     / row[f"dynamic_conv_k31_fused_softmax_{mode}_ms"])
        row[f"dropconnect_unfused_over_fused_{mode}"] = (row[f"dynamic_conv_k31_unfused_dropconnect_{mode}_ms"]
                                                         / row[f"dynamic_conv_k31_dropconnect_{mode}_ms"])
    row["ref_over_talk"] = row["talk_ref_fwd_ms"] / row["talk_fwd_ms"]
    row["rfa_chunked_over_rfa"] = row["rfa_chunked_fwd_ms"] / row["rfa_fwd_ms"]
    if "rfa_tf32_fwd_ms" in row:
        for mode in ("fwd", "fwdbwd"):
            row[f"rfa_exact_over_tf32_{mode}"] = row[f"rfa_{mode}_ms"] / row[f"rfa_tf32_{mode}_ms"]
    return row


def table(rows):
    cols = ["n", "copy_ms", "copy_into_ms", "talk_fwd_ms", "talk_ref_fwd_ms", "dynamic_conv_k3_fwd_ms",
            "dynamic_conv_k31_fwd_ms",
            "rfa_fwd_ms", "rfa_chunked_fwd_ms", "sdpa_fwd_ms", "talk_fwdbwd_ms", "rfa_fwdbwd_ms",
            "rfa_chunked_fwdbwd_ms", "sdpa_fwdbwd_ms", "talk_vs_copy", "talk_vs_copy_into", "talk_vs_copy_interleaved",
            "talk_vs_copy_into_interleaved", "sdpa_over_talk", "softmax_unfused_over_fused_fwd",
            "softmax_unfused_over_fused_fwdbwd", "dropconnect_unfused_over_fused_fwd",
            "dropconnect_unfused_over_fused_fwdbwd", "rfa_exact_over_tf32_fwd", "rfa_exact_over_tf32_fwdbwd"]
    return markdown_table(rows, [(c, lambda r, c=c: f"{r[c]:.3g}" if isinstance(r.get(c), float) else
                                  str(r.get(c, "-")))
                                 for c in cols])


def plot(rows, path):
    """Forward milliseconds against n (log-log): TaLK, its reference, DynamicConv k=31, RFA, SDPA, a copy of x."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key, label in [("talk_fwd_ms", "TaLK (compiled)"), ("talk_ref_fwd_ms", "TaLK reference"),
                       ("dynamic_conv_k31_fwd_ms", "DynamicConv k=31"), ("rfa_fwd_ms", "causal RFA (kernel)"),
                       ("sdpa_fwd_ms", "SDPA"), ("copy_ms", "copy of x")]:
        points = [(r["n"], r[key]) for r in rows if key in r]
        if points:
            ax.plot(*zip(*points), "o-", label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("sequence length n")
    ax.set_ylabel("forward time (ms)")
    ax.legend()
    save_figure(fig, path)


def check_options(parser, args):
    """A usage error (exit status 2) for a size, count or time option out of range, before anything is measured."""
    require_at_least(parser, args, 1, "batch", "channels", "heads", "lengths", "iters")
    require_at_least(parser, args, 0, "max_offset", "max_sdpa_length", "warmup")
    require_positive(parser, args, "budget")
    require_divisible(parser, args, "channels", "heads")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--channels", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--max_offset", type=int, default=31, help="TaLK max_left = max_right")
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 1024, 4096])
    parser.add_argument("--max_sdpa_length", type=int, default=16384)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--budget", type=float, default=5.0, help="seconds of timing per measurement at most")
    parser.add_argument("--output", default=None)
    parser.add_argument("--plot", default=None, help="PNG path for a plot of the rows")
    args = parser.parse_args(argv)
    check_options(parser, args)
    if ops.backend(args.device) != "compiled":
        raise SystemExit(f"no compiled kernels for {args.device}: build the extension first")
    env = environment(args.device, args)
    rows = [measure(args, T) for T in args.lengths]
    print(json.dumps(env))
    print(table(rows))
    if args.plot:
        plot(rows, args.plot)
    if args.output:
        save_results(args.output, env, rows)
    return rows


if __name__ == "__main__":
    main()
