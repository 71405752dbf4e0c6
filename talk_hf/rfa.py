"""Random feature attention (Peng et al., 2021) as used by RFA-doc (Wu et al., 2022): linear attention whose
features approximate a softmax on cosine similarity, with an optional per-head decay gate applied at sentence
separators (docs/spec.md §C).

Feature map (§C.1), per head h with a fixed random projection W_h (D, d) and a learned temperature tau_h:

    phi(x) = 0.1 * [sin(u_1), cos(u_1), ..., sin(u_D), cos(u_D)],  u = W_h (x / (|x| + 1e-3)) / tau_h

so features have F = 2D entries. Causal attention (§C.3), with decay[t] the factor applied to the state after
step t (1 everywhere except at sentence separators, where it is the gate g; §C.4):

    S_t = decay[t-1] * S_{t-1} + phi(k_t) v_t^T,   z_t = decay[t-1] * z_{t-1} + phi(k_t)
    out_t = phi(q_t)^T S_t / max(phi(q_t) . z_t, eps),   eps = 0.1

A state is one tensor (B, H, F, d + 1): [..., :d] holds S and [..., d] holds z. States and all sums are fp32
(fp64 for fp64 inputs) whatever the activation dtype, inside an autocast region too. Padded keys must have zero
features (the caller zeroes them). The training form is chunked: per chunk of `chunk_size` steps it uses
(chunk x chunk) score blocks and one state per chunk, never a T x T matrix or a state per token.
"""

import math

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

from .backend import _kernels, backend, backend_reason, forward_mode, needs_grad, use_kernels
from .checks import accumulation_dtype, check_float_tensor, check_int, exact_products

DEFAULT_EPS = 0.1
FEATURE_SCALE = 0.1
NORM_EPS = 1e-3
LONGEST_CHUNK = 1 << 31  # chunk sizes above it are cut to the sequence length (see `_saved_chunk`)


def _acc_dtype(*tensors):
    return accumulation_dtype(*(t.dtype for t in tensors if t is not None))


def _cast(acc, *tensors):  # each tensor (or None) in the accumulation dtype
    return [None if t is None else t.to(acc) for t in tensors]


def rfa_random_projection(heads, num_frequencies, head_dim, generator=None, device=None, dtype=torch.float32):
    """Random projections for the feature map: (H, D, d) with i.i.d. N(0, 1) entries."""
    return torch.randn(heads, num_frequencies, head_dim, generator=generator, device=device, dtype=dtype)


def _check_feature_args(x, projection, tau):
    check_float_tensor("x", x, 4)
    check_float_tensor("projection", projection, 3)
    if projection.shape[0] != x.shape[2] or projection.shape[2] != x.shape[3]:
        raise ValueError(f"projection must be (H, D, d) = ({x.shape[2]}, D, {x.shape[3]}), "
                         f"got {tuple(projection.shape)}")
    if tau is not None:
        check_float_tensor("tau", tau, 1)
        if tau.shape != (x.shape[2],):
            raise ValueError(f"tau must have shape ({x.shape[2]},), got {tuple(tau.shape)}")
    for name, t in (("projection", projection), ("tau", tau)):
        if t is not None and t.device != x.device:
            raise ValueError(f"{name} is on {t.device} but x is on {x.device}")


def rfa_feature_map(x, projection, tau=None):
    """Random features of queries or keys; the compiled kernel when built for x's device and no gradient is needed
    (decoding, inference), else `_rfa_feature_map_heads` (the same function as `rfa_feature_map_ref`, differentiable,
    laid out head-major in memory).

    x: (B, T, H, d); projection: (H, D, d); tau: (H,) temperatures or None (= 1)
    -> (B, T, H, 2D) in fp32 (fp64 for fp64 x), sin/cos pairs interleaved.
    """
    _check_feature_args(x, projection, tau)
    if not needs_grad(x, projection, tau) and use_kernels(x):
        acc = _acc_dtype(x)
        return _kernels.rfa_feature_map(*_cast(acc, x, projection, tau))
    return _rfa_feature_map_heads(x, projection, tau)


def rfa_feature_map_ref(x, projection, tau=None):
    """The feature map in PyTorch (the specification; differentiable w.r.t. x, projection and tau); arguments and
    result as `rfa_feature_map`."""
    _check_feature_args(x, projection, tau)
    return _rfa_feature_map_ref(x, projection, tau)


def _feature_inputs(x, projection, tau):
    """(x / (|x| + 1e-3), projection / tau), both in the accumulation dtype: the two factors of u."""
    acc = _acc_dtype(x)
    x = x.to(acc)
    w = projection.to(acc)
    if tau is not None:
        w = w / tau.to(acc).view(-1, 1, 1)
    return x / (x.norm(dim=-1, keepdim=True) + NORM_EPS), w


@exact_products
def _rfa_feature_map_ref(x, projection, tau):
    u = torch.einsum("bthd,hfd->bthf", *_feature_inputs(x, projection, tau))
    return FEATURE_SCALE * torch.stack([torch.sin(u), torch.cos(u)], dim=-1).flatten(-2)


class _ScaledSinCos(torch.autograd.Function):
    """u (..., D) -> FEATURE_SCALE * [sin u, cos u] as (..., D, 2). The backward reads the saved output (its sin and
    cos columns are the derivatives of each other), so nothing is recomputed and u is not kept. torch.func's grad,
    vjp, jacrev, jvp and jacfwd run it, and vmap over them."""

    generate_vmap_rule = True

    @staticmethod
    def forward(u):
        return torch.stack([torch.sin(u), torch.cos(u)], dim=-1).mul_(FEATURE_SCALE)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output)
        ctx.save_for_forward(output)

    @staticmethod
    def jvp(ctx, tangent):
        (out,) = ctx.saved_tensors
        return torch.stack([tangent * out[..., 1], -tangent * out[..., 0]], dim=-1)

    @staticmethod
    def backward(ctx, grad):
        (out,) = ctx.saved_tensors
        return grad[..., 0] * out[..., 1] - grad[..., 1] * out[..., 0]


@exact_products
def _rfa_feature_map_heads(x, projection, tau):
    """`rfa_feature_map_ref`'s function for training: a (B, T, H, 2D) view of (B, H, T, 2D) memory, so that the
    per-head matrix products of the attention read it without a transposing copy (docs/kernels.md)."""
    u = torch.einsum("bthd,hfd->bhtf", *_feature_inputs(x, projection, tau)).contiguous()  # (B, H, T, D)
    if torch.compiler.is_compiling():  # dynamo does not trace a Function with a jvp; the compiler plans the memory
        return (FEATURE_SCALE * torch.stack([torch.sin(u), torch.cos(u)], dim=-1)).flatten(-2).transpose(1, 2)
    return _ScaledSinCos.apply(u).flatten(-2).transpose(1, 2)


def rfa_key_norm_rescale(k, tau=None, attention_mask=None):
    """Norm rescaling of cross-attention key features (docs/spec.md §C.1): exp(0.5 (|k| / (sqrt(d) tau))^2 - m),
    m the (detached) maximum over real source positions of each (batch, head).

    k: (B, S, H, d) raw keys; tau: (H,) or None; attention_mask: (B, S) with 1 for real tokens -> (B, S, H, 1).
    """
    acc = _acc_dtype(k)
    scaled = k.to(acc).norm(dim=-1) / math.sqrt(k.shape[-1])
    if tau is not None:
        scaled = scaled / tau.to(acc)
    exponent = 0.5 * scaled**2  # (B, S, H)
    if attention_mask is not None:
        exponent = exponent.masked_fill(~attention_mask.bool().unsqueeze(-1), float("-inf"))
    shift = exponent.amax(dim=1, keepdim=True).detach().clamp_min(0)
    return torch.exp(exponent - shift).unsqueeze(-1)


def _check_attention_args(q, k, v, decay=None, state=None):
    check_float_tensor("q", q, 4)
    check_float_tensor("k", k, 4)
    check_float_tensor("v", v, 4)
    if k.shape != q.shape:
        raise ValueError(f"k must have the shape of q {tuple(q.shape)}, got {tuple(k.shape)}")
    if v.shape[:3] != q.shape[:3]:
        raise ValueError(f"v must be (B, T, H, d) matching q {tuple(q.shape[:3])}, got {tuple(v.shape)}")
    for name, t in (("k", k), ("v", v), ("decay", decay), ("state", state)):
        if t is not None and t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}")
    if decay is not None and decay.shape != q.shape[:3]:
        raise ValueError(f"decay must be (B, T, H) = {tuple(q.shape[:3])}, got {tuple(decay.shape)}")
    if state is not None:
        expected = (q.shape[0], q.shape[2], q.shape[3], v.shape[3] + 1)
        if state.shape != expected:
            raise ValueError(f"state must be (B, H, F, d + 1) = {expected}, got {tuple(state.shape)}")


def _check_causal_args(q, k, v, decay, state, chunk_size):
    _check_attention_args(q, k, v, decay, state)
    check_int("chunk_size", chunk_size, minimum=1)


def rfa_init_state(batch, heads, num_features, head_dim, device=None, dtype=torch.float32):
    """An empty attention state: (B, H, F, d + 1) zeros."""
    return torch.zeros(batch, heads, num_features, head_dim + 1, device=device, dtype=dtype)


def _with_ones(v, acc):
    """(B, T, H, d) -> (B, T, H, d + 1): a column of ones turns the normaliser z into one more value column."""
    v = v.to(acc)
    return torch.cat([v, v.new_ones(*v.shape[:-1], 1)], dim=-1)


def _normalise(num, eps):
    """(..., d + 1) numerator and normaliser -> (..., d)."""
    return num[..., :-1] / num[..., -1:].clamp_min(eps)


def rfa_causal_ref(q, k, v, decay=None, initial_state=None, eps=DEFAULT_EPS):
    """Causal RFA by its recurrence, one step at a time (the specification; float64-capable).

    q, k: (B, T, H, F) features; v: (B, T, H, d); decay: (B, T, H) or None; initial_state: (B, H, F, d + 1)
    -> (out (B, T, H, d) in v's dtype, final state (B, H, F, d + 1)).
    """
    _check_attention_args(q, k, v, decay, initial_state)
    return _rfa_causal_recurrence(q, k, v, decay, initial_state, eps)


@exact_products
def _rfa_causal_recurrence(q, k, v, decay, initial_state, eps):
    """`rfa_causal_ref` without its checks: the recurrence, one step at a time."""
    B, T, H, F = q.shape
    acc = _acc_dtype(q, k, v, initial_state)
    values = _with_ones(v, acc)
    state = rfa_init_state(B, H, F, v.shape[-1], q.device, acc) if initial_state is None else initial_state.to(acc)
    if T == 0:
        return _rfa_no_step(q.to(acc), k.to(acc), values, decay, state, eps, v.dtype)
    outs = []
    for t in range(T):
        state = state + k[:, t].to(acc).unsqueeze(-1) * values[:, t].unsqueeze(-2)
        outs.append(_normalise(torch.einsum("bhf,bhfe->bhe", q[:, t].to(acc), state), eps))
        if decay is not None:
            state = state * decay[:, t].to(acc).view(B, H, 1, 1)
    return torch.stack(outs, dim=1).to(v.dtype), state


def _rfa_no_step(q, k, values, decay, state, eps, dtype):
    """The recurrence over T = 0 steps, written as its sums and products over no step: out (B, 0, H, d) in `dtype`
    and the final state (B, H, F, d + 1), equal to `state`, both connected to every input (with zero gradients), as
    the compiled op's outputs are. q, k: (B, 0, H, F); values: (B, 0, H, d + 1); decay: (B, 0, H) or None."""
    state = state + torch.einsum("bthf,bthe->bhfe", k, values)  # adds zeros
    if decay is not None:
        state = state * decay.to(state.dtype).prod(1).unsqueeze(-1).unsqueeze(-1)  # multiplies by ones
    return _normalise(torch.einsum("bthf,bhfe->bthe", q, state), eps).to(dtype), state


def rfa_causal(q, k, v, decay=None, initial_state=None, eps=DEFAULT_EPS, chunk_size=64):
    """Causal RFA (training, prefill and decoding steps); the same function as `rfa_causal_ref`.

    Runs the compiled kernels when they are built for q's device, for training too (forward and backward: on CPU
    1.3-2.6x as fast as the chunked PyTorch form with every gradient, docs/kernels.md), else the chunked form. On
    CUDA the training path is a chunked kernel for more than one step, forward and backward, with exact fp32
    products whatever v's dtype or `torch.backends.cuda.matmul.allow_tf32`:
    their tensor-core (TF32) instantiations, the op's `tf32` argument, measured 0.79-0.85x as fast as the exact ones
    on an H100 (docs/kernels.md). `rfa_causal_compiled` and `rfa_causal_chunked` pick one.

    q, k: (B, T, H, F) features; v: (B, T, H, d); decay: (B, T, H) factors in [0, 1] or None;
    initial_state: (B, H, F, d + 1) or None; chunk_size: steps per chunk (of the matmul form, or between the
    kernel's saved states) -> (out (B, T, H, d) in v's dtype, final state (B, H, F, d + 1)). Differentiable w.r.t.
    q, k, v, decay and initial_state.
    """
    _check_causal_args(q, k, v, decay, initial_state, chunk_size)
    if use_kernels(q) and not forward_mode(q, k, v, decay, initial_state):
        return _rfa_causal_compiled(q, k, v, decay, initial_state, eps, chunk_size)
    return _rfa_causal_chunked(q, k, v, decay, initial_state, eps, chunk_size)


def rfa_causal_compiled(q, k, v, decay=None, initial_state=None, eps=DEFAULT_EPS, chunk_size=64):
    """Causal RFA by the compiled kernels (CPU or CUDA), forward and backward under autograd; the forward saves the
    state entering every `chunk_size` steps for the backward (on CUDA, also the chunk length of the chunked kernels).
    Arguments and results as `rfa_causal`. Raises RuntimeError when the extension has no kernels for q's device."""
    _check_causal_args(q, k, v, decay, initial_state, chunk_size)
    if forward_mode(q, k, v, decay, initial_state):
        raise RuntimeError("rfa_causal_compiled: the kernels have reverse-mode derivatives only and do not run inside "
                           "torch.func transforms or on forward-mode dual tensors; use rfa_causal there")
    if backend(q.device) != "compiled":
        raise RuntimeError(f"rfa_causal_compiled: the compiled kernels do not run {q.device.type} tensors here: "
                           f"{backend_reason(q.device)}")
    return _rfa_causal_compiled(q, k, v, decay, initial_state, eps, chunk_size)


def _rfa_causal_compiled(q, k, v, decay, initial_state, eps, chunk_size):
    acc = _acc_dtype(q, k, v, initial_state)
    needed = needs_grad(q, k, v, decay, initial_state)
    saved = _saved_chunk(chunk_size, q.shape[1]) if needed else 0  # states for a backward, else none
    out, state = _kernels.rfa_causal(*_cast(acc, q, k, v, decay, initial_state), eps, saved)
    return out.to(v.dtype), state


def _saved_chunk(chunk_size, T):
    """The kernels' chunk for `chunk_size` over T steps: chunk_size itself, or T (at least 1) for a chunk_size above
    LONGEST_CHUNK, which the kernels' int64 chunk counts (T + chunk - 1) would overflow near 2^63. A chunk at least
    as long as the sequence saves the one state entering it, whatever its length: the same results."""
    return min(chunk_size, max(T, 1)) if chunk_size > LONGEST_CHUNK else chunk_size


def rfa_causal_chunked(q, k, v, decay=None, initial_state=None, eps=DEFAULT_EPS, chunk_size=64):
    """Causal RFA in chunked matmul form, pure PyTorch (the fallback of `rfa_causal`), in chunks of
    min(chunk_size, T) steps; arguments and results as `rfa_causal`."""
    _check_causal_args(q, k, v, decay, initial_state, chunk_size)
    return _rfa_causal_chunked(q, k, v, decay, initial_state, eps, chunk_size)


@exact_products
def _rfa_causal_chunked(q, k, v, decay, initial_state, eps, chunk_size):
    if q.shape[1] <= 1:  # a decoding step: the recurrence is cheapest
        return _rfa_causal_recurrence(q, k, v, decay, initial_state, eps)
    B, T, H, F = q.shape
    acc = _acc_dtype(q, k, v, initial_state)
    C = min(chunk_size, T)  # a chunk longer than the sequence would only add padded steps
    N = -(-T // C)
    pad = N * C - T  # padded steps have zero keys and decay 1: they change nothing and their outputs are cut

    def chunks(t, width):  # (B, T, H, width) -> (B, H, N, C, width)
        t = torch.nn.functional.pad(t.to(acc), (0, 0, 0, 0, 0, pad))
        return t.view(B, N, C, H, width).permute(0, 3, 1, 2, 4)

    qc, kc, vc = chunks(q, F), chunks(k, F), chunks(_with_ones(v, acc), v.shape[-1] + 1)
    weights, to_end, from_start = _chunk_decays(decay, B, T, H, N, C, acc, q.device)
    intra = ((qc @ kc.transpose(-1, -2)) * weights) @ vc
    updates = (kc * to_end.unsqueeze(-1)).transpose(-1, -2) @ vc  # what each chunk adds to the state, at its end
    chunk_decay = to_end[..., :1].unsqueeze(-1)  # (B, H, N, 1, 1): the whole chunk's decay
    state = rfa_init_state(B, H, F, v.shape[-1], q.device, acc) if initial_state is None else initial_state.to(acc)
    entering = []
    for n in range(N):
        entering.append(state)
        state = chunk_decay[:, :, n] * state + updates[:, :, n]
    inter = (qc * from_start.unsqueeze(-1)) @ torch.stack(entering, dim=2)
    out = _normalise(intra + inter, eps).permute(0, 2, 3, 1, 4).reshape(B, N * C, H, v.shape[-1])[:, :T]
    return out.to(v.dtype), state


def _chunk_decays(decay, B, T, H, N, C, acc, device):
    """Products of decays inside chunks of C steps (decay[t] multiplies the state after step t), as products, never
    through logarithms, so that exact zeros keep their gradients:
    weights[i, j] = decay[j] ... decay[i - 1] (1 for i = j, 0 for j > i): (B, H, N, C, C), the weight of key j for
    query i; to_end[j] = decay[j] ... decay[C - 1]: (B, H, N, C); from_start[i] = decay[0] ... decay[i - 1] (the
    decay of the entering state at query i): (B, H, N, C). decay None: no decay; steps past T decay by 1."""
    causal = torch.ones(C, C, dtype=torch.bool, device=device).tril()
    if decay is None:
        ones = torch.ones(B, H, N, C, dtype=acc, device=device)
        return causal.to(acc).expand(B, H, N, C, C), ones, ones
    d = torch.nn.functional.pad(decay.to(acc), (0, 0, 0, N * C - T), value=1.0).view(B, N, C, H).permute(0, 3, 1, 2)
    previous = torch.nn.functional.pad(d[..., :-1], (1, 0), value=1.0)  # decay[i - 1] for row i (1 for i = 0)
    factors = torch.where(causal.tril(-1), previous.unsqueeze(-1), torch.ones((), dtype=acc, device=device))
    weights = factors.cumprod(-2).masked_fill(~causal, 0.0)  # column j: 1, decay[j], decay[j] decay[j + 1], ...
    to_end = weights[..., -1, :] * d[..., -1:]
    return weights, to_end, weights[..., 0]


def rfa_step(q, k, v, state, decay=None, eps=DEFAULT_EPS):
    """Decoding step(s) from a state, O(1) in the tokens already seen.

    q, k: (B, T_new, H, F); v: (B, T_new, H, d); state: (B, H, F, d + 1); decay: (B, T_new, H) or None
    -> (out (B, T_new, H, d), new state).
    """
    if state is None:
        raise ValueError("rfa_step needs a state; start from rfa_init_state(...)")
    return rfa_causal(q, k, v, decay, initial_state=state, eps=eps)


def rfa_cross_state(k, v, attention_mask=None):
    """The state of cross attention over a whole source, computed once per source.

    k: (B, S, H, F) key features; v: (B, S, H, d); attention_mask: (B, S), 1 for real tokens -> (B, H, F, d + 1).
    """
    _check_source_args(k, v, attention_mask)
    return _cross_state(k, v, attention_mask)


@exact_products
def _cross_state(k, v, attention_mask, key_scale=None):
    """sum_s w_s phi(k_s) [v_s, 1]^T with w the mask times key_scale: (B, H, F, d + 1). The weights multiply the
    d + 1 value columns instead of the F key features (the same sum, F / (d + 1) times fewer products).

    One batched product per head, each reading its head's keys in place as a transposed view: a single product over
    (B, H) would first copy the keys into (B, H, F, S) order, a transpose of the largest tensor here with S as its
    innermost dimension (on the CPU, at B = 24, S = 300, H = 8, F = 512, that copy took twice the product's time)."""
    acc = _acc_dtype(k, v)
    keys, values = k.to(acc), _with_ones(v, acc)
    weights = _key_weights(k, attention_mask, key_scale, acc)
    if weights is not None:
        values = values * weights
    heads = [keys[:, :, h].transpose(1, 2) @ values[:, :, h] for h in range(k.shape[2])]  # (B, F, S) @ (B, S, d + 1)
    return torch.stack(heads, dim=1)


def _check_source_args(k, v, attention_mask, key_scale=None):
    check_float_tensor("k", k, 4)
    check_float_tensor("v", v, 4)
    if v.shape[:3] != k.shape[:3]:
        raise ValueError(f"v must be (B, S, H, d) matching k {tuple(k.shape[:3])}, got {tuple(v.shape)}")
    if attention_mask is not None and attention_mask.shape != k.shape[:2]:
        raise ValueError(f"attention_mask must be (B, S) = {tuple(k.shape[:2])}, got {tuple(attention_mask.shape)}")
    if key_scale is not None:
        _check_key_scale(key_scale, k)


def _check_key_scale(key_scale, k):
    """key_scale: one factor per key, (B, S, H, 1) like k (B, S, H, F), on k's device."""
    expected = (*k.shape[:3], 1)
    if isinstance(key_scale, torch.Tensor) and key_scale.shape != expected:
        raise ValueError(f"key_scale must be (B, S, H, 1) = {expected} for k of shape {tuple(k.shape)}, "
                         f"got {tuple(key_scale.shape)}")
    check_float_tensor("key_scale", key_scale, 4)
    if key_scale.device != k.device:
        raise ValueError(f"key_scale is on {key_scale.device} but k is on {k.device}")


def rfa_step_(q, k, v, state, decay=None, eps=DEFAULT_EPS):
    """Decoding step(s) that advance `state` in place (the kernels write the new state over the old one: no new
    tensor, no copy); the compiled kernel when built for q's device, else the recurrence and a copy into `state`.
    Inference only (no autograd; `rfa_step` is the differentiable form).

    q, k: (B, T_new, H, F); v: (B, T_new, H, d); state: (B, H, F, d + 1), contiguous, in the accumulation dtype
    (fp32, fp64 for fp64 inputs); decay: (B, T_new, H) or None -> out (B, T_new, H, d) in v's dtype.
    """
    _check_attention_args(q, k, v, decay, state)
    acc = _acc_dtype(q, k, v, state)
    if state.dtype != acc or not state.is_contiguous():
        raise ValueError(f"rfa_step_ updates state in place: it must be a contiguous {acc} tensor, got "
                         f"{state.dtype}{'' if state.is_contiguous() else ', not contiguous'}")
    _refuse_autograd_of_the_in_place_step(q, k, v, decay, state)
    if _inference_outside_inference_mode(state):  # refused before anything is written
        raise RuntimeError("rfa_step_: Inplace update to inference tensor outside InferenceMode is not allowed (state "
                           "was created under torch.inference_mode); clone it outside inference mode, or decode under "
                           "torch.inference_mode")
    if use_kernels(q):
        return _kernels.rfa_causal_step_(*_cast(acc, q, k, v, decay), state, eps).to(v.dtype)
    out, new_state = _rfa_causal_recurrence(q, k, v, decay, state, eps)
    state.copy_(new_state)
    return out


def _refuse_autograd_of_the_in_place_step(*tensors):
    """ValueError when `rfa_step_` cannot run on these tensors (None entries ignored): inside a torch.func transform
    (vmap, grad, jvp: whether or not a gradient is asked for), or where autograd would record it (`needs_grad`)."""
    if torch._C._are_functorch_transforms_active():
        raise ValueError("rfa_step_ overwrites its state and does not run inside torch.func transforms (vmap, grad, "
                         "jvp); use rfa_step, which does")
    if needs_grad(*tensors):
        raise ValueError("rfa_step_ has no autograd (it overwrites its state); use rfa_step when gradients are needed")


def _inference_outside_inference_mode(t):
    """True for an inference tensor outside torch.inference_mode, which in-place ops refuse. Eager only: torch.compile
    does not trace the question (a compiled step leaves the refusal to the op, and to PyTorch's copy_)."""
    if torch.compiler.is_compiling():
        return False
    return t.is_inference() and not torch.is_inference_mode_enabled()


def rfa_cross_source(k, v, attention_mask=None, key_scale=None):
    """The source side of cross attention, computed once per source, in whichever form is smaller (`rfa_cross` takes
    both and computes the same function): the state of `rfa_cross_state`, F (d + 1) numbers per (batch, head), or
    for sources shorter than F (d + 1) / (F + d + 1) tokens (57 at F = 512, d = 64) the key features and values
    themselves, S (F + d + 1) numbers: a pair (keys (B, H, S, F), zero at padded tokens; values (B, H, S, d + 1),
    with a column of ones last), both contiguous and written in one pass each. A source length known only
    symbolically (torch.export, torch.compile with dynamic shapes) gets the state unless its bounds keep it short.

    k: (B, S, H, F) key features; v: (B, S, H, d); attention_mask: (B, S), 1 for real tokens; key_scale: (B, S, H, 1)
    factors multiplying the key features (the norm rescaling of `rfa_key_norm_rescale`), or None.
    """
    _check_source_args(k, v, attention_mask, key_scale)
    S, F, E = k.shape[1], k.shape[-1], v.shape[-1] + 1
    acc = _acc_dtype(k, v)
    if not _keys_are_smaller(S, F, E):
        return _cross_state(k, v, attention_mask, key_scale)
    weights = _key_weights(k, attention_mask, key_scale, acc)
    if needs_grad(k, key_scale):  # differentiable ops (out= has no autograd)
        keys = (k.to(acc) if weights is None else k.to(acc) * weights).transpose(1, 2).contiguous()
    else:  # one pass: scaled, masked and laid out at once
        keys = torch.empty(k.shape[0], k.shape[2], S, F, dtype=acc, device=k.device)
        if weights is None:
            keys.copy_(k.transpose(1, 2))
        else:
            torch.mul(k.transpose(1, 2), weights.transpose(1, 2), out=keys)
    return keys, _with_ones(v, acc).transpose(1, 2).contiguous()


def _keys_are_smaller(S, F, E):
    """True when the keys and values of a source of S tokens, S (F + E) numbers, are fewer than its state's F E. A
    symbolic S (torch.export, or torch.compile with dynamic shapes) counts as shorter only where its bounds prove it,
    so that the choice puts no guard on the source length: a guard would fail an export whose range of source
    lengths spans F E / (F + E)."""
    return statically_known_true(S * (F + E) < F * E)


def _key_weights(k, attention_mask, key_scale, acc):
    """(B, S, H or 1, 1) factors for the key features: the mask times key_scale, or None when neither is given."""
    weights = None if key_scale is None else key_scale.to(acc)
    if attention_mask is not None:
        mask = attention_mask.to(acc).view(*k.shape[:2], 1, 1)
        weights = mask if weights is None else weights * mask
    return weights


@exact_products
def rfa_cross(q, source, eps=DEFAULT_EPS):
    """Cross attention of queries against a source.

    q: (B, T, H, F); source: the state (B, H, F, d + 1) from `rfa_cross_state`, or either form from
    `rfa_cross_source` -> (B, T, H, d) in the source's dtype.
    """
    check_float_tensor("q", q, 4)
    if isinstance(source, tuple):
        keys, values = source
        check_float_tensor("keys", keys, 4)
        check_float_tensor("values", values, 4)
        if ((keys.shape[:2], keys.shape[3]) != ((q.shape[0], q.shape[2]), q.shape[3])
                or values.shape[:3] != keys.shape[:3]):
            raise ValueError(f"source keys must be (B, H, S, F) and values (B, H, S, d + 1) "
                             f"matching q {tuple(q.shape)}, "
                             f"got {tuple(keys.shape)} and {tuple(values.shape)}")
        queries = q.to(keys.dtype).transpose(1, 2)  # (B, H, T, F)
        if q.shape[1] == 1:
            # a decoding step: (B, H, S, 1) scores as one matrix-vector product per (batch, head), each key row read
            # once in order (on the CPU at B = 256, S = 20, F = 512: half the time of the (1, F) @ (F, S) form)
            scores = (keys @ queries.transpose(-1, -2)).transpose(-1, -2)
        else:  # (B, H, T, S) scores, the keys read in place, transposed (for several queries a row, as under beam
            # search, the faster form)
            scores = queries @ keys.transpose(-1, -2)
        return _normalise((scores @ values).transpose(1, 2), eps)  # (B, H, T, d + 1) -> (B, T, H, d)
    check_float_tensor("state", source, 4)
    if source.shape[:3] != (q.shape[0], q.shape[2], q.shape[3]):
        raise ValueError(f"state must be (B, H, F, d + 1) matching q {tuple(q.shape)}, got {tuple(source.shape)}")
    return _normalise((q.to(source.dtype).transpose(1, 2) @ source).transpose(1, 2), eps)  # one batched matmul


@exact_products
def rfa_cross_ref(q, k, v, attention_mask=None, eps=DEFAULT_EPS):
    """Cross attention in quadratic form: out_t = sum_s (q_t . k_s) v_s / max(sum_s q_t . k_s, eps).

    q: (B, T, H, F); k: (B, S, H, F); v: (B, S, H, d); attention_mask: (B, S) or None -> (B, T, H, d).
    """
    acc = _acc_dtype(q, k, v)
    scores = torch.einsum("bthf,bshf->bhts", q.to(acc), k.to(acc))
    if attention_mask is not None:
        scores = scores * attention_mask.to(acc).view(scores.shape[0], 1, 1, -1)
    num = torch.einsum("bhts,bshe->bthe", scores, v.to(acc))
    return num / scores.sum(-1).transpose(1, 2).unsqueeze(-1).clamp_min(eps)
