"""TaLK convolution (Lioutas & Guo, ICML 2020): adaptive-window sums over a summed-area table, O(n).

Layout is batch-first and channels-last. Head h owns the contiguous channels [h*C/H, (h+1)*C/H) and all of them
share the head's two relative offsets. For position t the window ends are

    l = clamp(t - offset_left  * max_left,  0, T-1)
    r = clamp(t + offset_right * max_right, 0, T-1)

and the output is the sum of x over [l, r], where the two partially covered edge tokens enter with linear
interpolation weights, divided by the constant max_left + max_right + 1 (docs/spec.md §A.1-A.2).
With S_j = x_0 + ... + x_j (S_j = 0 for j < 0) and S~(p) the linear interpolation of S at a real position p:

    out[t] = (S~(r) - S~(l - 1)) / (max_left + max_right + 1)

Positions are split into an integer part and an fp32 fraction relative to t, so the interpolation weights stay
exact at any T (the published fp16 kernel loses them past T=1024, docs/spec.md §A.4). Prefix sums are fp32 (fp64
for fp64).
The causal form is max_right=0, offset_right=None: the right end is t itself.
"""

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
)


# The longest window, max_left + max_right + 1, that the ops take. The kernels hold the window size in int64 and add
# a tile of steps to it (the CUDA forward's rows of prefix sums): 2**62 leaves that sum far from 2**63 - 1.
LONGEST_WINDOW = 2**62


def _check_talk_args(x, offset_left, offset_right, max_left, max_right):
    check_float_tensor("x", x, 3)
    check_float_tensor("offset_left", offset_left, 3)
    check_like("offset_left", offset_left, "x", x, dims=[(0, 0), (1, 1)])
    check_heads("channels (x.shape[-1])", x.shape[-1], "heads (offset_left.shape[-1])", offset_left.shape[-1])
    check_int("max_left", max_left, minimum=0)
    check_int("max_right", max_right, minimum=0)
    _check_window(max_left, max_right)
    if offset_right is None:
        if max_right != 0:
            raise ValueError(f"offset_right is None (causal form) but max_right={max_right}; pass offset_right")
    else:
        check_float_tensor("offset_right", offset_right, 3)
        check_like("offset_right", offset_right, "offset_left", offset_left, dims=[(0, 0), (1, 1), (2, 2)])


def _check_window(max_left, max_right):
    """The window size max_left + max_right + 1 (the normaliser of every output) must be at most LONGEST_WINDOW."""
    window = max_left + max_right + 1
    if window > LONGEST_WINDOW:
        raise ValueError(
            f"max_left + max_right + 1 = {window} is more than 2**62, the longest window the kernels hold without "
            f"overflowing int64 (max_left={max_left}, max_right={max_right}); pass smaller reaches"
        )


def _window_end(rel, seqlen):
    """Split the window end t + rel into (lo, hi, frac) with t + rel clamped to [0, seqlen-1].

    rel: (B, T, H) float -> lo, hi: (B, T, H) int64 with hi = lo + (frac > 0); frac: (B, T, H) in [0, 1).
    The fraction is computed from `rel` alone, so it does not lose precision for large t.
    """
    t = torch.arange(seqlen, device=rel.device).view(1, seqlen, 1)
    rel = rel.clamp(-seqlen, seqlen)  # beyond this every position is clamped anyway; keeps .long() defined
    whole = torch.floor(rel)
    frac = rel - whole.detach()
    lo = t + whole.long()
    clamped = (lo < 0) | (lo >= seqlen - 1)
    frac = torch.where(clamped, torch.zeros_like(frac), frac)
    lo = lo.clamp(0, seqlen - 1)
    hi = lo + (frac > 0).long()
    return lo, hi, frac


def _interpolate(table, lo, hi, frac):
    """table: (B, N, H, R); lo, hi, frac: (B, T, H) -> (B, T, H, R) = table[lo] + frac * (table[hi] - table[lo])."""
    shape = (*lo.shape, table.shape[-1])
    at_lo = torch.gather(table, 1, lo.unsqueeze(-1).expand(shape))
    at_hi = torch.gather(table, 1, hi.unsqueeze(-1).expand(shape))
    return at_lo + frac.unsqueeze(-1) * (at_hi - at_lo)


def talk_conv_ref(x, offset_left, offset_right=None, max_left=1, max_right=0):
    """Pure-PyTorch TaLK convolution (the specification and the fallback).

    x: (B, T, C); offset_left, offset_right: (B, T, H) relative offsets, C % H == 0 -> out: (B, T, C).
    """
    _check_talk_args(x, offset_left, offset_right, max_left, max_right)
    return _talk_conv_ref(x, offset_left, offset_right, max_left, max_right)


def _talk_conv_ref(x, offset_left, offset_right, max_left, max_right):
    B, T, C = x.shape
    H = offset_left.shape[-1]
    acc = accumulation_dtype(x.dtype)
    # sat[:, i] = S_{i-1}: a zero row in front, so S_{-1} = 0 needs no special case.
    sat = torch.nn.functional.pad(x.to(acc).view(B, T, H, C // H).cumsum(1), (0, 0, 0, 0, 1, 0))
    lo, hi, frac = _window_end(-offset_left.to(acc) * max_left, T)
    left = _interpolate(sat, lo, hi, frac)  # S~(l - 1)
    if offset_right is None:
        right = sat[:, 1:]  # S_t
    else:
        lo, hi, frac = _window_end(offset_right.to(acc) * max_right, T)
        right = _interpolate(sat, lo + 1, hi + 1, frac)  # S~(r)
    out = (right - left) / (max_left + max_right + 1)
    return out.reshape(B, T, C).to(x.dtype)


def talk_conv(x, offset_left, offset_right=None, max_left=1, max_right=0):
    """TaLK convolution; compiled kernel when built for x's device, else `talk_conv_ref`.

    x: (B, T, C); offset_left, offset_right: (B, T, H) (offset_right=None and max_right=0: causal) -> (B, T, C).
    Differentiable w.r.t. x and both offsets.
    """
    _check_talk_args(x, offset_left, offset_right, max_left, max_right)
    if not use_kernels(x) or forward_mode(x, offset_left, offset_right):
        return _talk_conv_ref(x, offset_left, offset_right, max_left, max_right)
    return _kernels.talk_conv(x, offset_left, offset_right, max_left, max_right)


# ---------------------------------------------------------------------------------------------------------------
# Recurrent (decoding) form of the causal op


def talk_conv_state_size(max_left):
    """Rows of the decoding state: the last max_left + 2 prefix sums cover every window end
    l - 1 >= t - max_left - 1."""
    return max_left + 2


def talk_conv_init_state(batch, channels, max_left, device=None, dtype=torch.float32):
    """An empty decoding state: (B, max_left + 2, C) zeros (S_j = 0 for j < 0)."""
    check_size("batch", batch, 0)
    check_size("channels", channels, 0)
    check_size("max_left", max_left, 0)
    return torch.zeros(batch, talk_conv_state_size(max_left), channels, device=device, dtype=dtype)


def talk_conv_state_from_prefix(x, max_left):
    """The decoding state after the causal op has consumed x: (B, T, C) -> (B, max_left + 2, C).

    The state holds the last max_left + 2 prefix sums S_j minus the one before them (windows only read differences),
    so its values stay as small as window sums however long the sequence: fp32 decoding does not drift.
    """
    check_float_tensor("x", x, 3)
    check_int("max_left", max_left, minimum=0)
    rows = talk_conv_state_size(max_left)
    sums = x[:, -rows:].to(accumulation_dtype(x.dtype)).cumsum(1)  # S_j - S_{T-rows-1} (S_j = 0 for j < 0)
    return torch.nn.functional.pad(sums, (0, 0, rows - sums.shape[1], 0))


def talk_conv_step(x, offset_left, state, max_left):
    """Causal TaLK convolution continuing from a decoding state, O(1) memory in the tokens already seen.

    x: (B, T_new, C) new tokens (T_new=1 for a decoding step); offset_left: (B, T_new, H);
    state: (B, max_left + 2, C) from `talk_conv_init_state` / `talk_conv_state_from_prefix` / a previous step
    -> (out (B, T_new, C), new state). Relative windows are capped at max_left (offset_left clipped to [0, 1]):
    offsets above 1 only occur under training-time offset dropout, which decoding does not use. Runs the compiled
    step kernel (one fused op) when no gradient is needed, else the same math in PyTorch ops.
    """
    _check_talk_args(x, offset_left, None, max_left, 0)
    check_float_tensor("state", state, 3)
    check_same_device("state", state, "x", x)
    rows = talk_conv_state_size(max_left)
    if state.shape != (x.shape[0], rows, x.shape[2]):
        raise ValueError(f"state must have shape {(x.shape[0], rows, x.shape[2])}, got {tuple(state.shape)}")
    acc = accumulation_dtype(x.dtype)
    if not needs_grad(x, offset_left, state) and use_kernels(x):
        return _kernels.talk_conv_step(x, offset_left, state.to(acc), max_left)
    return _talk_conv_step_ref(x, offset_left, state.to(acc), max_left)


def _talk_conv_step_ref(x, offset_left, state, max_left):
    """`talk_conv_step` in PyTorch ops (differentiable); state in the accumulation dtype."""
    B, T, C = x.shape
    H = offset_left.shape[-1]
    rows = talk_conv_state_size(max_left)
    acc = state.dtype
    # ext[:, e] is S at position t0 - rows + e minus the state's base, t0 = tokens already consumed.
    ext = torch.cat([state, state[:, -1:] + x.to(acc).cumsum(1)], dim=1).view(B, rows + T, H, C // H)
    rel = -offset_left.to(acc).clamp(0, 1) * max_left
    whole = torch.floor(rel)
    frac = rel - whole.detach()
    lo = torch.arange(T, device=x.device).view(1, T, 1) + rows - 1 + whole.long()  # ext index of S_{floor(l) - 1}
    hi = lo + (frac > 0).long()
    left = _interpolate(ext, lo, hi, frac)
    out = (ext[:, rows:] - left) / (max_left + 1)
    if T == 0:  # no new token: the state as it is (as the compiled op returns it)
        return out.reshape(B, T, C).to(x.dtype), state
    new_state = ext[:, -rows:] - ext[:, -rows - 1 : -rows]  # relative to the row before it, as the state is
    return out.reshape(B, T, C).to(x.dtype), new_state.reshape(B, rows, C)
