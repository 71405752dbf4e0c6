"""The chunked causal-RFA block programs (csrc/cuda/rfa_chunked_blocks.h: the CUDA kernels of rfa_causal_fwd /
rfa_causal_bwd for T > 1), run on the CPU by tests/ops/cuda_tile_emulator.cpp as rfa.cu launches them (every block
of the grid, one fiber per thread, both thread orders, NaN-poisoned shared memory) against rfa_causal_ref: outputs,
final state, checkpoints, and the gradients of q, k, v, decay and the initial state. No GPU needed; on a GPU,
tests/ops/test_cuda_kernels.py runs the kernels themselves."""

import ctypes

import pytest
import torch

from talk_hf import ops
from tests.ops.emulator import CXX, SUFFIX, ptr
from tests.ops.test_rfa import features
from tests.utils import REL_TOL, assert_close, rel_err

pytestmark = pytest.mark.skipif(CXX is None, reason="no C++ compiler")
EPS = 0.1


def decays(kind, B, T, H, gen):
    """None, uniform in (0, 1), or a mix of exact zeros, exact ones and uniform values."""
    if kind == "none":
        return None
    d = torch.rand(B, T, H, generator=gen, dtype=torch.float64)
    if kind == "zeros-ones":
        r = torch.rand(B, T, H, generator=gen, dtype=torch.float64)
        d = torch.where(r < 0.15, 0.0, torch.where(r < 0.6, 1.0, d))
    return d


def inputs(B, T, H, F, D, decay, seed, with_init=True, with_grad_final=True):
    gen = torch.Generator().manual_seed(seed)
    q, k = (features(B, T, H, F + 1, gen)[..., :F].contiguous() for _ in range(2))  # any F, odd ones too
    v = torch.randn(B, T, H, D, generator=gen, dtype=torch.float64)
    init = 0.1 * torch.randn(B, H, F, D + 1, generator=gen, dtype=torch.float64) if with_init else None
    go = torch.randn(B, T, H, D, generator=gen, dtype=torch.float64)
    gfinal = torch.randn(B, H, F, D + 1, generator=gen, dtype=torch.float64) if with_grad_final else None
    return q, k, v, decays(decay, B, T, H, gen), init, go, gfinal


def reference(q, k, v, decay, init, go, gfinal, chunk):
    """fp64 outputs, final state, checkpoints (the state P_{n*chunk - 1} entering each chunk: the final state of the
    prefix with its last decay set to 1) and gradients (zeros for inputs the loss does not reach)."""
    leaves = [None if t is None else t.clone().requires_grad_() for t in (q, k, v, decay, init)]
    out, state = ops.rfa_causal_ref(*leaves, eps=EPS)
    if gfinal is None:
        out.backward(go)
    else:
        torch.autograd.backward([out, state], [go, gfinal])
    grads = [None if t is None else (torch.zeros_like(t) if t.grad is None else t.grad) for t in leaves]
    checkpoints = []
    for t0 in range(0, q.shape[1], chunk):
        d = None if decay is None else torch.cat([decay[:, : t0 - 1], torch.ones_like(decay[:, :1])], 1)[:, :t0]
        checkpoints.append(ops.rfa_causal_ref(q[:, :t0], k[:, :t0], v[:, :t0], d, init, eps=EPS)[1])
    return [out.detach(), state.detach(), torch.stack(checkpoints, 2)], grads


def emulate(lib, q, k, v, decay, init, go, gfinal, chunk, grid, threads=0, reverse=False, dtype=torch.float64,
            tf32=False):
    """The chunked forward, then (chunk > 0) the backward from its checkpoints, in `dtype` (fp32 with tensor-core
    TF32 products when `tf32`): -> [out, final state, checkpoints], [grad q, k, v, decay, initial state] (None where
    no input)."""
    dtype = torch.float32 if tf32 else dtype
    suffix = "tf32" if tf32 else SUFFIX[dtype]
    q, k, v, decay, init, go, gfinal = (None if t is None else t.to(dtype) for t in (q, k, v, decay, init, go, gfinal))
    B, T, H, F = q.shape
    D = v.shape[-1]
    N = -(-T // chunk) if chunk > 0 else 0
    nan = lambda *shape: torch.full(shape, float("nan"), dtype=dtype)  # noqa: E731
    ints = [ctypes.c_int64(n) for n in (B, T, H, F, D, chunk, grid)]
    tail = [ctypes.c_int(threads), ctypes.c_int(int(reverse))]
    out, state, checkpoints = nan(B, T, H, D), nan(B, H, F, D + 1), nan(B, H, N, F, D + 1)
    assert getattr(lib, f"rfa_chunked_fwd_emulate_{suffix}")(
        ptr(q), ptr(k), ptr(v), ptr(decay), ptr(init), ctypes.c_double(EPS), ptr(out), ptr(state), ptr(checkpoints),
        *ints, *tail) == 0
    if chunk == 0:
        return [out, state, checkpoints], None
    grads = [None if t is None else nan(*t.shape) for t in (q, k, v, decay, init)]
    assert getattr(lib, f"rfa_chunked_bwd_emulate_{suffix}")(
        ptr(go), ptr(gfinal), ptr(q), ptr(k), ptr(v), ptr(decay), ptr(checkpoints), ctypes.c_double(EPS),
        *[ptr(g) for g in grads], *ints, *tail) == 0
    return [out, state, checkpoints], grads


FORWARD_NAMES = ["out", "final state", "checkpoints"]
GRAD_NAMES = ["grad q", "grad k", "grad v", "grad decay", "grad initial state"]


def assert_matches(got, want, names, tol_dtype):
    for name, a, b in zip(names, got, want):
        assert (a is None) == (b is None), name
        if a is not None:
            assert_close(a, b, tol_dtype, name=name)


CASES = [  # B, T, H, F, D, chunk, grid (< B*H: the grid-stride loop), threads (0: rfa.cu's block size)
    pytest.param(2, 1, 2, 5, 3, 4, 4, 32, id="T1"),
    pytest.param(1, 5, 2, 7, 3, 8, 2, 0, id="T<L"),
    pytest.param(2, 16, 1, 9, 5, 16, 1, 37, id="T=L-37-threads"),
    pytest.param(1, 17, 3, 6, 4, 16, 2, 64, id="T=L+1-grid2"),
    pytest.param(1, 37, 2, 5, 6, 16, 1, 0, id="T37-prime>2L"),
    pytest.param(2, 29, 1, 11, 7, 7, 1, 100, id="T29-L7-100-threads"),
    pytest.param(1, 9, 2, 4, 3, 1, 2, 32, id="L1"),
    pytest.param(1, 20, 2, 33, 17, 8, 1, 0, id="F33-D17"),
    pytest.param(1, 131, 1, 6, 3, 64, 1, 0, id="T131-L64"),
    pytest.param(1, 70, 2, 64, 64, 64, 1, 0, id="F64-D64-L64-288-threads"),  # the Table 6 head as rfa.cu launches it
]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("decay", ["none", "uniform", "zeros-ones"])
@pytest.mark.parametrize("B,T,H,F,D,chunk,grid,threads", CASES)
def test_chunked_programs_match_reference(emulator, B, T, H, F, D, chunk, grid, threads, decay, dtype):
    """Forward (outputs, final state, checkpoints) and backward (every gradient, with an initial state and a final
    state gradient) against the fp64 reference; both thread orders give bitwise the same results."""
    data = inputs(B, T, H, F, D, decay, seed=T * 31 + F)
    want, want_grads = reference(*data, chunk)
    runs = [emulate(emulator, *data, chunk, grid, threads, reverse, dtype) for reverse in (False, True)]
    for a, b in zip(runs[0][0] + runs[0][1], runs[1][0] + runs[1][1]):
        assert (a is None and b is None) or torch.equal(a, b)  # no phase reads what another thread writes in it
    # fp32 with exact zeros: C_i - C_j are differences of sums near log(FLT_MIN) ~ -87, exact to ~1e-5 only
    tol = torch.float64 if dtype == torch.float64 else torch.float32
    scale = 3 if (dtype == torch.float32 and decay == "zeros-ones") else 1
    for name, a, b in zip(FORWARD_NAMES + GRAD_NAMES, runs[0][0] + runs[0][1], want + want_grads):
        assert (a is None) == (b is None), name
        if a is not None:
            assert a.shape == b.shape, name
            err = rel_err(a, b)  # also asserts finite values
            assert err <= scale * REL_TOL[tol], f"{name}: relative error {err:.3g}"


@pytest.mark.parametrize("decay", ["none", "uniform", "zeros-ones"])
@pytest.mark.parametrize("B,T,H,F,D,chunk,grid,threads", CASES)
def test_tensor_core_programs_match_reference(emulator, B, T, H, F, D, chunk, grid, threads, decay):
    """The TF32 tensor-core instantiation (rfa.cu's choice for the op's `tf32`): each warp's mma.sync steps formed
    from the PTX fragment layout, so a loader that puts an operand in the wrong register fails here. Every output and
    gradient within fp16 rounding (2e-3, TF32 keeps 10 mantissa bits) of the fp64 reference, both thread orders
    bitwise equal, and not the exact fp32 programs' results (the operands really are rounded). Blocks of 37 and 100
    threads: products go to whole warps only."""
    data = inputs(B, T, H, F, D, decay, seed=T * 31 + F)
    want, want_grads = reference(*data, chunk)
    runs = [emulate(emulator, *data, chunk, grid, threads, reverse, tf32=True) for reverse in (False, True)]
    exact, exact_grads = emulate(emulator, *data, chunk, grid, threads, dtype=torch.float32)
    for a, b in zip(runs[0][0] + runs[0][1], runs[1][0] + runs[1][1]):
        assert (a is None and b is None) or torch.equal(a, b)
    for name, a, b, e in zip(FORWARD_NAMES + GRAD_NAMES, runs[0][0] + runs[0][1], want + want_grads,
                             exact + exact_grads):
        assert (a is None) == (b is None), name
        if a is not None:
            err = rel_err(a, b)
            assert err <= REL_TOL[torch.float16], f"{name}: relative error {err:.3g}"
            if name != "checkpoints" or T > chunk:  # a lone chunk's checkpoint is the initial state, no product
                assert rel_err(a, e) > 2 * REL_TOL[torch.float32], f"{name}: equal to the exact fp32 programs"


def tf32_reference(x):
    """x (fp32) rounded to 11 significant bits, to nearest with ties away from zero, in fp64 arithmetic (normal
    numbers), or infinity where that rounding passes the largest fp32."""
    m, e = torch.frexp(x.double())  # x = m 2^e, 0.5 <= |m| < 1
    scaled = m * 2048
    rounded = torch.sign(scaled) * torch.floor(scaled.abs() + 0.5)
    return torch.ldexp(rounded, e - 11).float()


def test_round_tf32(emulator):
    """round_tf32 (csrc/cuda/tile_products.h: the tensor-core programs' operand rounding, cvt.rna.tf32.f32) against
    rounding in fp64 arithmetic: random normal numbers over the whole exponent range, ties (x.5 ulp) both ways and
    both signs, and the special values."""
    g = torch.Generator().manual_seed(0)
    normal = torch.ldexp(torch.rand(100_000, generator=g, dtype=torch.float64) + 1,
                         torch.randint(-125, 127, (100_000,), generator=g)).float()
    normal = torch.where(torch.rand(100_000, generator=g) < 0.5, normal, -normal)
    ulp = 2.0 ** -10
    ties = torch.tensor([1 + ulp / 2, 1 + 3 * ulp / 2, 1 + ulp / 2 - 2 ** -23, -(1 + ulp / 2),
                         (1.5 + ulp / 2) * 2.0 ** -99],
                        dtype=torch.float32)
    fmax = torch.finfo(torch.float32).max
    special = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), fmax, -fmax, 2.0 ** -149, 2.0 ** -126],
                           dtype=torch.float32)
    x = torch.cat([normal, ties, special])
    out = torch.full_like(x, float("nan"))
    emulator.round_tf32_emulate(ptr(x), ptr(out), ctypes.c_int64(x.numel()))
    n = normal.numel() + ties.numel()
    torch.testing.assert_close(out[:n], tf32_reference(x[:n]), rtol=0, atol=0)
    assert (out[:n].view(torch.int32) & 0x1FFF == 0).all()  # the 13 low mantissa bits are zero
    assert out[normal.numel():n].tolist() == [1 + ulp, 1 + 2 * ulp, 1.0, -(1 + ulp), (1.5 + ulp) * 2.0 ** -99]
    assert out[n:].tolist() == [0.0, -0.0, float("inf"), -float("inf"), float("inf"), -float("inf"), 0.0, 2.0 ** -126]
    nan = torch.tensor([float("nan")])
    emulator.round_tf32_emulate(ptr(nan), ptr(out), ctypes.c_int64(1))
    assert out[0].isnan()


@pytest.mark.parametrize("with_init,with_grad_final", [(False, False), (True, False), (False, True)])
@pytest.mark.parametrize("decay", ["none", "uniform"])
def test_without_initial_state_or_final_gradient(emulator, with_init, with_grad_final, decay):
    """No initial state (zeros, no gradient for it) and/or no gradient of the final state (its decay's gradient is
    then 0)."""
    data = inputs(2, 23, 2, 6, 4, decay, seed=5, with_init=with_init, with_grad_final=with_grad_final)
    want, want_grads = reference(*data, 8)
    got, grads = emulate(emulator, *data, 8, 3, reverse=True)
    assert_matches(got, want, FORWARD_NAMES, torch.float64)
    assert_matches(grads, want_grads, GRAD_NAMES, torch.float64)


def test_inference_launch_uses_64_step_chunks_and_saves_nothing(emulator):
    """chunk 0 (no backward will follow): 64-step chunks, no checkpoints written, outputs and final state exact."""
    data = inputs(1, 150, 2, 6, 5, "uniform", seed=8)
    want, _ = reference(*data, 64)
    got, grads = emulate(emulator, *data, 0, 2)
    assert grads is None and got[2].shape == (1, 2, 0, 6, 6)
    assert_matches(got[:2], want[:2], FORWARD_NAMES, torch.float64)


def test_launch_shapes(emulator):
    """rfa.cu's chunked launches for the Table 6 shape (F = d = 64, chunk 64): 288 threads (one 4 x 4 micro-tile of
    each (64, 65) product per thread); fp32 forward and backward fit an H100's opt-in shared memory (227 KiB), the
    fp64 backward and F = 512 do not (those run the per-step kernels), with SIMT or tensor-core strides. Block sizes
    are whole warps, at most 320."""
    emulator.rfa_chunked_shared_bytes.restype = ctypes.c_int64
    emulator.rfa_chunked_block_threads.restype = ctypes.c_int64
    shared = lambda acc, F, D, chunk, bwd, tc=0: emulator.rfa_chunked_shared_bytes(  # noqa: E731
        *[ctypes.c_int64(n) for n in (acc, F, D, chunk)], ctypes.c_int(bwd), ctypes.c_int(tc))
    threads = lambda *sizes: emulator.rfa_chunked_block_threads(*[ctypes.c_int64(n) for n in sizes])  # noqa: E731
    h100 = 227 * 1024
    assert threads(64, 64, 64) == 288 and threads(64, 64, 0) == 288
    assert 48 * 1024 < shared(4, 64, 64, 64, 0) <= h100 and shared(4, 64, 64, 0, 0) == shared(4, 64, 64, 64, 0)
    assert shared(4, 64, 64, 64, 1) <= h100 < shared(8, 64, 64, 64, 1)
    assert shared(4, 512, 64, 64, 0) > h100
    # Tensor cores: row strides 68 (= 4 mod 32) for the (., 64) and (., 65) tiles; two forward blocks still fit an
    # SM (228 KiB, 1 KiB reserved per block), the backward one.
    ld, L = 68, 64
    assert shared(4, 64, 64, 64, 0, 1) == 4 * (6 * L * ld + 2 * (L + 1) + 288 // 32)
    assert shared(4, 64, 64, 64, 1, 1) == 4 * (12 * L * ld + 2 * (L + 1) + 3 * L + 288 // 32)
    for tc in (0, 1):
        assert 2 * (shared(4, 64, 64, 64, 0, tc) + 1024) <= 228 * 1024 and shared(4, 64, 64, 64, 1, tc) <= h100
    for F, D, chunk in [(5, 3, 4), (33, 17, 8), (64, 64, 64), (256, 256, 64), (6, 3, 1)]:
        n = threads(F, D, chunk)
        assert n % 32 == 0 and 32 <= n <= 320
