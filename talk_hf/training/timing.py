"""Timing for the benchmark scripts: the median of timed calls after warm-up, with CUDA events on a GPU."""

import statistics
import time

import torch


def median_seconds(fn, device, warmup=2, iters=20, budget_s=None):
    """Median seconds per call of fn() after `warmup` untimed calls; stops early once `budget_s` seconds are spent
    (after at least 3 timed calls). device: "cpu", "cuda" or a torch.device."""
    device_type = torch.device(device).type
    for _ in range(warmup):
        fn()
    times = []
    start = time.perf_counter()
    while len(times) < iters and (budget_s is None or len(times) < 3 or time.perf_counter() - start < budget_s):
        if device_type == "cuda":
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(begin.elapsed_time(end) / 1e3)
        else:
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
    return statistics.median(times)
