"""Argument checks shared by the ops (each raises ValueError/TypeError naming the offending argument), and their
accumulation dtype."""

import contextlib

import torch


def check_float_tensor(name, t, ndim):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not t.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(t.shape)}")


def check_like(name, t, ref_name, ref, dims=None):
    """`t` must share device and dtype with `ref`, and the sizes of `dims` (pairs of (t_dim, ref_dim))."""
    if t.device != ref.device:
        raise ValueError(f"{name} is on {t.device} but {ref_name} is on {ref.device}")
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


def check_heads(channels_name, channels, heads_name, heads):
    if heads < 1 or channels % heads != 0:
        raise ValueError(f"{channels_name}={channels} must be divisible by {heads_name}={heads}")


def accumulation_dtype(*dtypes):
    """fp64 if any of the dtypes is fp64, else fp32: sums never accumulate in fp16/bf16."""
    return torch.float64 if torch.float64 in dtypes else torch.float32


def exact_products(device):
    """A context in which autocast leaves the products on `device` in their operands' dtype (the accumulation dtype
    of the ops), as the compiled kernels compute them; autocast would hand back bf16 or fp16 products. Outside an
    autocast region, a context that does nothing (cheaper to enter: decoding steps call this per layer)."""
    if torch.amp.is_autocast_available(device.type) and torch.is_autocast_enabled(device.type):
        return torch.autocast(device.type, enabled=False)
    return contextlib.nullcontext()
