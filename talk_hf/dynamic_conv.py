"""LightConv / DynamicConv (Wu et al., ICLR 2019): depthwise convolutions with softmax-normalised kernels.

Layout is batch-first and channels-last. Head h owns the contiguous channels [h*C/H, (h+1)*C/H)
(docs/spec.md §B.1). With P = padding_left,

    out[b, t, c] = sum_k weight[b, t, h(c), k] * x[b, t + k - P, c]      (x = 0 outside [0, T))

DynamicConv predicts `weight` per position; LightConv uses one (H, K) kernel everywhere. The kernel is normalised
by a softmax over all K taps: by the caller, or, with `softmax=True`, by the op itself from the logits (the compiled
kernels then never write the probabilities; they stay in the accumulation type). Taps that fall outside the sequence
read zeros, which is "softmax over K, then truncate at the sequence start" (docs/spec.md §B.1). Causal decoders use
P = K - 1, encoders P = K // 2. Any K and any P are supported.

DropConnect (`weight_dropout=p`, training) drops each normalised tap with probability p and scales the kept ones by
1 / (1 - p), as dropout does. The mask is a function of a seed (`dropconnect_keep`), so the compiled kernels draw it
inside the op, in the forward and again in the backward, and store none.
"""

import math

import torch

from .backend import _kernels, forward_mode, needs_grad, use_kernels
from .checks import (
    accumulation_dtype,
    check_float_tensor,
    check_heads,
    check_int,
    check_like,
    check_same_device,
    check_size,
    exact_products,
)


def _check_conv_args(x, weight, padding_left, softmax=False, weight_dropout=0.0, seed=None):
    check_float_tensor("x", x, 3)
    if not isinstance(weight, torch.Tensor) or weight.dim() not in (2, 4):
        shape = tuple(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__
        raise ValueError(f"weight must be (B, T, H, K) (DynamicConv) or (H, K) (LightConv), got {shape}")
    check_float_tensor("weight", weight, weight.dim())
    dims = [(0, 0), (1, 1)] if weight.dim() == 4 else []
    check_like("weight", weight, "x", x, dims=dims)
    check_heads("channels (x.shape[-1])", x.shape[-1], "heads (weight.shape[-2])", weight.shape[-2])
    if weight.shape[-1] < 1:
        raise ValueError("weight must have at least one tap (K >= 1)")
    check_int("padding_left", padding_left)
    if not isinstance(softmax, bool):
        raise ValueError(f"softmax must be a bool, got {softmax!r}")
    _check_dropconnect(weight_dropout, seed, x)


def _check_dropconnect(p, seed, x):
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p <= 1:
        raise ValueError(f"weight_dropout must be a probability in [0, 1], got {p!r}")
    if seed is None:
        return
    if not isinstance(seed, torch.Tensor) or seed.dtype != torch.int64 or seed.numel() != 1:
        shape = (seed.dtype, tuple(seed.shape)) if isinstance(seed, torch.Tensor) else type(seed).__name__
        raise ValueError(f"seed must be a one-element int64 tensor, got {shape}")
    if seed.device != x.device:
        raise ValueError(f"seed is on {seed.device} but x is on {x.device}")


def draw_seed(device=None, generator=None):
    """A DropConnect seed: a 0-dim int64 tensor in [0, 2^63) on `device`, drawn from torch's generator of that device
    (so `torch.manual_seed` makes the masks reproducible), without a host synchronisation. A draw from
    [-2^63, 0) with its sign bit cleared: the value and generator state of `Tensor.random_()` (eagerly), by an op that
    torch.compile traces (under inductor, whose random numbers are its own, the value differs)."""
    low = -(1 << 63)
    return torch.randint(low, 0, (), dtype=torch.int64, device=device, generator=generator) & ~low


# splitmix64 (csrc/dropconnect.h) in int64 PyTorch ops: products wrap modulo 2^64, and a logical right shift is an
# arithmetic one with the sign bits masked off.
def _int64(v):
    return v - (1 << 64) if v >= 1 << 63 else v


_GAMMA, _MIX1, _MIX2 = _int64(0x9E3779B97F4A7C15), _int64(0xBF58476D1CE4E5B9), _int64(0x94D049BB133111EB)


def _shift_right(z, bits):
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def dropconnect_keep(seed, shape, p):
    """Which taps DropConnect keeps: a bool tensor of `shape` ((B, T, H, K), or one (H, K) LightConv kernel, whose
    mask every position shares), on seed's device. Tap n (flat index in `shape`) is kept when the top 24 bits of
    splitmix64's n-th output from state `seed` are below ceil((1 - p) * 2^24): probability 1 - p within 2^-24.

    seed: one-element int64 tensor; p: drop probability in [0, 1].
    """
    numel = math.prod(shape)
    n = torch.arange(1, numel + 1, dtype=torch.int64, device=seed.device)
    z = seed.reshape(()) + n * _GAMMA
    z = (z ^ _shift_right(z, 30)) * _MIX1
    z = (z ^ _shift_right(z, 27)) * _MIX2
    z = z ^ _shift_right(z, 31)
    return (_shift_right(z, 40) < math.ceil((1 - p) * 2**24)).view(shape)


def _dropconnect_factors(seed, shape, p, dtype):
    """DropConnect's factor per tap: 1 / (1 - p) where kept, else 0 (0 everywhere for p = 1)."""
    scale = 1 / (1 - p) if p < 1 else 0.0
    return dropconnect_keep(seed, shape, p).to(dtype) * scale


def _expand_weight(weight, x):
    """(H, K) LightConv kernels broadcast to the DynamicConv layout (B, T, H, K) without copying, with strides 0 over
    B and T: the kernels read such a weight as its one (H, K) kernel, with one DropConnect mask (csrc/checks.h
    conv_weight). expand() keeps the stride of a dimension of size 1, so one row or one position (a decoding step)
    takes an as_strided view."""
    if weight.dim() != 2:
        return weight
    shape = (x.shape[0], x.shape[1], *weight.shape)
    if x.shape[0] > 1 and x.shape[1] > 1:
        return weight.expand(shape)
    return weight.contiguous().as_strided(shape, (0, 0, weight.shape[1], 1))


def dynamic_conv_ref(x, weight, padding_left, softmax=False, weight_dropout=0.0, seed=None):
    """Pure-PyTorch dynamic/lightweight convolution (the specification and the fallback).

    x: (B, T, C); weight: (B, T, H, K) or (H, K), normalised, or logits with softmax=True (softmax over K in the
    accumulation dtype); padding_left: int; weight_dropout: DropConnect probability, with the mask of `seed`
    (`dropconnect_keep`; drawn by `draw_seed` when None) -> out: (B, T, C).
    """
    _check_conv_args(x, weight, padding_left, softmax, weight_dropout, seed)
    return _dynamic_conv_ref(x, weight, padding_left, softmax, weight_dropout, _seed(seed, weight_dropout, x))


def _seed(seed, weight_dropout, x):
    return draw_seed(x.device) if seed is None and weight_dropout > 0 else seed


def _taps(weight, x, softmax, weight_dropout=0.0, seed=None):
    """The kernel taps in the accumulation dtype: weight itself or its softmax over K, times DropConnect's
    factors."""
    acc = accumulation_dtype(x.dtype)
    w = weight.to(acc)
    w = w.softmax(-1) if softmax else w
    return w * _dropconnect_factors(seed, weight.shape, weight_dropout, acc) if weight_dropout > 0 else w


def _window_padding(T, K, padding_left):
    """Zeros to add in front of and behind T positions so that tap k of position t reads padded index
    t + k + (front - P), always in range, and so that the padded sequence holds at least one window of K taps
    (for T = 0 too). -> (front, back)."""
    front = max(padding_left, 0)
    return front, max(K - 1 - padding_left, K - T - front, 0)


@exact_products
def _dynamic_conv_ref(x, weight, padding_left, softmax=False, weight_dropout=0.0, seed=None):
    B, T, C = x.shape
    H, K = weight.shape[-2:]
    acc = accumulation_dtype(x.dtype)
    w = _expand_weight(_taps(weight, x, softmax, weight_dropout, seed), x)
    pad_front, pad_back = _window_padding(T, K, padding_left)
    xp = torch.nn.functional.pad(x.to(acc), (0, 0, pad_front, pad_back))
    start = pad_front - padding_left
    windows = xp.unfold(1, K, 1)[:, start : start + T]  # (B, T, C, K)
    out = torch.einsum("bthrk,bthk->bthr", windows.reshape(B, T, H, C // H, K), w)
    return out.reshape(B, T, C).to(x.dtype)


def dynamic_conv(x, weight, padding_left, softmax=False, weight_dropout=0.0, seed=None):
    """Dynamic (weight (B, T, H, K)) or lightweight (weight (H, K)) convolution; compiled kernel when built for
    x's device, else `dynamic_conv_ref`. softmax=True: weight holds logits, normalised over K inside the op.
    weight_dropout: DropConnect probability on the normalised taps (pass it only in training), its mask given by
    `seed` (a one-element int64 tensor on x's device; None: `draw_seed`) and of weight's shape: a mask per position
    for a (B, T, H, K) weight, an expanded view of one kernel included, one mask for an (H, K) kernel.
    x: (B, T, C) -> (B, T, C).
    Differentiable w.r.t. x and weight."""
    _check_conv_args(x, weight, padding_left, softmax, weight_dropout, seed)
    seed = _seed(seed, weight_dropout, x)
    if not use_kernels(x) or forward_mode(x, weight):
        return _dynamic_conv_ref(x, weight, padding_left, softmax, weight_dropout, seed)
    if weight_dropout > 0 and _is_expanded_kernel(weight):
        weight = weight.contiguous()  # a mask per position, as documented: the kernels would draw one (H, K) mask
    return _kernels.dynamic_conv(x, _expand_weight(weight, x), padding_left, softmax, seed, weight_dropout)


def _is_expanded_kernel(weight):
    """True for a (B, T, H, K) weight with strides 0 over B and T (one (H, K) kernel expanded over more than one
    position), which the compiled kernels read as an (H, K) LightConv kernel (csrc/checks.h conv_weight), with a
    single DropConnect mask."""
    if weight.dim() != 4 or weight.shape[0] * weight.shape[1] < 2:
        return False
    return weight.stride(0) == 0 and weight.stride(1) == 0


def light_conv(x, weight, padding_left, softmax=False, weight_dropout=0.0, seed=None):
    """LightConv: one (H, K) kernel (normalised, or logits with softmax=True) for every position; DropConnect as in
    `dynamic_conv`, one mask for the kernel. x: (B, T, C) -> (B, T, C)."""
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        raise ValueError("light_conv weight must be (H, K)")
    return dynamic_conv(x, weight, padding_left, softmax, weight_dropout, seed)


# ---------------------------------------------------------------------------------------------------------------
# Recurrent (decoding) form of the causal op (padding_left = K - 1)


def dynamic_conv_init_state(batch, channels, kernel_size, device=None, dtype=torch.float32):
    """An empty decoding state: the last K - 1 inputs, (B, K - 1, C) zeros."""
    check_size("batch", batch, 0)
    check_size("channels", channels, 0)
    check_size("kernel_size", kernel_size, 1)
    return torch.zeros(batch, kernel_size - 1, channels, device=device, dtype=dtype)


def dynamic_conv_state_from_prefix(x, kernel_size):
    """The decoding state after the causal op has consumed x: (B, T, C) -> (B, K - 1, C) last inputs."""
    check_float_tensor("x", x, 3)
    check_int("kernel_size", kernel_size, minimum=1)
    last = x[:, max(x.shape[1] - (kernel_size - 1), 0) :] if kernel_size > 1 else x[:, :0]
    return torch.nn.functional.pad(last, (0, 0, kernel_size - 1 - last.shape[1], 0))


def dynamic_conv_step(x, weight, state, softmax=False, weight_dropout=0.0, seed=None):
    """Causal (P = K - 1) convolution continuing from a decoding state; O(K) per token.

    x: (B, T_new, C); weight: (B, T_new, H, K) or (H, K) (logits with softmax=True); state: (B, K - 1, C);
    weight_dropout, seed: DropConnect as in `dynamic_conv` (the new tokens' weights form the mask's shape)
    -> (out (B, T_new, C), new state). Runs the compiled step kernel (one fused op) when no gradient is needed and
    nothing is dropped, else the same math in PyTorch ops.
    """
    _check_conv_args(x, weight, 0, softmax, weight_dropout, seed)
    check_float_tensor("state", state, 3)
    check_same_device("state", state, "x", x)
    K = weight.shape[-1]
    if state.shape != (x.shape[0], K - 1, x.shape[2]):
        raise ValueError(f"state must have shape {(x.shape[0], K - 1, x.shape[2])}, got {tuple(state.shape)}")
    state = state.to(x.dtype)
    if weight_dropout == 0 and not needs_grad(x, weight, state) and use_kernels(x):
        return _kernels.dynamic_conv_step(x, _expand_weight(weight, x), state, softmax)
    return _dynamic_conv_step_ref(x, weight, state, softmax, weight_dropout, _seed(seed, weight_dropout, x))


def _step_windows(xp, K):
    """xp: (B, K - 1 + T_new, C) -> (B, T_new, C, K): the K inputs each new token reads. Without a new token unfold
    would find no whole window, so one zero row goes behind first (its window is cut)."""
    T = xp.shape[1] - (K - 1)
    if T == 0:
        xp = torch.nn.functional.pad(xp, (0, 0, 0, 1))
    return xp.unfold(1, K, 1)[:, :T]


@exact_products
def _dynamic_conv_step_ref(x, weight, state, softmax=False, weight_dropout=0.0, seed=None):
    """`dynamic_conv_step` in PyTorch ops (differentiable); state in x's dtype. Only the new tokens' windows."""
    B, T, C = x.shape
    H, K = weight.shape[-2:]
    acc = accumulation_dtype(x.dtype)
    xp = torch.cat([state, x], dim=1)  # (B, K - 1 + T_new, C): tap k of new token t reads xp[t + k]
    windows = _step_windows(xp.to(acc), K).reshape(B, T, H, C // H, K)
    taps = _expand_weight(_taps(weight, x, softmax, weight_dropout, seed), x)
    out = torch.einsum("bthrk,bthk->bthr", windows, taps)
    return out.reshape(B, T, C).to(x.dtype), xp[:, xp.shape[1] - (K - 1) :]
