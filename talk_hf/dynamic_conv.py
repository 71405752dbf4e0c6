"""LightConv / DynamicConv (Wu et al., ICLR 2019): depthwise convolutions with softmax-normalised kernels.

Layout is batch-first and channels-last. Head h owns the contiguous channels [h*C/H, (h+1)*C/H)
(reference_impls.md §E.11). With P = padding_left,

    out[b, t, c] = sum_k weight[b, t, h(c), k] * x[b, t + k - P, c]      (x = 0 outside [0, T))

DynamicConv predicts `weight` per position; LightConv uses one (H, K) kernel everywhere. The kernel is normalised
by a softmax over all K taps: by the caller (who may then apply DropConnect), or, with `softmax=True`, by the op
itself from the logits (the compiled kernels then never write the probabilities; they stay in the accumulation
type). Taps that fall outside the sequence read zeros, which is "softmax over K, then truncate at the sequence
start" (§B.2). Causal decoders use P = K - 1, encoders P = K // 2. Any K and any P are supported.
"""

import torch

from .backend import _kernels, needs_grad, use_kernels
from .checks import accumulation_dtype, check_float_tensor, check_heads, check_int, check_like


def _check_conv_args(x, weight, padding_left, softmax=False):
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


def _expand_weight(weight, x):
    """(H, K) LightConv kernels broadcast to the DynamicConv layout (B, T, H, K) without copying."""
    if weight.dim() == 2:
        return weight.expand(x.shape[0], x.shape[1], *weight.shape)
    return weight


def dynamic_conv_ref(x, weight, padding_left, softmax=False):
    """Pure-PyTorch dynamic/lightweight convolution (the specification and the fallback).

    x: (B, T, C); weight: (B, T, H, K) or (H, K), normalised, or logits with softmax=True (softmax over K in the
    accumulation dtype); padding_left: int -> out: (B, T, C).
    """
    _check_conv_args(x, weight, padding_left, softmax)
    return _dynamic_conv_ref(x, weight, padding_left, softmax)


def _normalised(weight, x, softmax):
    """The kernel taps in the accumulation dtype: weight itself, or its softmax over K."""
    w = weight.to(accumulation_dtype(x.dtype))
    return w.softmax(-1) if softmax else w


def _dynamic_conv_ref(x, weight, padding_left, softmax=False):
    B, T, C = x.shape
    H, K = weight.shape[-2:]
    acc = accumulation_dtype(x.dtype)
    w = _expand_weight(_normalised(weight, x, softmax), x)
    # Zero-pad so that tap k of position t reads padded index t + k + (pad_front - P), always in range.
    pad_front, pad_back = max(padding_left, 0), max(K - 1 - padding_left, 0)
    xp = torch.nn.functional.pad(x.to(acc), (0, 0, pad_front, pad_back))
    start = pad_front - padding_left
    windows = xp.unfold(1, K, 1)[:, start : start + T]  # (B, T, C, K)
    out = torch.einsum("bthrk,bthk->bthr", windows.reshape(B, T, H, C // H, K), w)
    return out.reshape(B, T, C).to(x.dtype)


def dynamic_conv(x, weight, padding_left, softmax=False):
    """Dynamic (weight (B, T, H, K)) or lightweight (weight (H, K)) convolution; compiled kernel when built for
    x's device, else `dynamic_conv_ref`. softmax=True: weight holds logits, normalised over K inside the op.
    x: (B, T, C) -> (B, T, C). Differentiable w.r.t. x and weight."""
    _check_conv_args(x, weight, padding_left, softmax)
    if not use_kernels(x):
        return _dynamic_conv_ref(x, weight, padding_left, softmax)
    return _kernels.dynamic_conv(x, _expand_weight(weight, x), padding_left, softmax)


def light_conv(x, weight, padding_left, softmax=False):
    """LightConv: one (H, K) kernel (normalised, or logits with softmax=True) for every position.
    x: (B, T, C) -> (B, T, C)."""
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        raise ValueError("light_conv weight must be (H, K)")
    return dynamic_conv(x, weight, padding_left, softmax)


# ---------------------------------------------------------------------------------------------------------------
# Recurrent (decoding) form of the causal op (padding_left = K - 1)


def dynamic_conv_init_state(batch, channels, kernel_size, device=None, dtype=torch.float32):
    """An empty decoding state: the last K - 1 inputs, (B, K - 1, C) zeros."""
    return torch.zeros(batch, kernel_size - 1, channels, device=device, dtype=dtype)


def dynamic_conv_state_from_prefix(x, kernel_size):
    """The decoding state after the causal op has consumed x: (B, T, C) -> (B, K - 1, C) last inputs."""
    check_float_tensor("x", x, 3)
    check_int("kernel_size", kernel_size, minimum=1)
    last = x[:, max(x.shape[1] - (kernel_size - 1), 0) :] if kernel_size > 1 else x[:, :0]
    return torch.nn.functional.pad(last, (0, 0, kernel_size - 1 - last.shape[1], 0))


def dynamic_conv_step(x, weight, state, softmax=False):
    """Causal (P = K - 1) convolution continuing from a decoding state; O(K) per token.

    x: (B, T_new, C); weight: (B, T_new, H, K) or (H, K) (logits with softmax=True); state: (B, K - 1, C)
    -> (out (B, T_new, C), new state). Runs the compiled step kernel (one fused op) when no gradient is needed,
    else the same math in PyTorch ops.
    """
    _check_conv_args(x, weight, 0, softmax)
    K = weight.shape[-1]
    if state.shape != (x.shape[0], K - 1, x.shape[2]):
        raise ValueError(f"state must have shape {(x.shape[0], K - 1, x.shape[2])}, got {tuple(state.shape)}")
    state = state.to(x.dtype)
    if not needs_grad(x, weight, state) and use_kernels(x):
        return _kernels.dynamic_conv_step(x, _expand_weight(weight, x), state, softmax)
    return _dynamic_conv_step_ref(x, weight, state, softmax)


def _dynamic_conv_step_ref(x, weight, state, softmax=False):
    """`dynamic_conv_step` in PyTorch ops (differentiable); state in x's dtype. Only the new tokens' windows."""
    B, T, C = x.shape
    H, K = weight.shape[-2:]
    acc = accumulation_dtype(x.dtype)
    xp = torch.cat([state, x], dim=1)  # (B, K - 1 + T_new, C): tap k of new token t reads xp[t + k]
    windows = xp.to(acc).unfold(1, K, 1).reshape(B, T, H, C // H, K)
    out = torch.einsum("bthrk,bthk->bthr", windows, _expand_weight(_normalised(weight, x, softmax), x))
    return out.reshape(B, T, C).to(x.dtype), xp[:, xp.shape[1] - (K - 1) :]
