"""Timing for the benchmark scripts (the median of timed calls after warm-up, with CUDA events on a GPU) and the
one format their result files share."""

import json
import os
import statistics
import time

import torch

from talk_hf.environment import device_description


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


def environment(device, args):
    """What a benchmark ran on: the device (GPU name, or CPU and its threads), torch, the allocator setting
    (GLIBC_TUNABLES) and the script's arguments (an argparse namespace)."""
    return {"device": device_description(device), "torch": torch.__version__,
            "glibc_tunables": os.environ.get("GLIBC_TUNABLES"), "args": vars(args)}


def save_results(path, env, rows):
    """Write {"environment": env, "rows": rows} as JSON to `path`."""
    with open(path, "w") as f:
        json.dump({"environment": env, "rows": rows}, f, indent=2)
