"""Timing for the benchmark scripts (the median of timed calls after warm-up, with CUDA events on a GPU), the one
format their result files share, and the range checks of their numeric options."""

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


def require_at_least(parser, args, minimum, *names):
    """Exit with a usage error (parser.error: exit status 2) naming the first option --<name> of `names` (argparse
    dests) whose value, or a value of its list (nargs), is below `minimum`; an option left at None passes."""
    for name in names:
        for value in option_values(args, name):
            if not value >= minimum:  # NaN too
                parser.error(f"--{name} must be >= {minimum}, got {value}")


def require_positive(parser, args, *names):
    """The same for options that must be > 0 (a scale, a time budget)."""
    for name in names:
        for value in option_values(args, name):
            if not value > 0:  # NaN too
                parser.error(f"--{name} must be > 0, got {value}")


def require_divisible(parser, args, name, divisor_name):
    """A usage error unless --<name> is a multiple of --<divisor_name> (channels split evenly over heads)."""
    value, divisor = getattr(args, name), getattr(args, divisor_name)
    if value % divisor:
        parser.error(f"--{name} must be divisible by --{divisor_name}, got {value} and {divisor}")


def option_values(args, name):
    """The values of option `name` in `args`: its items for a list (nargs), none for None, else the value alone."""
    value = getattr(args, name)
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]
