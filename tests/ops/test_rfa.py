"""Random feature attention: feature map, the compiled causal kernel and the chunked PyTorch form vs the recurrence
and a quadratic definition, decay gate, gradients (gradcheck, opcheck, torch.compile), decoding steps, cross
attention, precision, memory and argument checks."""

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from talk_hf import ops
from talk_hf.rfa import rfa_causal_chunked, rfa_key_norm_rescale
from tests.utils import REL_TOL, assert_close, rel_err, transposed


def features(B, T, H, F, generator, dtype=torch.float64):
    """Realistic features: the feature map of random vectors (values in [-0.1, 0.1], positive-ish sums)."""
    proj = ops.rfa_random_projection(H, F // 2, 8, generator=generator, dtype=dtype)
    return ops.rfa_feature_map(torch.randn(B, T, H, 8, generator=generator, dtype=dtype), proj)


def causal_naive(q, k, v, decay=None, eps=0.1):
    """Quadratic definition: key j weighs phi(q_i).phi(k_j) * prod_{j <= m < i} decay_m for j <= i."""
    B, T, H, _ = q.shape
    out = torch.zeros(B, T, H, v.shape[-1], dtype=torch.float64)
    for i in range(T):
        w = torch.einsum("bhf,bjhf->bjh", q[:, i].double(), k[:, : i + 1].double())
        if decay is not None:
            for j in range(i + 1):
                w[:, j] *= decay[:, j:i].double().prod(1)
        out[:, i] = torch.einsum("bjh,bjhd->bhd", w, v[:, : i + 1].double()) / w.sum(1).clamp_min(eps).unsqueeze(-1)
    return out


def gate(B, T, H, generator, dtype=torch.float64):
    """Decay factors: 1 except at a few 'separator' positions, where a sigmoid gate value applies."""
    sep = torch.rand(B, T, 1, generator=generator) < 0.25
    g = torch.rand(B, T, H, generator=generator, dtype=torch.float64) * 0.9 + 0.05
    return torch.where(sep, g, torch.ones_like(g)).to(dtype)


def test_feature_map_shape_interleaving_and_norm():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 5, 3, 8, generator=g)
    proj = ops.rfa_random_projection(3, 16, 8, generator=g)
    tau = torch.tensor([1.0, 0.5, 2.0])
    phi = ops.rfa_feature_map(x, proj, tau)
    assert phi.shape == (2, 5, 3, 32) and phi.dtype == torch.float32
    x_hat = x / (x.norm(dim=-1, keepdim=True) + 1e-3)
    u = torch.einsum("bthd,hfd->bthf", x_hat, proj / tau.view(3, 1, 1))
    torch.testing.assert_close(phi[..., 0::2], 0.1 * torch.sin(u))
    torch.testing.assert_close(phi[..., 1::2], 0.1 * torch.cos(u))
    torch.testing.assert_close((phi * phi).sum(-1), torch.full((2, 5, 3), 0.01 * 16))


FEATURE_CASES = [  # B, T, H, d, D
    pytest.param(8, 1, 4, 64, 256, id="decoding-step"),
    pytest.param(2, 37, 3, 7, 5, id="T37-odd-d"),
    pytest.param(1, 1, 1, 1, 1, id="all-one"),
    pytest.param(3, 4, 2, 16, 300, id="D300"),
]


@pytest.mark.parametrize("with_tau", [True, False], ids=["tau", "no-tau"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("B,T,H,d,D", FEATURE_CASES)
def test_feature_map_kernel_matches_reference(B, T, H, d, D, dtype, with_tau):
    """The compiled feature map (what decoding runs: no gradient) against the PyTorch form, in the accumulation dtype
    (fp32 features for fp32/bf16/fp16 x); batch rows computed alone give the same features to within rounding (the
    projections are one matrix product, whose blocking depends on the number of rows)."""
    g = torch.Generator().manual_seed(B * T + d + D)
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    x = torch.randn(B, T, H, d, generator=g, dtype=torch.float64).to(dtype)
    proj = ops.rfa_random_projection(H, D, d, generator=g, dtype=acc)
    tau = torch.rand(H, generator=g, dtype=acc) + 0.3 if with_tau else None
    with torch.no_grad():
        got = ops.rfa_feature_map(x, proj, tau)
    expected = ops.rfa_feature_map_ref(x, proj, tau)
    assert got.shape == (B, T, H, 2 * D) and got.dtype == expected.dtype == acc
    assert rel_err(got, expected) <= REL_TOL[acc], rel_err(got, expected)
    with torch.no_grad():
        rows = torch.cat([ops.rfa_feature_map(x[b : b + 1], proj, tau) for b in range(B)])
    assert rel_err(rows, got) <= REL_TOL[acc], rel_err(rows, got)


@pytest.mark.parametrize("dtype,reach", [(torch.float32, 8000.0), (torch.float64, 1e8)], ids=["fp32", "fp64"])
def test_feature_map_kernel_sine_and_cosine_over_a_wide_range(dtype, reach):
    check_feature_map_sine_and_cosine(dtype, reach, torch.device("cpu"))


def check_feature_map_sine_and_cosine(dtype, reach, device):
    """The kernel's sine and cosine (polynomials after a reduction by pi/2, csrc/rfa_features.h) against float64
    truth for |u| up to 8,000 (fp32) or 1e8 (fp64). With d = 1 and x = 1 the projection is u = w * (1 / 1.001) in
    the input dtype, one rounding, so the truth is known exactly. (tests/ops/test_cuda_kernels.py runs it on CUDA.)"""
    w = torch.linspace(-reach, reach, 200_003, dtype=torch.float64).to(dtype).view(1, -1, 1)
    x = torch.ones(1, 1, 1, 1, dtype=dtype)
    with torch.no_grad():
        phi = ops.rfa_feature_map(x.to(device), w.to(device)).cpu().double().view(-1, 2)
    u = (w.view(-1) * (1 / torch.tensor(1.001, dtype=dtype))).double()
    ulp = torch.finfo(dtype).eps
    assert (phi[:, 0] - 0.1 * torch.sin(u)).abs().max() <= 0.1 * 2 * ulp
    assert (phi[:, 1] - 0.1 * torch.cos(u)).abs().max() <= 0.1 * 2 * ulp


@pytest.mark.parametrize("dtype,top", [(torch.float32, 38), (torch.float64, 300)], ids=["fp32", "fp64"])
def test_feature_map_kernel_stays_bounded_past_its_reduction_and_passes_inf_and_nan(dtype, top):
    check_feature_map_bounded(dtype, top, torch.device("cpu"))


def check_feature_map_bounded(dtype, top, device):
    """Past |u| = 2^22 (fp32) / 2^31 (fp64) the reduction by pi/2 no longer yields a whole quadrant number: the kernel
    holds u there, so features stay within 0.1 (a temperature near 0 gives such u), and inf or NaN give NaN as the
    reference's torch.sin does. (tests/ops/test_cuda_kernels.py runs it on CUDA.)"""
    w = torch.logspace(3, top, 100_001, dtype=torch.float64)
    w = torch.cat([w, -w]).to(dtype).view(1, -1, 1)
    x = torch.ones(1, 1, 1, 1, dtype=dtype)
    with torch.no_grad():
        phi = ops.rfa_feature_map(x.to(device), w.to(device)).cpu()
    assert phi.isfinite().all() and phi.abs().max() <= 0.1 * (1 + 4 * torch.finfo(dtype).eps)
    special = torch.tensor([float("inf"), -float("inf"), float("nan"), 1.0], dtype=dtype).view(1, -1, 1)
    with torch.no_grad():
        got = ops.rfa_feature_map(x.to(device), special.to(device)).cpu()
        expected = ops.rfa_feature_map_ref(x, special)
    assert torch.equal(got.isnan(), expected.isnan()) and got.isnan().sum() == 6
    assert torch.allclose(got[..., 6:], expected[..., 6:])


def test_feature_map_uses_the_kernel_without_gradients_and_pytorch_ops_with_them():
    from torch.profiler import profile

    g = torch.Generator().manual_seed(5)
    x, proj = torch.randn(2, 3, 2, 8, generator=g), ops.rfa_random_projection(2, 4, 8, generator=g)
    tau = torch.ones(2, requires_grad=True)

    def kernel_calls(*args):
        with profile() as prof:
            out = ops.rfa_feature_map(*args)
        return sum(e.name == "talk_hf::rfa_feature_map" for e in prof.events()), out

    assert kernel_calls(x, proj)[0] == 1
    with torch.no_grad():
        assert kernel_calls(x, proj, tau)[0] == 1
    calls, out = kernel_calls(x, proj, tau)  # tau requires grad: the differentiable PyTorch form
    assert calls == 0 and out.requires_grad
    out.sum().backward()
    assert tau.grad is not None and tau.grad.abs().sum() > 0


def test_feature_map_with_gradients_equals_the_reference_and_is_laid_out_by_head():
    """The differentiable form (its backward reads the saved sin/cos output instead of recomputing them) gives the
    reference's values and gradients for x, the projection and tau (fp64 gradcheck), odd sizes; its (B, T, H, 2D)
    result is a view of (B, H, T, 2D) memory, which the attention's per-head products read without a copy."""
    g = torch.Generator().manual_seed(23)
    B, T, H, d, D = 3, 5, 2, 7, 3
    x = torch.randn(B, T, H, d, generator=g, dtype=torch.float64, requires_grad=True)
    proj = ops.rfa_random_projection(H, D, d, generator=g, dtype=torch.float64).requires_grad_()
    tau = (torch.rand(H, generator=g, dtype=torch.float64) + 0.5).requires_grad_()
    out = ops.rfa_feature_map(x, proj, tau)
    expected = ops.rfa_feature_map_ref(x, proj, tau)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-14)
    assert out.shape == (B, T, H, 2 * D) and out.transpose(1, 2).is_contiguous()
    grad = torch.randn(out.shape, generator=g, dtype=torch.float64)
    got = torch.autograd.grad(out, (x, proj, tau), grad)
    want = torch.autograd.grad(expected, (x, proj, tau), grad)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    assert torch.autograd.gradcheck(ops.rfa_feature_map, (x, proj, tau))


def test_feature_map_opcheck_and_kernel_checks():
    g = torch.Generator().manual_seed(6)
    x, proj, tau = torch.randn(2, 3, 2, 8, generator=g), torch.randn(2, 4, 8, generator=g), torch.rand(2, generator=g)
    torch.library.opcheck(torch.ops.talk_hf.rfa_feature_map.default, (x, proj, tau))
    torch.library.opcheck(torch.ops.talk_hf.rfa_feature_map.default, (x, proj, None))
    with pytest.raises(RuntimeError, match="fp32 or fp64"):
        torch.ops.talk_hf.rfa_feature_map(x.bfloat16(), proj.bfloat16(), None)
    with pytest.raises(RuntimeError, match="projection dtype must match x"):
        torch.ops.talk_hf.rfa_feature_map(x, proj.double(), None)
    with pytest.raises(RuntimeError, match=r"tau must be \(H,\)"):
        torch.ops.talk_hf.rfa_feature_map(x, proj, torch.ones(3))


def test_feature_map_approximates_a_softmax_kernel():
    """phi(q).phi(k) ~= 0.01 D exp(-|q^ - k^|^2 / (2 tau^2)) for many random frequencies."""
    g = torch.Generator().manual_seed(1)
    D, tau = 20_000, 0.7
    q, k = (torch.randn(1, 6, 1, 8, generator=g, dtype=torch.float64),
            torch.randn(1, 6, 1, 8, generator=g, dtype=torch.float64))
    proj = ops.rfa_random_projection(1, D, 8, generator=g, dtype=torch.float64)
    t = torch.tensor([tau], dtype=torch.float64)
    approx = (ops.rfa_feature_map(q, proj, t) * ops.rfa_feature_map(k, proj, t)).sum(-1)
    qh, kh = q / (q.norm(dim=-1, keepdim=True) + 1e-3), k / (k.norm(dim=-1, keepdim=True) + 1e-3)
    exact = 0.01 * D * torch.exp(-((qh - kh) ** 2).sum(-1) / (2 * tau**2))
    assert (approx - exact).abs().max() < 0.03 * 0.01 * D


# The compiled kernels (CPU in CI; tests/ops/test_backend.py asserts they are built) and the chunked matmul form
# must both compute the recurrence; ops.rfa_causal dispatches between them.
CAUSAL = [pytest.param(ops.rfa_causal, id="dispatch"), pytest.param(ops.rfa_causal_compiled, id="compiled"),
          pytest.param(rfa_causal_chunked, id="chunked")]
GRAD_PATHS = [pytest.param(ops.rfa_causal_compiled, id="compiled"), pytest.param(rfa_causal_chunked, id="chunked")]

CASES = [  # B, T, H, F, d, chunk
    pytest.param(2, 1, 2, 8, 4, 64, id="T1"),
    pytest.param(2, 13, 2, 8, 4, 64, id="T13-one-chunk"),
    pytest.param(1, 29, 3, 6, 5, 4, id="T29-chunk4"),
    pytest.param(2, 16, 1, 4, 3, 16, id="T=chunk"),
    pytest.param(1, 9, 2, 4, 3, 1, id="chunk1"),
]


@pytest.mark.parametrize("causal", CAUSAL)
@pytest.mark.parametrize("gated", [False, True], ids=["plain", "gated"])
@pytest.mark.parametrize("B,T,H,F,d,chunk", CASES)
def test_causal_matches_recurrence_and_definition(B, T, H, F, d, chunk, gated, causal):
    g = torch.Generator().manual_seed(T + F)
    q, k = features(B, T, H, F, g), features(B, T, H, F, g)
    v = torch.randn(B, T, H, d, generator=g, dtype=torch.float64)
    decay = gate(B, T, H, g) if gated else None
    expected = causal_naive(q, k, v, decay)
    ref, ref_state = ops.rfa_causal_ref(q, k, v, decay)
    out, state = causal(q, k, v, decay, chunk_size=chunk)
    assert_close(ref, expected, name="recurrence")
    assert_close(out, expected, name="fast path")
    assert_close(state, ref_state, name="final state")


@pytest.mark.parametrize("causal", GRAD_PATHS)
@pytest.mark.parametrize("T,chunk", [(1, 4), (7, 3), (12, 4), (5, 64)])
def test_gradcheck_all_inputs_and_final_state(causal, T, chunk):
    """Gradients w.r.t. q, k, v, decay and the initial state, through both the outputs and the final state."""
    g = torch.Generator().manual_seed(2 + T)
    q, k = features(1, T, 2, 4, g).requires_grad_(), features(1, T, 2, 4, g).requires_grad_()
    v = torch.randn(1, T, 2, 3, generator=g, dtype=torch.float64, requires_grad=True)
    decay = gate(1, T, 2, g).requires_grad_()
    initial = (0.1 * torch.randn(1, 2, 4, 4, generator=g, dtype=torch.float64)).requires_grad_()
    assert torch.autograd.gradcheck(lambda *a: causal(*a, chunk_size=chunk), (q, k, v, decay, initial))
    assert torch.autograd.gradcheck(lambda *a: causal(*a, chunk_size=chunk)[0], (q, k, v))


def results_and_grads(fn, inputs, dtype):
    """[out, final state, grad q, k, v, decay, initial state] of fn(q, k, v, decay, initial state) in `dtype`, for a
    loss reaching the outputs (random weights) and the final state."""
    inputs = [t.detach().to(dtype).requires_grad_() for t in inputs]
    out, state = fn(*inputs)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    ((out.double() * w).sum() + state.double().sum()).backward()
    return [out.detach(), state.detach()] + [t.grad for t in inputs]


@pytest.mark.parametrize("causal", CAUSAL)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_exact_zero_decays_keep_their_gradients(causal, dtype):
    """A decay of exactly 0 (a state reset) is an ordinary point of the function: the outputs, the final state and
    every gradient, the decays' own included, match the fp64 recurrence (zeros alone, in runs, at chunk ends and
    starts, and exact ones). The chunked form multiplies decays instead of exponentiating log-decay sums, which gave
    those decays a zero gradient and lost ~1e-5 of fp32 accuracy near log(FLT_MIN)."""
    g = torch.Generator().manual_seed(21)
    B, T, H, F, d, chunk = 2, 45, 2, 6, 4, 8
    q, k = features(B, T, H, F, g), features(B, T, H, F, g)
    v = torch.randn(B, T, H, d, generator=g, dtype=torch.float64)
    initial = 0.1 * torch.randn(B, H, F, d + 1, generator=g, dtype=torch.float64)
    r, u = torch.rand(B, T, H, generator=g, dtype=torch.float64), torch.rand(B, T, H, generator=g, dtype=torch.float64)
    decay = torch.where(r < 0.15, 0.0, torch.where(r < 0.6, 1.0, u))
    decay[0, [7, 8, 15, 16, 17, 30], 0] = 0.0  # chunk end, next chunk's start, a run across a chunk boundary
    assert (decay == 0).sum() >= 10

    expected = results_and_grads(ops.rfa_causal_ref, (q, k, v, decay, initial), torch.float64)
    got = results_and_grads(lambda *a: causal(*a, chunk_size=chunk), (q, k, v, decay, initial), dtype)
    for name, a, b in zip(["out", "state", "q", "k", "v", "decay", "initial"], got, expected):
        assert rel_err(a, b) <= REL_TOL[dtype] * (10 if dtype == torch.float32 else 1), name
    assert (expected[5][decay == 0] != 0).all()  # the gradients that were lost were not zero


def test_compiled_gradients_match_reference_on_long_gated_sequences():
    """fp32 kernel gradients over many chunks (T=300, chunk 64) against the float64 recurrence."""
    g = torch.Generator().manual_seed(9)
    B, T, H, F, d = 2, 300, 2, 16, 8
    q, k = features(B, T, H, F, g), features(B, T, H, F, g)
    v, decay = torch.randn(B, T, H, d, generator=g, dtype=torch.float64), gate(B, T, H, g)
    initial = 0.1 * torch.randn(B, H, F, d + 1, generator=g, dtype=torch.float64)

    expected = results_and_grads(ops.rfa_causal_ref, (q, k, v, decay, initial), torch.float64)
    got = results_and_grads(lambda *a: ops.rfa_causal_compiled(*a, chunk_size=64), (q, k, v, decay, initial),
                            torch.float32)
    for name, a, b in zip(["out", "state", "q", "k", "v", "decay", "initial"], got, expected):
        assert a.dtype == torch.float32
        assert rel_err(a, b) <= REL_TOL[torch.float32] * 10, name  # 300 sequential fp32 updates


def test_opcheck():
    g = torch.Generator().manual_seed(10)
    q, k = features(2, 9, 2, 4, g, torch.float32), features(2, 9, 2, 4, g, torch.float32)
    v, decay = torch.randn(2, 9, 2, 3, generator=g), gate(2, 9, 2, g, torch.float32)
    initial = torch.randn(2, 2, 4, 4, generator=g) * 0.1
    grad = lambda t: t.clone().requires_grad_()  # noqa: E731
    fwd = torch.ops.talk_hf.rfa_causal_fwd.default
    torch.library.opcheck(fwd, (grad(q), grad(k), grad(v), grad(decay), grad(initial), 0.1, 4))
    torch.library.opcheck(fwd, (grad(q), grad(k), grad(v), None, None, 0.1, 64))
    _, _, checkpoints = fwd(q, k, v, decay, initial, 0.1, 4)
    torch.library.opcheck(torch.ops.talk_hf.rfa_causal_bwd.default,
                          (torch.randn(2, 9, 2, 3), torch.randn(2, 2, 4, 4), q, k, v, decay, initial, checkpoints,
                           0.1, 4))
    torch.library.opcheck(torch.ops.talk_hf.rfa_causal_bwd.default,
                          (torch.randn(2, 9, 2, 3), None, q, k, v, None, None, fwd(q, k, v, None, None, 0.1, 4)[2],
                           0.1, 4))
    torch.library.opcheck(fwd, (q, k, v, decay, initial, 0.1, 0))  # chunk 0: inference, no states saved
    torch.library.opcheck(fwd, (grad(q), grad(k), grad(v), grad(decay), grad(initial), 0.1, 4, True))  # tf32


def test_tf32_changes_nothing_on_cpu_and_rfa_causal_never_asks_for_it(monkeypatch):
    """`tf32` (tensor-core products, CUDA only) changes nothing on the CPU, forward or backward, and `rfa_causal`
    never asks for it, for half-precision v or with TF32 allowed (tests/ops/test_cuda_kernels.py checks the CUDA
    kernels it launches)."""
    from talk_hf import rfa

    g = torch.Generator().manual_seed(14)
    q, k = features(2, 9, 2, 4, g, torch.float32), features(2, 9, 2, 4, g, torch.float32)
    v, decay = torch.randn(2, 9, 2, 3, generator=g), gate(2, 9, 2, g, torch.float32)
    fwd, bwd = torch.ops.talk_hf.rfa_causal_fwd, torch.ops.talk_hf.rfa_causal_bwd
    exact, tf32 = fwd(q, k, v, decay, None, 0.1, 4), fwd(q, k, v, decay, None, 0.1, 4, True)
    assert all(torch.equal(a, b) for a, b in zip(exact, tf32))
    go = torch.randn_like(v)
    grads = [bwd(go, None, q, k, v, decay, None, exact[2], 0.1, 4, flag) for flag in (False, True)]
    assert all(torch.equal(a, b) for a, b in zip(*grads))
    asked = []
    kernel = rfa._kernels.rfa_causal
    monkeypatch.setattr(rfa._kernels, "rfa_causal", lambda *a, **kw: asked.append(a[7:] + tuple(kw.values()))
                        or kernel(*a, **kw))
    previous = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        with torch.no_grad():
            for values in (v, v.bfloat16(), v.half()):
                rfa.rfa_causal(q, k, values, decay)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    assert asked == [()] * 3  # the op's default, tf32=False


@pytest.mark.parametrize("backend", ["compiled", "reference"])
@pytest.mark.parametrize("T,gated", [(1, True), (1, False), (5, True)])
def test_in_place_step_advances_the_state_buffer(T, gated, backend, monkeypatch):
    """rfa_step_ (decoding) gives rfa_step's outputs and writes its new state into the state tensor itself (same
    storage), with the kernels and with the PyTorch fallback."""
    if backend == "reference":
        monkeypatch.setenv("TALK_HF_FORCE_REFERENCE", "1")
    g = torch.Generator().manual_seed(T + gated)
    B, H, F, d = 2, 3, 8, 4
    q, k = features(B, T, H, F, g, torch.float32), features(B, T, H, F, g, torch.float32)
    v = torch.randn(B, T, H, d, generator=g)
    decay = gate(B, T, H, g, torch.float32) if gated else None
    state = 0.1 * torch.randn(B, H, F, d + 1, generator=g)
    want, want_state = ops.rfa_step(q, k, v, state.clone(), decay)
    address = state.data_ptr()
    out = ops.rfa_step_(q, k, v, state, decay)
    assert state.data_ptr() == address
    torch.testing.assert_close(out, want, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(state, want_state, rtol=1e-6, atol=1e-7)


def test_in_place_step_refuses_what_it_cannot_update():
    g = torch.Generator().manual_seed(3)
    q, v = features(1, 1, 2, 4, g, torch.float32), torch.randn(1, 1, 2, 3, generator=g)
    state = torch.zeros(1, 2, 4, 4)
    with pytest.raises(ValueError, match="contiguous torch.float32 tensor, got torch.bfloat16"):
        ops.rfa_step_(q, q, v, state.bfloat16())  # the step's sums are fp32: a bf16 state cannot hold them
    with pytest.raises(ValueError, match="not contiguous"):
        ops.rfa_step_(q, q, v, torch.zeros(1, 2, 4, 4).transpose(2, 3).contiguous().transpose(2, 3))
    with pytest.raises(ValueError, match="no autograd"):
        ops.rfa_step_(q, q, v.requires_grad_(), state)
    with pytest.raises(RuntimeError, match="state must be contiguous"):  # the op's own check
        torch.ops.talk_hf.rfa_causal_step_(q, q, v.detach(), None, torch.zeros(1, 2, 4, 4).transpose(2, 3), 0.1)


def test_in_place_step_opcheck_and_compile():
    g = torch.Generator().manual_seed(4)
    q, k = features(2, 1, 2, 4, g, torch.float32), features(2, 1, 2, 4, g, torch.float32)
    v, decay = torch.randn(2, 1, 2, 3, generator=g), gate(2, 1, 2, g, torch.float32)
    state = 0.1 * torch.randn(2, 2, 4, 4, generator=g)
    torch.library.opcheck(torch.ops.talk_hf.rfa_causal_step_.default, (q, k, v, decay, state.clone(), 0.1))
    want, want_state = ops.rfa_step(q, k, v, state.clone(), decay)
    compiled = torch.compile(lambda *a: ops.rfa_step_(*a) * 2, fullgraph=True)
    out = compiled(q, k, v, state, decay)
    torch.testing.assert_close(out, 2 * want)
    torch.testing.assert_close(state, want_state)


def test_inference_saves_no_states_and_refuses_a_backward():
    g = torch.Generator().manual_seed(13)
    q, k = features(2, 9, 2, 4, g, torch.float32), features(2, 9, 2, 4, g, torch.float32)
    v = torch.randn(2, 9, 2, 3, generator=g)
    fwd = torch.ops.talk_hf.rfa_causal_fwd.default
    out, state, saved = fwd(q, k, v, None, None, 0.1, 0)
    reference_out, reference_state, checkpoints = fwd(q, k, v, None, None, 0.1, 4)
    assert saved.shape == (2, 2, 0, 4, 4) and checkpoints.shape == (2, 2, 3, 4, 4)
    torch.testing.assert_close(out, reference_out, rtol=0, atol=0)
    torch.testing.assert_close(state, reference_state, rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="chunk must be >= 1"):
        torch.ops.talk_hf.rfa_causal_bwd(torch.ones_like(out), None, q, k, v, None, None, saved, 0.1, 0)


def test_dispatch_uses_the_kernel_for_inference_and_training(monkeypatch):
    """The compiled recurrence with or without gradients (forward + backward with every gradient is faster than the
    chunked form's, docs/kernels.md); the chunked form where the kernels are not used (TALK_HF_FORCE_REFERENCE)."""
    from torch.profiler import profile

    g = torch.Generator().manual_seed(12)
    q, v = features(1, 9, 2, 4, g, torch.float32), torch.randn(1, 9, 2, 3, generator=g)

    def kernel_calls(*args):
        with profile() as prof:
            ops.rfa_causal(*args)
        return sum(e.name == "talk_hf::rfa_causal_fwd" for e in prof.events())

    assert kernel_calls(q, q, v) == 1
    with torch.no_grad():
        assert kernel_calls(q, q, v.requires_grad_()) == 1
    assert kernel_calls(q, q, v) == 1  # v requires grad now
    monkeypatch.setenv("TALK_HF_FORCE_REFERENCE", "1")
    assert kernel_calls(q, q, v) == 0


def test_torch_compile_matches_eager():
    g = torch.Generator().manual_seed(11)
    q, k = features(2, 9, 2, 4, g, torch.float32), features(2, 9, 2, 4, g, torch.float32)
    v, decay = torch.randn(2, 9, 2, 3, generator=g), gate(2, 9, 2, g, torch.float32)
    compiled = torch.compile(lambda *a: ops.rfa_causal(*a)[0] * 2, fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v, decay), ops.rfa_causal(q, k, v, decay)[0] * 2)


def test_steps_equal_full_and_chunked_prefill():
    g = torch.Generator().manual_seed(3)
    B, T, H, F, d = 2, 21, 2, 8, 4
    q, k = features(B, T, H, F, g), features(B, T, H, F, g)
    v, decay = torch.randn(B, T, H, d, generator=g, dtype=torch.float64), gate(B, T, H, g)
    full, full_state = ops.rfa_causal(q, k, v, decay, chunk_size=4)
    out, state = ops.rfa_causal(q[:, :8], k[:, :8], v[:, :8], decay[:, :8], chunk_size=4)
    outs = [out]
    for t in range(8, T):
        out, state = ops.rfa_step(q[:, t : t + 1], k[:, t : t + 1], v[:, t : t + 1], state, decay[:, t : t + 1])
        assert state.shape == (B, H, F, d + 1)
        outs.append(out)
    torch.testing.assert_close(torch.cat(outs, 1), full, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(state, full_state, rtol=1e-10, atol=1e-12)
    state = ops.rfa_init_state(B, H, F, d, dtype=torch.float64)  # chunked continuation from an existing state
    a, state = ops.rfa_step(q[:, :5], k[:, :5], v[:, :5], state, decay[:, :5])
    b, _ = ops.rfa_step(q[:, 5:], k[:, 5:], v[:, 5:], state, decay[:, 5:])
    torch.testing.assert_close(torch.cat([a, b], 1), full, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("causal", CAUSAL)
def test_low_precision_values_keep_fp32_state(causal):
    g = torch.Generator().manual_seed(4)
    q, k = features(2, 40, 2, 8, g, torch.float32), features(2, 40, 2, 8, g, torch.float32)
    v = torch.randn(2, 40, 2, 4, generator=g).bfloat16()
    out, state = causal(q, k, v, chunk_size=16)
    assert out.dtype == torch.bfloat16 and state.dtype == torch.float32
    expected, _ = ops.rfa_causal_ref(q.double(), k.double(), v.double())
    assert rel_err(out, expected) <= REL_TOL[torch.bfloat16]


@pytest.mark.parametrize("causal", CAUSAL)
def test_denominator_guard(causal):
    """Sin/cos features can make phi(q).z negative; the normaliser is clamped at eps = 0.1 (§C.3)."""
    q = torch.tensor([[[[1.0, 0.0]]], [[[0.0, 1.0]]]], dtype=torch.float64).view(1, 2, 1, 2)
    k = torch.tensor([[-0.05, 0.0], [0.0, 0.02]], dtype=torch.float64).view(1, 2, 1, 2)
    v = torch.tensor([[2.0], [3.0]], dtype=torch.float64).view(1, 2, 1, 1)
    out, _ = causal(q, k, v)
    torch.testing.assert_close(out.flatten(), torch.tensor([-0.05 * 2 / 0.1, 0.02 * 3 / 0.1], dtype=torch.float64))


class MaxNumel(TorchDispatchMode):
    """Records the largest tensor any op produces."""

    def __init__(self):
        super().__init__()
        self.max_numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.max_numel = max(self.max_numel, t.numel())
        return out


@pytest.mark.parametrize("causal", CAUSAL)
def test_causal_never_materialises_t_by_t_or_per_token_states(causal):
    B, T, H, F, d = 1, 4096, 1, 64, 32
    g = torch.Generator().manual_seed(5)
    q, k, v = features(B, T, H, F, g, torch.float32), features(B, T, H, F, g, torch.float32), torch.randn(B, T, H, d)
    decay = gate(B, T, H, g, torch.float32)
    with MaxNumel() as mode:
        causal(q, k, v, decay, chunk_size=64)
    assert mode.max_numel <= T * max(64, F)  # (chunk x chunk) score blocks and chunked inputs: linear in T
    assert mode.max_numel < T * T // 16 and mode.max_numel < T * F * (d + 1) // 8  # T x T, or a state per token


@pytest.mark.parametrize("causal", CAUSAL)
def test_right_padding_with_zero_keys_keeps_real_outputs(causal):
    """Padded steps with zero key features (and any query/value) leave the real outputs and their states alone."""
    g = torch.Generator().manual_seed(6)
    q, k, v = (features(1, 10, 2, 8, g), features(1, 10, 2, 8, g),
               torch.randn(1, 10, 2, 3, generator=g, dtype=torch.float64))
    expected, state = causal(q, k, v, chunk_size=4)
    junk = lambda t: torch.cat([t, torch.rand(1, 7, *t.shape[2:], generator=g, dtype=t.dtype)], 1)  # noqa: E731
    k_padded = torch.cat([k, torch.zeros(1, 7, 2, 8, dtype=k.dtype)], 1)
    out, padded_state = causal(junk(q), k_padded, junk(v), chunk_size=4)
    torch.testing.assert_close(out[:, :10], expected, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(padded_state, state, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("causal", CAUSAL)
def test_batch_equals_rows_one_at_a_time(causal):
    g = torch.Generator().manual_seed(7)
    q, k, v = (features(3, 19, 2, 8, g, torch.float32), features(3, 19, 2, 8, g, torch.float32),
               torch.randn(3, 19, 2, 4, generator=g))
    decay = gate(3, 19, 2, g, torch.float32)
    batched, _ = causal(q, k, v, decay, chunk_size=8)
    for b in range(3):
        row, _ = causal(q[b : b + 1], k[b : b + 1], v[b : b + 1], decay[b : b + 1], chunk_size=8)
        torch.testing.assert_close(batched[b : b + 1], row, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("T", [1, 5])
@pytest.mark.parametrize("S,form", [(3, "keys"), (4, "state")])
def test_cross_source_takes_the_smaller_form(S, form, T):
    """F = 16, d + 1 = 4: the state holds 64 numbers per (batch, head), the keys and values 20 per token, so a source
    of 3 tokens is kept as keys and values and one of 4 as the state; either gives the quadratic form's result (with
    a padded row), for one query per row (decoding) and several, and gradients flow through both forms (to the key
    scale too)."""
    g = torch.Generator().manual_seed(18)
    B, H, F, d = 2, 2, 16, 3
    q, k = features(B, T, H, F, g), features(B, S, H, F, g)
    v = torch.randn(B, S, H, d, generator=g, dtype=torch.float64)
    mask = torch.ones(B, S, dtype=torch.long)
    mask[1, -1] = 0
    source = ops.rfa_cross_source(k, v, mask)
    if form == "keys":
        keys, values = source
        assert keys.shape == (B, H, S, F) and values.shape == (B, H, S, d + 1)
        assert (keys[1, :, -1] == 0).all() and (values[..., -1] == 1).all()
    else:
        torch.testing.assert_close(source, ops.rfa_cross_state(k, v, mask), rtol=0, atol=0)
    assert_close(ops.rfa_cross(q, source), ops.rfa_cross_ref(q, k, v, mask))
    scale = torch.rand(B, S, H, 1, generator=g, dtype=torch.float64) + 0.5  # key_scale: the norm rescaling
    scaled = ops.rfa_cross_source(k, v, mask, key_scale=scale)
    assert_close(ops.rfa_cross(q, scaled), ops.rfa_cross_ref(q, k * scale, v, mask))
    check = lambda q, k, v, scale: ops.rfa_cross(q, ops.rfa_cross_source(k, v, mask, key_scale=scale))  # noqa: E731
    inputs = (q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), scale.requires_grad_())
    assert torch.autograd.gradcheck(check, inputs)


class _SourceLogits(torch.nn.Module):
    """A seq2seq model's forward without a cache -> its logits alone (for torch.export)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, decoder_input_ids):
        return self.model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids,
                          use_cache=False).logits


def test_an_rfa_doc_model_exports_with_a_source_length_on_both_sides_of_the_smaller_form():
    """In the tiny RFA-doc model (F = 16, d + 1 = 9) the keys and values of a source are smaller than its state below
    144 / 25 tokens: exported with a source length free across that bound, the program takes no guard on it and
    gives the eager logits for sources on both sides."""
    from tests.models.tiny import make, source_batch, target_batch

    model, decoder_ids = make("rfa_doc"), target_batch()
    length = torch.export.Dim("source_length", min=2, max=32)
    with torch.no_grad():
        exported = torch.export.export(_SourceLogits(model), (*source_batch(length=9), decoder_ids),
                                       dynamic_shapes=({1: length}, {1: length}, None), strict=False).module()
        for S in (4, 9):
            ids, mask = source_batch(length=S, seed=S)
            want = model(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder_ids, use_cache=False).logits
            torch.testing.assert_close(exported(ids, mask, decoder_ids), want)


def test_cross_attention_matches_quadratic_form_and_ignores_padding():
    g = torch.Generator().manual_seed(8)
    B, T, S, H, F, d = 2, 5, 9, 2, 8, 4
    q, k = features(B, T, H, F, g), features(B, S, H, F, g)
    v = torch.randn(B, S, H, d, generator=g, dtype=torch.float64)
    mask = torch.ones(B, S, dtype=torch.long)
    mask[1, 6:] = 0
    expected = ops.rfa_cross_ref(q, k, v, mask)
    assert_close(ops.rfa_cross(q, ops.rfa_cross_state(k, v, mask)), expected)
    row = ops.rfa_cross(q[1:], ops.rfa_cross_state(k[1:, :6], v[1:, :6]))  # the padded row without its padding
    torch.testing.assert_close(row, expected[1:], rtol=1e-10, atol=1e-12)
    naive = torch.stack([(q[0, t] * k[0]).sum(-1) for t in range(T)])  # (T, S, H)
    num = torch.einsum("tsh,shd->thd", naive, v[0])
    torch.testing.assert_close(expected[0], num / naive.sum(1).clamp_min(0.1).unsqueeze(-1))


def test_key_norm_rescale():
    k = torch.randn(2, 7, 3, 8) * torch.arange(1, 8).view(1, 7, 1, 1)
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[0, 5:] = 0  # padded keys are the largest ones: they must not set the shift
    scale = rfa_key_norm_rescale(k, torch.ones(3), mask)
    assert scale.shape == (2, 7, 3, 1)
    torch.testing.assert_close(scale[0, :5].amax(0), torch.ones(3, 1))
    torch.testing.assert_close(scale[1].amax(0), torch.ones(3, 1))
    exponent = 0.5 * (k[1].norm(dim=-1) / math.sqrt(8)) ** 2  # (S, H)
    torch.testing.assert_close(scale[1, :, :, 0], torch.exp(exponent - exponent.amax(0)))


def test_backward_opcheck_with_transposed_inputs():
    """The backward's fake kernel returns what the kernel returns, contiguous gradients, whatever the strides."""
    g = torch.Generator().manual_seed(15)
    q, k = transposed(features(2, 9, 2, 4, g, torch.float32)), transposed(features(2, 9, 2, 4, g, torch.float32))
    v, decay = transposed(torch.randn(2, 9, 2, 3, generator=g)), transposed(gate(2, 9, 2, g, torch.float32))
    initial = transposed(torch.randn(2, 2, 4, 4, generator=g) * 0.1)
    checkpoints = torch.ops.talk_hf.rfa_causal_fwd(q, k, v, decay, initial, 0.1, 4)[2]
    torch.library.opcheck(torch.ops.talk_hf.rfa_causal_bwd.default,
                          (transposed(torch.randn(2, 9, 2, 3)), transposed(torch.randn(2, 2, 4, 4)), q, k, v, decay,
                           initial, checkpoints, 0.1, 4))


def test_second_order_gradients_of_the_kernels_raise():
    """The kernels' backward has no derivative of its own: a second derivative through it raises instead of being
    zero, and names the PyTorch forms, which have one."""
    g = torch.Generator().manual_seed(16)
    q, k = features(1, 6, 2, 4, g).requires_grad_(), features(1, 6, 2, 4, g).requires_grad_()
    v, decay = torch.randn(1, 6, 2, 3, generator=g, dtype=torch.float64).requires_grad_(), gate(1, 6, 2, g)
    out, _ = ops.rfa_causal_compiled(q, k, v, decay, chunk_size=4)
    (gq,) = torch.autograd.grad(out.square().sum(), q, create_graph=True)
    torch.testing.assert_close(gq, torch.autograd.grad(out.square().sum(), q, retain_graph=True)[0])
    with pytest.raises(RuntimeError, match=r"rfa_causal_bwd.*second-order.*rfa_causal_chunked.*rfa_causal_ref.*"
                                           r"TALK_HF_FORCE_REFERENCE=1"):
        torch.autograd.grad(gq.sum(), v)
    (gq,) = torch.autograd.grad(ops.rfa_causal_chunked(q, k, v, decay)[0].square().sum(), q, create_graph=True)
    assert torch.autograd.grad(gq.sum(), v)[0].abs().sum() > 0


@pytest.mark.parametrize("backend", ["compiled", "reference"])
@pytest.mark.parametrize("gated", [False, True], ids=["plain", "gated"])
@pytest.mark.parametrize("B,T", [(0, 7), (2, 0), (0, 0)])
def test_empty_batch_or_sequence(B, T, gated, backend, monkeypatch):
    """Zero sizes give the compiled op's shapes (a sequence of no token: the initial state as the final one),
    connected to the graph (a backward runs, whichever input requires grad), in every form and the forced-reference
    path of `rfa_causal`."""
    g = torch.Generator().manual_seed(17)
    H, F, d = 2, 4, 3
    q, k, v = torch.rand(B, T, H, F, generator=g), torch.rand(B, T, H, F, generator=g), torch.randn(B, T, H, d)
    decay = gate(B, T, H, g, torch.float32) if gated else None
    initial = torch.rand(B, H, F, d + 1, generator=g)
    want = torch.ops.talk_hf.rfa_causal_fwd(q, k, v, decay, initial, 0.1, 4)[:2]
    if backend == "reference":
        monkeypatch.setenv("TALK_HF_FORCE_REFERENCE", "1")
    forms = {"rfa_causal": ops.rfa_causal, "chunked": ops.rfa_causal_chunked, "ref": ops.rfa_causal_ref}
    if backend == "compiled":
        forms["compiled"] = ops.rfa_causal_compiled
    inputs = (q, k, v, decay, initial)
    for name, form in forms.items():
        for i in [i for i, t in enumerate(inputs) if t is not None]:  # each input alone requires grad
            given = [t if j != i else t.clone().requires_grad_() for j, t in enumerate(inputs)]
            out, state = form(*given)
            assert (out.shape, state.shape) == (want[0].shape, want[1].shape), name
            (out.sum() + state.sum()).backward()
            assert given[i].grad.shape == inputs[i].shape, (name, i)
            if T == 0:
                assert torch.equal(state, initial), name
    features_in = torch.randn(B, T, H, 8, requires_grad=True)
    assert ops.rfa_feature_map(features_in, torch.randn(H, 3, 8)).shape == (B, T, H, 6)


@pytest.mark.parametrize("T", [2, 10])
def test_a_chunk_longer_than_the_sequence_is_cut_to_it(T):
    """The chunked form works on chunks of min(chunk_size, T) steps: a huge chunk_size gives the results of
    chunk_size = T (the same operations), equal to the recurrence, and allocates nothing of its size."""
    g = torch.Generator().manual_seed(18)
    B, H, F, d = 2, 2, 4, 3
    q, k = features(B, T, H, F, g, torch.float32), features(B, T, H, F, g, torch.float32)
    v, decay = torch.randn(B, T, H, d, generator=g), gate(B, T, H, g, torch.float32)

    class LargestTensor(TorchDispatchMode):
        numel = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor):
                    self.numel = max(self.numel, t.numel())
            return out

    with LargestTensor() as mode:
        huge = rfa_causal_chunked(q, k, v, decay, chunk_size=1024)
    assert mode.numel <= B * H * T * T * (F + d + 1)
    exact = rfa_causal_chunked(q, k, v, decay, chunk_size=T)
    assert all(torch.equal(a, b) for a, b in zip(huge, exact))
    reference = ops.rfa_causal_ref(q.double(), k.double(), v.double(), decay.double())
    for a, b in zip(huge, reference):
        assert rel_err(a, b) <= REL_TOL[torch.float32]
    default = ops.rfa_causal(q.requires_grad_(), k, v, decay)  # the training path, default chunk_size
    for a, b in zip(huge, default):
        torch.testing.assert_close(a, b.detach())


BAD_INPUTS = [
    (lambda q, v: ops.rfa_causal(q[0], q, v), ValueError, "q must have 4 dimensions"),
    (lambda q, v: ops.rfa_causal(q, q[:, :3], v), ValueError, "k must have the shape of q"),
    (lambda q, v: ops.rfa_causal(q, q, v[:, :3]), ValueError, "v must be"),
    (lambda q, v: ops.rfa_causal(q, q, v, decay=torch.ones(2, 5)), ValueError, "decay must be"),
    (lambda q, v: ops.rfa_causal(q, q, v, initial_state=torch.zeros(2, 2, 8, 4)), ValueError, "state must be"),
    (lambda q, v: ops.rfa_causal(q, q, v.to("meta")), ValueError, "v is on"),
    (lambda q, v: ops.rfa_step(q, q, v, None), ValueError, "needs a state"),
    (lambda q, v: ops.rfa_causal(q, q, v, chunk_size=0), ValueError, "chunk_size must be >= 1"),
    (lambda q, v: ops.rfa_feature_map(v, torch.randn(2, 4, 5)), ValueError, "projection must be"),
    (lambda q, v: ops.rfa_feature_map(v, torch.randn(2, 4, 4), torch.ones(3)), ValueError, "tau must have shape"),
    (lambda q, v: ops.rfa_feature_map(v, torch.randn(2, 4, 4), 2.0), TypeError, "tau must be a torch.Tensor"),
    (lambda q, v: ops.rfa_cross(q, torch.zeros(2, 2, 7, 5)), ValueError, "state must be"),
    (lambda q, v: ops.rfa_cross(q, (torch.zeros(2, 2, 8, 3), torch.zeros(2, 2, 4, 5))), ValueError, "source keys"),
]


@pytest.mark.parametrize("call,error,match", BAD_INPUTS)
def test_bad_input_names_the_argument(call, error, match):
    with pytest.raises(error, match=match):
        call(torch.randn(2, 5, 2, 8), torch.randn(2, 5, 2, 4))


def test_the_compiled_backward_of_a_chunk_longer_than_the_sequence_replays_the_sequence_only():
    """The CPU backward keeps the states of one chunk: for chunk_size past T it needs T of them (2**31 steps of
    states would be a 100 GB allocation), and the gradients equal those of chunk_size = T."""
    g = torch.Generator().manual_seed(19)
    B, T, H, F, d = 1, 4, 2, 4, 3
    inputs = (features(B, T, H, F, g, torch.float32), features(B, T, H, F, g, torch.float32),
              torch.randn(B, T, H, d, generator=g), gate(B, T, H, g, torch.float32))
    huge = results_and_grads(lambda *a: ops.rfa_causal_compiled(*a, chunk_size=2**31), inputs, torch.float32)
    exact = results_and_grads(lambda *a: ops.rfa_causal_compiled(*a, chunk_size=T), inputs, torch.float32)
    for a, b in zip(huge, exact):
        torch.testing.assert_close(a, b)


def test_compiled_errors_name_the_op_and_why(monkeypatch):
    q, v = torch.randn(1, 3, 2, 4), torch.randn(1, 3, 2, 2)
    with pytest.raises(RuntimeError, match=r"rfa_causal_step_: state must be \(B, H, F, D \+ 1\)"):
        torch.ops.talk_hf.rfa_causal_step_(q, q, v, None, torch.zeros(1, 2, 4, 5), 1e-6)
    monkeypatch.setenv("TALK_HF_FORCE_REFERENCE", "1")
    with pytest.raises(RuntimeError, match="TALK_HF_FORCE_REFERENCE is set"):
        ops.rfa_causal_compiled(q, q, v)
