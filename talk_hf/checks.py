"""Argument checks shared by the ops (each raises ValueError/TypeError naming the offending argument), and their
accumulation dtype."""

import functools
import operator

import torch


def check_float_tensor(name, t, ndim):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not t.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(t.shape)}")


def check_same_device(name, t, ref_name, ref):
    if t.device != ref.device:
        raise ValueError(f"{name} is on {t.device} but {ref_name} is on {ref.device}")


def check_like(name, t, ref_name, ref, dims=None):
    """`t` must share device and dtype with `ref`, and the sizes of `dims` (pairs of (t_dim, ref_dim))."""
    check_same_device(name, t, ref_name, ref)
    if t.dtype != ref.dtype:
        raise TypeError(f"{name} has dtype {t.dtype} but {ref_name} has dtype {ref.dtype}")
    for td, rd in dims or ():
        if t.shape[td] != ref.shape[rd]:
            raise ValueError(
                f"{name} has shape {tuple(t.shape)}, which does not match {ref_name} {tuple(ref.shape)} "
                f"(dim {td} vs dim {rd})"
            )


def check_int(name, value, minimum=None):
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def check_size(name, value, minimum):
    """A size argument as torch takes one: an int, a numpy integer, a SymInt or a 0-d integer tensor, >= minimum."""
    try:
        index = None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        index = None
    if index is None:
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if index < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {index}")


def check_heads(channels_name, channels, heads_name, heads):
    if heads < 1 or channels % heads != 0:
        raise ValueError(f"{channels_name}={channels} must be divisible by {heads_name}={heads}")


def accumulation_dtype(*dtypes):
    """fp64 if any of the dtypes is fp64, else fp32: sums never accumulate in fp16/bf16."""
    return torch.float64 if torch.float64 in dtypes else torch.float32


def exact_products(fn):
    """Decorator: `fn(x, ...)` keeps its products in their operands' dtype (the accumulation dtype of the ops, as the
    compiled kernels compute them) inside an autocast region on x's device, where autocast would hand back bf16 or
    fp16 products; outside one it is called as it is (decoding steps call these functions per layer)."""

    @functools.wraps(fn)
    def run(x, *args, **kwargs):
        device = x.device.type
        if torch.amp.is_autocast_available(device) and torch.is_autocast_enabled(device):
            with torch.autocast(device, enabled=False):
                return fn(x, *args, **kwargs)
        return fn(x, *args, **kwargs)

    return run
