#!/usr/bin/env python
"""Where the time of each op goes, kernel by kernel (torch.profiler), at one shape of benchmark_ops.py.

    python benchmarks/profile_kernels.py --device cuda --dtype float32 --batch 10 --channels 1024 --heads 16 \
        --length 10000

For each op of benchmark_ops.cases (forward, then forward + backward), runs a few warm-up calls and `--iters` profiled
calls, and prints the device time per call of every kernel that took at least 1% of the op's total: which launch of
a multi-kernel op (TaLK's backward runs three) is the one to work on.
"""

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from benchmark_ops import cases, fwd_bwd_cases
from timing import require_at_least, require_divisible


def device_time_us(event):
    return getattr(event, "device_time_total", None) or getattr(event, "cuda_time_total", 0)


def profile_op(fn, iters):
    """[(kernel name, microseconds per call)], largest first."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    kernels = [(e.key, device_time_us(e) / iters) for e in prof.key_averages() if device_time_us(e) > 0]
    return sorted(kernels, key=lambda k: -k[1])


def report(name, kernels):
    total = sum(us for _, us in kernels)
    print(f"{name}: {total / 1e3:.3f} ms per call")
    for kernel, us in kernels:
        if us >= 0.01 * total:
            print(f"    {us / 1e3:8.3f} ms  {100 * us / total:5.1f}%  {kernel[:110]}")


def parse_args(argv=None):
    """The command line; a usage error (exit status 2) for a size or count out of range, before any work."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", choices=["cuda"])
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--batch", type=int, default=10)
    p.add_argument("--channels", type=int, default=1024)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--length", type=int, default=10_000)
    p.add_argument("--max_offset", type=int, default=31)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--ops", nargs="*", default=["talk", "dynamic_conv_k31", "dynamic_conv_k31_fused_softmax", "rfa"])
    args = p.parse_args(argv)
    require_at_least(p, args, 1, "batch", "channels", "heads", "length", "iters")
    require_at_least(p, args, 0, "max_offset")
    require_divisible(p, args, "channels", "heads")
    return args


def profiled_calls(args, x):
    """[(label, callable)] of each op of --ops on x: its forward, then its forward + backward (benchmark_ops'
    fwd_bwd_cases: the gradients returned, none added into an earlier call's .grad)."""
    forward = cases(x, args.heads, args.max_offset)
    unknown = [name for name in args.ops if name not in forward]
    if unknown:
        raise SystemExit(f"unknown op {unknown[0]!r}: one of {', '.join(forward)}")
    with_grad = fwd_bwd_cases(x, args.heads, args.max_offset)
    calls = []
    for name in args.ops:
        calls += [(f"{name} forward", forward[name]), (f"{name} forward+backward", with_grad[name])]
    return calls


def main(argv=None):
    args = parse_args(argv)
    x = torch.randn(args.batch, args.length, args.channels, device=args.device, dtype=getattr(torch, args.dtype))
    calls = profiled_calls(args, x)
    print(f"B={args.batch} T={args.length} C={args.channels} H={args.heads} {args.dtype} "
          f"({torch.cuda.get_device_name()})")
    for label, fn in calls:
        report(label, profile_op(fn, args.iters))


if __name__ == "__main__":
    main()
