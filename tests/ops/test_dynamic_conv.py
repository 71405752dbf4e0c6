"""Dynamic / lightweight convolution: compiled kernel and reference against a naive loop, gradients, any K and
padding, dtypes, strides, padding invariance, decoding steps and argument checks; with normalised kernels and with
logits the op normalises itself (softmax=True)."""

import math

import numpy as np
import pytest
import torch

from talk_hf import ops
from tests.utils import DTYPES, assert_close, assert_compiled_matches, grads, noncontiguous, transposed



def conv_naive(x, weight, padding_left):
    B, T, C = x.shape
    H, K = weight.shape[-2:]
    w = weight.expand(B, T, H, K) if weight.dim() == 2 else weight
    out = torch.zeros(B, T, C, dtype=torch.float64)
    for b in range(B):
        for t in range(T):
            for c in range(C):
                h = c // (C // H)
                for k in range(K):
                    s = t + k - padding_left
                    if 0 <= s < T:
                        out[b, t, c] += w[b, t, h, k].double() * x[b, s, c].double()
    return out


def softmax_weights(*shape, dtype=torch.float64, generator=None):
    return torch.randn(*shape, dtype=torch.float64, generator=generator).softmax(-1).to(dtype)


def kernel_weights(*shape, softmax, dtype=torch.float64, generator=None):
    """(weights for the op, the normalised taps it must use): logits (spread wide) with softmax, else normalised."""
    logits = 3 * torch.randn(*shape, dtype=torch.float64, generator=generator)
    return (logits if softmax else logits.softmax(-1)).to(dtype), logits.softmax(-1)


CASES = [  # B, T, C, H, K, P
    pytest.param(2, 13, 6, 3, 3, 1, id="K3-centred"),
    pytest.param(2, 13, 6, 3, 3, 2, id="K3-causal"),
    pytest.param(1, 1, 4, 2, 5, 4, id="T1"),
    pytest.param(2, 4, 4, 4, 31, 30, id="K>T-causal-H=C"),
    pytest.param(1, 9, 3, 1, 4, 2, id="even-K-H1"),
    pytest.param(2, 11, 4, 2, 1, 0, id="K1"),
    pytest.param(1, 7, 4, 2, 3, 0, id="P0-anticausal"),
    pytest.param(1, 7, 4, 2, 3, 6, id="P>K"),
    pytest.param(1, 7, 4, 2, 3, -2, id="P<0"),
    pytest.param(2, 41, 6, 2, 7, 3, id="T41-prime"),
]


SOFTMAX = pytest.mark.parametrize("softmax", [False, True], ids=["normalised", "logits"])


@SOFTMAX
@pytest.mark.parametrize("light", [False, True], ids=["dynamic", "light"])
@pytest.mark.parametrize("B,T,C,H,K,P", CASES)
def test_matches_naive_loop(B, T, C, H, K, P, light, softmax):
    g = torch.Generator().manual_seed(T * 7 + K)
    x = torch.randn(B, T, C, dtype=torch.float64, generator=g)
    w, taps = kernel_weights(*((H, K) if light else (B, T, H, K)), softmax=softmax, generator=g)
    expected = conv_naive(x, taps, P)
    assert_close(ops.dynamic_conv_ref(x, w, P, softmax), expected, name="reference")
    assert_close(ops.dynamic_conv(x, w, P, softmax), expected, name="kernel")


@SOFTMAX
@pytest.mark.parametrize("P", [0, 2, 4, 7])
@pytest.mark.parametrize("fn", [ops.dynamic_conv, ops.dynamic_conv_ref], ids=["kernel", "reference"])
def test_gradcheck(fn, P, softmax):
    g = torch.Generator().manual_seed(P)
    x = torch.randn(2, 8, 6, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(2, 8, 3, 5, dtype=torch.float64, generator=g, requires_grad=True)
    lw = torch.randn(3, 5, dtype=torch.float64, generator=g, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: fn(a, b, P, softmax), (x, w))
    assert torch.autograd.gradcheck(lambda a, b: fn(a, b, P, softmax), (x, lw))


def test_softmax_of_large_logits_stays_finite():
    """Logits far outside exp's range (|l| ~ 1e3): the max is subtracted before exp, as in torch.softmax."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 9, 6, generator=g)
    w = 1000 * torch.randn(2, 9, 3, 5, generator=g)
    out, (gx, gw) = grads(lambda a, b: ops.dynamic_conv(a, b, 2, True), x, w)
    want, (wx, ww) = grads(lambda a, b: ops.dynamic_conv_ref(a, b, 2, True), x.double(), w.double())
    assert torch.isfinite(out).all() and torch.isfinite(gw).all()
    assert_close(out, want, torch.float32)
    assert_close(gx, wx, torch.float32, "grad x")
    assert_close(gw, ww, torch.float32, "grad logits")


NON_FINITE_ROWS = {"nan": [0.3, float("nan"), -0.2], "nan first": [float("nan"), 0.3, -0.2],
                   "+inf": [0.3, float("inf"), -0.2], "all -inf": [float("-inf")] * 3}


@pytest.mark.parametrize("row", list(NON_FINITE_ROWS), ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_softmax_row_that_torch_makes_nan_is_nan(dtype, row):
    """A NaN logit or an infinite maximum makes torch.softmax NaN over the row; the kernels' clamped exp must not
    turn it into finite weights (a diverging run would keep a finite loss)."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn(1, 4, 4, generator=g).to(dtype)
    w = torch.randn(1, 4, 2, 3, generator=g).to(dtype)
    w[0, 2, 0] = torch.tensor(NON_FINITE_ROWS[row])
    light = w[0, 2].clone()
    for got, want in ((ops.dynamic_conv(x, w, 2, True), ops.dynamic_conv_ref(x, w, 2, True)),
                      (ops.light_conv(x, light, 2, True), ops.dynamic_conv_ref(x, light, 2, True)),
                      (ops.dynamic_conv_step(x[:, 2:3], w[:, 2:3], torch.zeros(1, 2, 4, dtype=dtype), softmax=True)[0],
                       ops.dynamic_conv_ref(x, w, 2, True)[:, 2:3])):
        assert torch.equal(got.isnan(), want.isnan()) and want.isnan().any()
    w.requires_grad_()
    ops.dynamic_conv(x, w, 2, True).sum().backward()
    assert w.grad[0, 2, 0].isnan().all()


@pytest.mark.parametrize("weight_dropout", [0.0, 0.25], ids=["", "dropconnect"])
@SOFTMAX
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("light", [False, True], ids=["dynamic", "light"])
def test_dtype_tolerances(dtype, light, softmax, weight_dropout):
    """Kernel and reference in every dtype against the fp64 reference (DropConnect: the same seed's mask)."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 37, 16, dtype=torch.float64, generator=g).to(dtype)
    w, _ = kernel_weights(*((4, 15) if light else (2, 37, 4, 15)), softmax=softmax, generator=g, dtype=dtype)
    seed = torch.tensor(-5)
    out64, grads64 = grads(lambda a, b: ops.dynamic_conv_ref(a, b, 14, softmax, weight_dropout, seed), x.double(),
                           w.double())
    for fn in (ops.dynamic_conv, ops.dynamic_conv_ref):
        out, gs = grads(lambda a, b: fn(a, b, 14, softmax, weight_dropout, seed), x, w)
        assert out.dtype == dtype
        assert_close(out, out64, dtype, "output")
        assert_close(gs[0], grads64[0], dtype, "grad x")
        assert_close(gs[1], grads64[1], dtype, "grad weight")


def test_noncontiguous_inputs():
    x = torch.randn(2, 10, 6, dtype=torch.float64)
    w = softmax_weights(2, 10, 3, 4)
    expected = ops.dynamic_conv_ref(x, w, 3)
    assert_close(ops.dynamic_conv(noncontiguous(x), noncontiguous(w), 3), expected)
    assert_close(ops.dynamic_conv(x.transpose(0, 1).contiguous().transpose(0, 1), w, 3), expected)


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("P", [2, 4], ids=["centred", "causal"])
def test_zero_padding_does_not_change_real_tokens(side, P):
    T, pad = 8, 6
    x = torch.randn(1, T, 4, dtype=torch.float64)
    w = softmax_weights(1, T, 2, 5)
    expected = ops.dynamic_conv(x, w, P)
    spec = (0, 0, pad, 0) if side == "left" else (0, 0, 0, pad)
    real = slice(pad, None) if side == "left" else slice(0, T)
    wp = torch.nn.functional.pad(w, (0, 0, 0, 0) + spec[2:], value=0.2)
    out = ops.dynamic_conv(torch.nn.functional.pad(x, spec), wp, P)
    torch.testing.assert_close(out[:, real], expected, rtol=1e-12, atol=1e-12)


def test_batch_equals_rows_one_at_a_time():
    x = torch.randn(3, 19, 8)
    w = softmax_weights(3, 19, 2, 7, dtype=torch.float32)
    batched = ops.dynamic_conv(x, w, 6)
    for b in range(3):
        assert torch.equal(batched[b : b + 1], ops.dynamic_conv(x[b : b + 1], w[b : b + 1], 6))


@SOFTMAX
@pytest.mark.parametrize("K,split", [(1, 5), (3, 5), (5, 3), (6, 5), (6, 7), (31, 5)])
@pytest.mark.parametrize("light", [False, True], ids=["dynamic", "light"])
def test_steps_equal_causal_op(K, split, light, softmax):
    """Softmax over all K taps then truncation at the start: steps from the K-1 input ring equal the full op,
    whether the prefix is shorter than, as long as, or longer than the ring."""
    T = 20
    x = torch.randn(2, T, 6, dtype=torch.float64)
    w, _ = kernel_weights(*((3, K) if light else (2, T, 3, K)), softmax=softmax)
    wt = (lambda a, b: w) if light else (lambda a, b: w[:, a:b])
    full = ops.dynamic_conv(x, w, K - 1, softmax)
    outs = [ops.dynamic_conv(x[:, :split], wt(0, split), K - 1, softmax)]
    state = ops.dynamic_conv_state_from_prefix(x[:, :split], K)
    for t in range(split, T - 4):
        out, state = ops.dynamic_conv_step(x[:, t : t + 1], wt(t, t + 1), state, softmax)
        assert state.shape == (2, K - 1, 6)
        outs.append(out)
    out, state = ops.dynamic_conv_step(x[:, T - 4 :], wt(T - 4, T), state, softmax)
    outs.append(out)
    torch.testing.assert_close(torch.cat(outs, 1), full, rtol=1e-12, atol=1e-12)
    # from an empty state, token by token
    state, outs = ops.dynamic_conv_init_state(2, 6, K, dtype=torch.float64), []
    for t in range(T):
        out, state = ops.dynamic_conv_step(x[:, t : t + 1], wt(t, t + 1), state, softmax)
        outs.append(out)
    torch.testing.assert_close(torch.cat(outs, 1), full, rtol=1e-12, atol=1e-12)


@SOFTMAX
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("T_new,K,H", [(1, 1, 1), (1, 3, 2), (1, 31, 3), (4, 7, 6), (2, 2, 3)])
def test_compiled_step_matches_its_pytorch_form(dtype, T_new, K, H, softmax):
    """The fused decoding-step kernel against the same math in PyTorch ops (`_dynamic_conv_step_ref`, the autograd
    path), K=1 (empty state) included; the new state is the last K - 1 inputs, exactly."""
    from talk_hf.dynamic_conv import _dynamic_conv_step_ref

    g = torch.Generator().manual_seed(T_new * 100 + K)
    B, C = 3, 6
    x = torch.randn(B, T_new, C, generator=g, dtype=torch.float64).to(dtype)
    w, _ = kernel_weights(B, T_new, H, K, softmax=softmax, generator=g, dtype=dtype)
    state = torch.randn(B, K - 1, C, generator=g, dtype=torch.float64).to(dtype)
    with torch.no_grad():
        out, new_state = torch.ops.talk_hf.dynamic_conv_step(x, w, state, softmax)
        want_out, want_state = _dynamic_conv_step_ref(x, w, state, softmax)
    assert out.dtype == dtype and new_state.dtype == dtype
    assert_close(out, want_out.double(), dtype)
    assert torch.equal(new_state, want_state)


def test_step_uses_the_kernel_without_gradients_and_pytorch_ops_with_them():
    x, w = torch.randn(2, 1, 6), softmax_weights(3, 4, dtype=torch.float32)  # LightConv (H, K) kernels
    state = ops.dynamic_conv_init_state(2, 6, 4)

    def kernel_calls(*args):
        with torch.profiler.profile() as prof:
            ops.dynamic_conv_step(*args, state)
        return sum(e.name == "talk_hf::dynamic_conv_step" for e in prof.events())

    assert kernel_calls(x, w) == 1
    wg = w.clone().requires_grad_()
    assert kernel_calls(x, wg) == 0
    out, _ = ops.dynamic_conv_step(x, wg, state)
    out.sum().backward()
    assert wg.grad is not None and wg.grad.abs().sum() > 0


def test_step_and_init_state_name_a_missing_state_or_a_bad_size():
    x, w = torch.randn(2, 1, 6), softmax_weights(3, 4, dtype=torch.float32)
    with pytest.raises(TypeError, match="state must be a torch.Tensor, got NoneType"):
        ops.dynamic_conv_step(x, w, None)
    with pytest.raises(ValueError, match="state must have 3 dimensions"):
        ops.dynamic_conv_step(x, w, torch.zeros(3, 6))
    with pytest.raises(ValueError, match="kernel_size must be >= 1, got 0"):
        ops.dynamic_conv_init_state(2, 6, 0)
    with pytest.raises(ValueError, match="channels must be >= 0, got -6"):
        ops.dynamic_conv_init_state(2, -6, 3)
    assert ops.dynamic_conv_init_state(np.int64(2), torch.tensor(6), np.int32(3)).shape == (2, 2, 6)  # sizes as torch takes them


def test_step_kernel_checks_its_inputs():
    x, w = torch.randn(2, 1, 6), softmax_weights(2, 1, 3, 4, dtype=torch.float32)
    with pytest.raises(RuntimeError, match=r"state must be \(B, K - 1, C\)"):
        torch.ops.talk_hf.dynamic_conv_step(x, w, torch.zeros(2, 4, 6))
    with pytest.raises(RuntimeError, match="state dtype must match x"):
        torch.ops.talk_hf.dynamic_conv_step(x, w, torch.zeros(2, 3, 6, dtype=torch.float64))


def test_opcheck():
    x = torch.randn(2, 7, 6, requires_grad=True)
    w = softmax_weights(2, 7, 3, 4, dtype=torch.float32).requires_grad_()
    torch.library.opcheck(torch.ops.talk_hf.dynamic_conv_fwd.default, (x, w, 3))
    torch.library.opcheck(torch.ops.talk_hf.dynamic_conv_fwd.default, (x, w, -2))
    torch.library.opcheck(torch.ops.talk_hf.dynamic_conv_bwd.default, (torch.randn(2, 7, 6), x.detach(), w.detach(), 1))
    torch.library.opcheck(torch.ops.talk_hf.dynamic_conv_step.default, (x.detach()[:, :2], w.detach()[:, :2],
                                                                         torch.randn(2, 3, 6)))
    logits = torch.randn(2, 7, 3, 4, requires_grad=True)
    torch.library.opcheck(torch.ops.talk_hf.dynamic_conv_fwd.default, (x, logits, 3, True))
    torch.library.opcheck(torch.ops.talk_hf.dynamic_conv_bwd.default, (torch.randn(2, 7, 6), x.detach(),
                                                                        logits.detach(), 1, True))
    torch.library.opcheck(torch.ops.talk_hf.dynamic_conv_step.default, (x.detach()[:, :2], logits.detach()[:, :2],
                                                                         torch.randn(2, 3, 6), True))


def test_torch_compile_matches_eager():
    x, w = torch.randn(2, 9, 6), softmax_weights(2, 9, 3, 5, dtype=torch.float32)
    compiled = torch.compile(lambda a, b: ops.dynamic_conv(a, b, 4) + 1, fullgraph=True)
    torch.testing.assert_close(compiled(x, w), ops.dynamic_conv(x, w, 4) + 1)


def test_opcheck_with_transposed_inputs():
    """The fake kernels return what the kernels return, contiguous tensors, whatever the inputs' strides."""
    x = transposed(torch.randn(2, 7, 6)).requires_grad_()
    logits = transposed(torch.randn(2, 7, 3, 4)).requires_grad_()
    seed = torch.tensor(5)
    fwd, bwd = torch.ops.talk_hf.dynamic_conv_fwd.default, torch.ops.talk_hf.dynamic_conv_bwd.default
    torch.library.opcheck(fwd, (x, logits, 3, True))
    torch.library.opcheck(fwd, (x, logits, 3, False, seed, 0.2))
    grad_out = transposed(torch.randn(2, 7, 6))
    torch.library.opcheck(bwd, (grad_out, x.detach(), logits.detach(), 1, True))
    torch.library.opcheck(bwd, (grad_out, x.detach(), logits.detach(), 1, True, seed, 0.2))
    torch.library.opcheck(torch.ops.talk_hf.dynamic_conv_step.default,
                          (x.detach()[:, :2], logits.detach()[:, :2], transposed(torch.randn(2, 3, 6)), True))


def test_torch_compile_of_a_channels_first_input():
    """Inductor lays out what follows the op by the fake kernel's strides: a (B, C, T) input transposed to (B, T, C),
    then a reshape that depends on the output's layout; forward and backward."""
    x, logits = torch.randn(2, 6, 9), torch.randn(2, 9, 3, 5)

    def fn(a, b):
        return ops.dynamic_conv(a.transpose(1, 2), b, 4, True).reshape(2, -1)

    assert_compiled_matches(fn, x, logits)


@pytest.mark.parametrize("light", [False, True], ids=["dynamic", "light"])
def test_second_order_gradients_of_the_kernel_raise(light):
    """The kernel's backward has no derivative of its own: a second derivative through it raises instead of being
    zero, and names the reference, which has one."""
    g = torch.Generator().manual_seed(6)
    x = torch.randn(1, 5, 4, dtype=torch.float64, generator=g, requires_grad=True)
    shape = (2, 3) if light else (1, 5, 2, 3)
    w = torch.randn(*shape, dtype=torch.float64, generator=g, requires_grad=True)
    out = ops.dynamic_conv(x, w, 2, True)
    (gx,) = torch.autograd.grad(out.square().sum(), x, create_graph=True)
    torch.testing.assert_close(gx, torch.autograd.grad(out.square().sum(), x, retain_graph=True)[0])
    with pytest.raises(RuntimeError, match=r"dynamic_conv_bwd.*second-order.*dynamic_conv_ref.*"
                                           r"TALK_HF_FORCE_REFERENCE=1"):
        torch.autograd.grad(gx.sum(), w)
    (gx,) = torch.autograd.grad(ops.dynamic_conv_ref(x, w, 2, True).square().sum(), x, create_graph=True)
    assert torch.autograd.grad(gx.sum(), w)[0].abs().sum() > 0


@SOFTMAX
def test_dropconnect_mask_of_an_expanded_weight_is_per_position(softmax, monkeypatch):
    """A (B, T, H, K) weight that is an expand()ed view (strides 0 over B and T) gets a mask per position, as
    documented and as the reference draws it, so both backends and the same weight made contiguous agree, in the
    output and the gradients; an (H, K) LightConv kernel keeps its one mask, and without DropConnect the expanded
    weight reaches the kernel as it is (read in place)."""
    g = torch.Generator().manual_seed(21)
    B, T, C, H, K = 2, 6, 8, 2, 3
    x, kernel = torch.randn(B, T, C, dtype=torch.float64, generator=g), torch.randn(H, K, dtype=torch.float64)
    seed = torch.tensor(1234)

    def conv(fn, dense=False):
        return lambda a, k: fn(a, k.expand(B, T, H, K).contiguous() if dense else k.expand(B, T, H, K), K - 1,
                               softmax, 0.3, seed)

    want, want_grads = grads(conv(ops.dynamic_conv_ref), x, kernel)
    for name, fn in [("kernel", conv(ops.dynamic_conv)), ("kernel, contiguous weight", conv(ops.dynamic_conv, True))]:
        got, got_grads = grads(fn, x, kernel)
        assert_close(got, want, name=name)
        for grad, expected in zip(got_grads, want_grads):
            assert_close(grad, expected, name=f"{name} gradient")
    light = ops.light_conv(x, kernel, K - 1, softmax, 0.3, seed)
    assert_close(light, ops.dynamic_conv_ref(x, kernel, K - 1, softmax, 0.3, seed), name="light")
    assert (light - want).abs().max() > 0.1  # one (H, K) mask is another function
    from talk_hf import dynamic_conv as module

    strides = []
    kernel_op = module._kernels.dynamic_conv
    monkeypatch.setattr(module._kernels, "dynamic_conv", lambda a, w, *rest: strides.append(w.stride()[:2])
                        or kernel_op(a, w, *rest))
    ops.dynamic_conv(x, kernel.expand(B, T, H, K), K - 1, softmax)
    assert strides == [(0, 0)]


@pytest.mark.parametrize("backend", ["compiled", "reference"])
@pytest.mark.parametrize("light", [False, True], ids=["dynamic", "light"])
@pytest.mark.parametrize("B,T", [(0, 7), (2, 0), (0, 0)])
def test_empty_batch_or_sequence(B, T, light, backend, monkeypatch):
    """Zero sizes give empty outputs of the compiled op's shapes, connected to the graph (a backward runs), in the
    compiled op, the reference and the forced-reference path of the public op, with and without DropConnect, for
    any padding; a decoding step over no token keeps the state."""
    K = 4
    x = torch.randn(B, T, 6)
    w = torch.randn(3, K) if light else torch.randn(B, T, 3, K)
    compiled_shape = torch.ops.talk_hf.dynamic_conv_fwd(x, w.expand(B, T, 3, K), K - 1, True).shape
    if backend == "reference":
        monkeypatch.setenv("TALK_HF_FORCE_REFERENCE", "1")
    for P in (K - 1, 1, 0, -2, 6):
        for p in (0.0, 0.3):
            for fn in (ops.dynamic_conv, ops.dynamic_conv_ref):
                out, (gx, gw) = grads(lambda a, b: fn(a, b, P, True, p, torch.tensor(3)), x, w)
                assert (out.shape, gx.shape, gw.shape) == (compiled_shape, x.shape, w.shape), (fn.__name__, P, p)
    for k in (1, K):
        state = torch.randn(B, k - 1, 6)
        step_weight = w[..., :k]
        compiled = torch.ops.talk_hf.dynamic_conv_step(x, step_weight.expand(B, T, 3, k), state, True)
        for p in (0.0, 0.3):
            inputs = [t.clone().requires_grad_() for t in (x, step_weight, state)]
            out, new_state = ops.dynamic_conv_step(*inputs, True, p)
            (out.sum() + new_state.sum()).backward()
            assert (out.shape, new_state.shape) == (compiled[0].shape, compiled[1].shape)
            assert [t.grad.shape for t in inputs] == [t.shape for t in inputs]
            if T == 0:
                assert torch.equal(new_state, state)


BAD_INPUTS = [
    (lambda x, w: ops.dynamic_conv(x[0], w, 1), ValueError, "x must have 3 dimensions"),
    (lambda x, w: ops.dynamic_conv(x, w[0], 1), ValueError, "weight must be"),
    (lambda x, w: ops.dynamic_conv(x, torch.rand(2, 5, 4, 3), 1), ValueError, "divisible"),
    (lambda x, w: ops.dynamic_conv(x, w[:, :4], 1), ValueError, "weight has shape"),
    (lambda x, w: ops.dynamic_conv(x, w.double(), 1), TypeError, "weight has dtype"),
    (lambda x, w: ops.dynamic_conv(x, w, 1.0), TypeError, "padding_left"),
    (lambda x, w: ops.dynamic_conv(x, w[..., :0], 1), ValueError, "K >= 1"),
    (lambda x, w: ops.light_conv(x, w, 1), ValueError, r"\(H, K\)"),
    (lambda x, w: ops.dynamic_conv_step(x, w, torch.zeros(2, 5, 6)), ValueError, "state"),
]


@pytest.mark.parametrize("call,error,match", BAD_INPUTS)
def test_bad_input_names_the_argument(call, error, match):
    with pytest.raises(error, match=match):
        call(torch.randn(2, 5, 6), torch.rand(2, 5, 3, 3))


# ---------------------------------------------------------------------------------------------------------------
# DropConnect inside the op (weight_dropout, seed): the mask of csrc/dropconnect.h and `dropconnect_keep`


def splitmix64_keep(seed, n, p):
    """Tap n's draw, in Python integers (the definition that the int64 tensor arithmetic emulates)."""
    mask = (1 << 64) - 1
    z = (seed + (n + 1) * 0x9E3779B97F4A7C15) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    z ^= z >> 31
    return (z >> 40) < math.ceil((1 - p) * 2**24)


def draws(seed, n, p):
    return ops.dropconnect_keep(torch.tensor(seed), (n,), p)


@pytest.mark.parametrize("seed", [0, 12345, -1, -(2**63), 2**63 - 1])
def test_dropconnect_mask_is_splitmix64(seed):
    """The tensor arithmetic (wrapping products, masked shifts) equals splitmix64 in exact integers, negative seeds
    included (they are 64 bits, read as unsigned)."""
    got = draws(seed, 3000, 0.37)
    want = [splitmix64_keep(seed % 2**64, n, 0.37) for n in range(3000)]
    assert got.tolist() == want


def test_dropconnect_mask_statistics():
    """Keep rate 1 - p within 5 sigma; masks of two seeds agree as independent ones do; neighbouring taps are
    uncorrelated; p = 0 keeps every tap and p = 1 none."""
    n = 1 << 20
    for p in (0.1, 0.5):
        a, b = draws(7, n, p).double(), draws(8, n, p).double()
        sigma = math.sqrt(p * (1 - p) / n)
        assert abs(a.mean().item() - (1 - p)) < 5 * sigma
        agree = (a == b).double().mean().item()
        assert abs(agree - ((1 - p) ** 2 + p**2)) < 5 * math.sqrt(0.25 / n)
        centred = a - a.mean()
        assert abs((centred[1:] * centred[:-1]).mean().item() / centred.var().item()) < 5 / math.sqrt(n)
    assert draws(3, 1000, 0.0).all() and not draws(3, 1000, 1.0).any()


@pytest.mark.parametrize("weight_dropout", [0.3, 1.0])
@SOFTMAX
@pytest.mark.parametrize("light", [False, True], ids=["dynamic", "light"])
@pytest.mark.parametrize("B,T,C,H,K,P", [CASES[0], CASES[3], CASES[9], pytest.param(4, 1, 4, 2, 5, 4, id="T1-B4")])
def test_dropconnect_matches_naive_loop(B, T, C, H, K, P, light, softmax, weight_dropout):
    """Taps = the normalised kernel times keep / (1 - p) (0 for p = 1), the mask of the given (H, K) or (B, T, H, K)
    shape: one mask for every position of a LightConv kernel, also for one position in several rows (where
    expand() keeps the stride of T). Kernel and reference draw the same mask."""
    g = torch.Generator().manual_seed(T * 5 + K)
    x = torch.randn(B, T, C, dtype=torch.float64, generator=g)
    shape = (H, K) if light else (B, T, H, K)
    w, taps = kernel_weights(*shape, softmax=softmax, generator=g)
    seed = torch.tensor(T * 1000 + K)
    keep = ops.dropconnect_keep(seed, shape, weight_dropout)
    assert 0 < keep.sum() < keep.numel() or weight_dropout == 1.0
    scale = 0.0 if weight_dropout == 1.0 else 1 / (1 - weight_dropout)
    expected = conv_naive(x, taps * keep * scale, P)
    assert_close(ops.dynamic_conv_ref(x, w, P, softmax, weight_dropout, seed), expected, name="reference")
    if weight_dropout < 1:
        assert_close(ops.dynamic_conv(x, w, P, softmax, weight_dropout, seed), expected, name="kernel")
    else:
        assert torch.equal(ops.dynamic_conv(x, w, P, softmax, weight_dropout, seed), expected)  # zeros


@SOFTMAX
@pytest.mark.parametrize("fn", [ops.dynamic_conv, ops.dynamic_conv_ref], ids=["kernel", "reference"])
def test_dropconnect_gradcheck(fn, softmax):
    """The backward uses the forward's mask (drawn again from the seed)."""
    g = torch.Generator().manual_seed(11)
    x = torch.randn(2, 8, 6, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(2, 8, 3, 5, dtype=torch.float64, generator=g, requires_grad=True)
    lw = torch.randn(3, 5, dtype=torch.float64, generator=g, requires_grad=True)
    seed = torch.tensor(99)
    assert torch.autograd.gradcheck(lambda a, b: fn(a, b, 2, softmax, 0.4, seed), (x, w))
    assert torch.autograd.gradcheck(lambda a, b: fn(a, b, 4, softmax, 0.4, seed), (x, lw))


def test_dropconnect_seed_comes_from_torch_generator():
    """Without a seed the op draws one from torch's generator: torch.manual_seed repeats the mask, the next call
    draws another; weight_dropout = 0 is the plain op whatever the seed."""
    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(2, 9, 6, generator=g), torch.randn(2, 9, 3, 5, generator=g)
    torch.manual_seed(4)
    first, second = ops.dynamic_conv(x, w, 2, True, 0.5), ops.dynamic_conv(x, w, 2, True, 0.5)
    torch.manual_seed(4)
    again = ops.dynamic_conv_ref(x, w, 2, True, 0.5)
    assert not torch.equal(first, second)
    torch.testing.assert_close(again, first)
    plain = ops.dynamic_conv(x, w, 2, True)
    assert torch.equal(ops.dynamic_conv(x, w, 2, True, 0.0, torch.tensor(3)), plain)


def test_dropconnect_in_a_decoding_step():
    """A decoding step with DropConnect (the PyTorch form runs) uses the mask of the new tokens' (B, 1, H, K) taps."""
    g = torch.Generator().manual_seed(8)
    x = torch.randn(2, 6, 6, generator=g, dtype=torch.float64)
    logits = torch.randn(2, 6, 3, 4, generator=g, dtype=torch.float64)
    state = ops.dynamic_conv_state_from_prefix(x[:, :5], 4)
    seed = torch.tensor(17)
    out, _ = ops.dynamic_conv_step(x[:, 5:], logits[:, 5:], state, True, 0.5, seed)
    keep = ops.dropconnect_keep(seed, (2, 1, 3, 4), 0.5)
    taps = logits[:, 5:].softmax(-1) * keep * 2
    want = torch.einsum("bkhr,bhk->bhr", torch.cat([state, x[:, 5:]], 1).view(2, 4, 3, 2), taps[:, 0])
    torch.testing.assert_close(out[:, 0], want.reshape(2, 6))
    assert 0 < keep.sum() < keep.numel()


def test_dropconnect_opcheck_and_compile():
    x = torch.randn(2, 7, 6, requires_grad=True)
    logits = torch.randn(2, 7, 3, 4, requires_grad=True)
    seed = torch.tensor(5)
    torch.library.opcheck(torch.ops.talk_hf.dynamic_conv_fwd.default, (x, logits, 3, True, seed, 0.2))
    torch.library.opcheck(torch.ops.talk_hf.dynamic_conv_fwd.default, (x, logits, 3, False, seed, 0.2))
    torch.library.opcheck(torch.ops.talk_hf.dynamic_conv_bwd.default, (torch.randn(2, 7, 6), x.detach(),
                                                                        logits.detach(), 1, True, seed, 0.2))
    compiled = torch.compile(lambda a, b, s: ops.dynamic_conv(a, b, 4, True, 0.3, s) + 1, fullgraph=True)
    torch.testing.assert_close(compiled(x, logits, seed), ops.dynamic_conv(x, logits, 4, True, 0.3, seed) + 1)


DROPCONNECT_BAD_INPUTS = [
    (lambda x, w: ops.dynamic_conv(x, w, 1, True, 1.5), ValueError, "weight_dropout must be a probability"),
    (lambda x, w: ops.dynamic_conv(x, w, 1, True, 0.1, torch.tensor(1.0)), ValueError,
     "seed must be a one-element int64"),
    (lambda x, w: ops.dynamic_conv(x, w, 1, True, 0.1, torch.tensor([1, 2])), ValueError, "seed must be"),
    (lambda x, w: torch.ops.talk_hf.dynamic_conv_fwd(x, w, 1, True, None, 0.5), RuntimeError, "needs a seed"),
    (lambda x, w: torch.ops.talk_hf.dynamic_conv_fwd(x, w, 1, True, torch.tensor(1), -0.5), RuntimeError,
     r"weight_dropout must be in \[0, 1\]"),
    (lambda x, w: torch.ops.talk_hf.dynamic_conv_fwd(x, w, 1, True, torch.tensor(1, dtype=torch.int32), 0.5),
     RuntimeError, "one-element int64"),
]


@pytest.mark.parametrize("call,error,match", DROPCONNECT_BAD_INPUTS)
def test_dropconnect_bad_input_names_the_argument(call, error, match):
    with pytest.raises(error, match=match):
        call(torch.randn(2, 5, 6), torch.rand(2, 5, 3, 3))
