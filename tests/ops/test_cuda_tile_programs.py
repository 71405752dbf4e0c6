"""The programs of the CUDA kernels, run on the CPU by tests/ops/cuda_tile_emulator.cpp exactly as the .cu files
launch them (every block, phase by phase, every thread, shared memory poisoned with NaN): the fused TaLK block
programs (csrc/cuda/talk_conv_tiles.h: tile edges, halos, window ends outside the shared rows, channel chunks across
heads, thread order within a phase), the RFA block programs (csrc/cuda/rfa_blocks.h, one fiber per thread), the
DynamicConv element programs (csrc/dynamic_conv_math.h) and the decoding steps' column programs, against the
references in fp64 and fp32, and in bf16 through a host bf16 type that converts only as the CUDA types do. No GPU
needed; on a GPU, tests/ops/test_cuda_kernels.py runs the kernels themselves."""

import ctypes

import pytest
import torch

from talk_hf import ops
from tests.ops.emulator import CXX, SUFFIX, ptr
from tests.ops.test_dynamic_conv import CASES as DYNAMIC_CONV_CASES
from tests.utils import assert_close, grads, offsets

pytestmark = pytest.mark.skipif(CXX is None, reason="no C++ compiler")


def emulate_fwd(lib, x, ol, orr, max_left, max_right, tile=0, rows=0, warps=8, reverse=False):
    B, T, C = x.shape
    out = torch.full_like(x, float("nan"))
    fn = getattr(lib, f"talk_conv_fwd_emulate_{SUFFIX[x.dtype]}")
    ints = [ctypes.c_int64(v) for v in (B, T, C, ol.shape[-1], max_left, max_right, tile, rows)]
    fn(ptr(x), ptr(ol), ptr(orr), ptr(out), *ints, ctypes.c_int(warps), ctypes.c_int(int(reverse)))
    return out


def emulate_bwd(lib, g, x, ol, orr, max_left, max_right, tile=0, reverse=False):
    B, T, C = x.shape
    gx, gol = torch.full_like(x, float("nan")), torch.full_like(ol, float("nan"))
    gor = None if orr is None else torch.full_like(orr, float("nan"))
    fn = getattr(lib, f"talk_conv_bwd_emulate_{SUFFIX[x.dtype]}")
    ints = [ctypes.c_int64(v) for v in (B, T, C, ol.shape[-1], max_left, max_right, tile)]
    status = fn(ptr(g), ptr(x), ptr(ol), ptr(orr), ptr(gx), ptr(gol), ptr(gor), *ints, ctypes.c_int(int(reverse)))
    assert status == 0, "the lanes of a grad-x warp reached different barriers"
    return gx, gol, gor


def reference(x, ol, orr, max_left, max_right):
    """Output and gradients of talk_conv_ref in fp64, with the grad_out that `grads` uses."""
    inputs = [t.double() for t in (x, ol) + (() if orr is None else (orr,))]
    out, gs = grads(lambda a, b, c=None: ops.talk_conv_ref(a, b, c, max_left, max_right), *inputs)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(123), dtype=torch.float64)
    return out, g, gs + ([None] if orr is None else [])


def inputs(B, T, C, H, causal, seed, wild=False, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, C, dtype=torch.float64, generator=gen)
    draw = (lambda: torch.rand(B, T, H, dtype=torch.float64, generator=gen) * 3 - 0.5) if wild else (
        lambda: offsets(B, T, H, generator=gen))
    ol, orr = draw(), (None if causal else draw())
    return x.to(dtype), ol.to(dtype), None if orr is None else orr.to(dtype)


CASES = [  # B, T, C, H, max_left, max_right
    pytest.param(2, 13, 6, 3, 3, 4, id="T13-C6-H3"),
    pytest.param(1, 1, 4, 2, 2, 2, id="T1"),
    pytest.param(3, 5, 8, 8, 15, 15, id="T<window-H=C"),
    pytest.param(2, 97, 70, 5, 7, 3, id="T97-C70-three-chunks-R14"),
    pytest.param(1, 300, 64, 1, 31, 31, id="T300-R64"),
    pytest.param(2, 263, 96, 2, 63, 63, id="T263-halo63"),
]


@pytest.mark.parametrize("causal", [False, True], ids=["encoder", "causal"])
@pytest.mark.parametrize("B,T,C,H,max_left,max_right", CASES)
def test_default_launch_shape_matches_reference(emulator, B, T, C, H, max_left, max_right, causal):
    mr = 0 if causal else max_right
    x, ol, orr = inputs(B, T, C, H, causal, seed=T + C)
    out, g, want = reference(x, ol, orr, max_left, mr)
    assert_close(emulate_fwd(emulator, x, ol, orr, max_left, mr), out)
    for name, got, exp in zip(["x", "offset_left", "offset_right"], emulate_bwd(emulator, g, x, ol, orr, max_left, mr),
                              want):
        if exp is not None:
            assert_close(got, exp, name=f"grad {name}")


@pytest.mark.parametrize("causal", [False, True], ids=["encoder", "causal"])
@pytest.mark.parametrize("tile,rows,warps", [(1, 2, 1), (4, 7, 3), (7, 40, 5), (16, 3, 8), (128, 500, 8)])
def test_small_tiles_few_rows_and_wild_offsets(emulator, tile, rows, warps, causal):
    """Tiny tiles (many blocks), table rows fewer than the halo (window ends summed from x in global memory),
    warps with empty segments, and offsets in [-0.5, 2.5] whose windows pass max_left/max_right or cross over."""
    mr = 0 if causal else 5
    x, ol, orr = inputs(2, 61, 40, 4, causal, seed=tile * 7 + rows, wild=True)
    out, g, want = reference(x, ol, orr, 6, mr)
    assert_close(emulate_fwd(emulator, x, ol, orr, 6, mr, tile=tile, rows=rows, warps=warps), out)
    got = emulate_bwd(emulator, g, x, ol, orr, 6, mr, tile=tile)
    for name, a, b in zip(["x", "offset_left", "offset_right"], got, want):
        if b is not None:
            assert_close(a, b, name=f"grad {name}")


def test_thread_order_within_a_phase_does_not_matter(emulator):
    """Bitwise the same result with the threads of every phase run in reverse order: no thread reads a word another
    thread writes in the same phase (on a GPU they run concurrently)."""
    x, ol, orr = inputs(2, 150, 72, 3, False, seed=5, wild=True)
    g = torch.randn_like(x)
    for kw in [dict(), dict(tile=8, rows=20, warps=3)]:
        assert torch.equal(emulate_fwd(emulator, x, ol, orr, 9, 4, **kw),
                           emulate_fwd(emulator, x, ol, orr, 9, 4, reverse=True, **kw))
    forward_order = emulate_bwd(emulator, g, x, ol, orr, 9, 4)
    for a, b in zip(forward_order, emulate_bwd(emulator, g, x, ol, orr, 9, 4, reverse=True)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("acc_bytes", [4, 8], ids=["fp32-acc", "fp64-acc"])
def test_launch_shapes_fit_the_default_shared_memory(emulator, acc_bytes):
    """Every launch asks for at most 48 KiB of shared memory (no opt-in attribute needed) whatever the window reach
    and however many heads a block's channels span; windows the shared rows cannot hold are summed from x
    (test_small_tiles_few_rows_and_wild_offsets)."""
    emulator.talk_conv_shared_bytes.restype = ctypes.c_int64

    def shared(max_left, max_right, H, R, backward):
        return emulator.talk_conv_shared_bytes(*(ctypes.c_int64(v) for v in (acc_bytes, max_left, max_right, H, R)),
                                               ctypes.c_int(backward))

    for max_left, max_right in [(0, 0), (31, 31), (63, 63), (255, 0), (1000, 1000)]:
        for H, R in [(16, 64), (8, 1), (512, 1), (64, 3), (1, 1000)]:
            fwd = shared(max_left, max_right, H, R, 0)
            assert 0 < fwd <= 48 * 1024, (max_left, max_right, H, R, fwd)
        assert 0 < shared(max_left, max_right, 16, 64, 1) <= 48 * 1024


@pytest.mark.parametrize("causal", [False, True], ids=["encoder", "causal"])
def test_fp32_accumulates_short_sums(emulator, causal):
    """fp32 at T=10,000 with a constant offset of x: sums start at each block's first row, so the error stays at
    fp32 rounding of short sums (a whole-sequence prefix sum would lose the small differences)."""
    mr = 0 if causal else 31
    x, ol, orr = inputs(1, 10_000, 32, 2, causal, seed=3)
    x = x + 100.0
    out, g, want = reference(x, ol, orr, 31, mr)
    x32, ol32, orr32 = x.float(), ol.float(), None if orr is None else orr.float()
    out64 = ops.talk_conv_ref(x32.double(), ol32.double(), None if orr is None else orr32.double(), 31, mr)
    assert_close(emulate_fwd(emulator, x32, ol32, orr32, 31, mr), out64, torch.float32)
    got = emulate_bwd(emulator, g.float(), x32, ol32, orr32, 31, mr)
    _, _, want32 = reference(x32.double(), ol32.double(), None if orr is None else orr32.double(), 31, mr)
    for name, a, b in zip(["x", "offset_left", "offset_right"], got, want32):
        if b is not None:
            assert_close(a, b, torch.float32, name=f"grad {name}")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("T_new,max_left,H", [(1, 0, 1), (1, 31, 4), (4, 5, 8)])
def test_decoding_step_column_program(emulator, dtype, T_new, max_left, H):
    """talk_conv_step.h's column program (one CUDA thread per (b, c)) against the PyTorch form of the step, both
    thread orders (bitwise the same: columns share no memory)."""
    from talk_hf.talk_conv import _talk_conv_step_ref

    gen = torch.Generator().manual_seed(max_left + T_new)
    B, C = 3, 40
    x = torch.randn(B, T_new, C, generator=gen, dtype=torch.float64).to(dtype)
    ol = (torch.rand(B, T_new, H, generator=gen, dtype=torch.float64) * 1.4 - 0.2).to(dtype)
    state = torch.randn(B, max_left + 2, C, generator=gen, dtype=torch.float64).to(dtype)
    results = []
    for reverse in (False, True):
        out, new_state = torch.full_like(x, float("nan")), torch.full_like(state, float("nan"))
        fn = getattr(emulator, f"talk_conv_step_emulate_{SUFFIX[dtype]}")
        ints = [ctypes.c_int64(v) for v in (B, T_new, C, H, max_left)]
        fn(ptr(x), ptr(ol), ptr(state), ptr(out), ptr(new_state), *ints, ctypes.c_int(int(reverse)))
        results.append((out, new_state))
    assert all(torch.equal(a, b) for a, b in zip(*results))
    want_out, want_state = _talk_conv_step_ref(x, ol, state, max_left)
    assert_close(results[0][0], want_out, dtype)
    assert_close(results[0][1], want_state, dtype, name="new state")


@pytest.mark.parametrize("softmax", [False, True], ids=["normalised", "logits"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("T_new,K,H", [(1, 1, 1), (1, 31, 4), (3, 4, 8)])
def test_dynamic_conv_step_column_program(emulator, dtype, T_new, K, H, softmax):
    """dynamic_conv_step.h's column program (one CUDA thread per (b, c)) against the PyTorch form of the step,
    with normalised kernels or with logits it normalises itself (softmax_row.h)."""
    from talk_hf.dynamic_conv import _dynamic_conv_step_ref

    gen = torch.Generator().manual_seed(K + T_new)
    B, C = 3, 40
    x = torch.randn(B, T_new, C, generator=gen, dtype=torch.float64).to(dtype)
    w = 3 * torch.randn(B, T_new, H, K, generator=gen, dtype=torch.float64)
    w = (w if softmax else w.softmax(-1)).to(dtype)
    state = torch.randn(B, K - 1, C, generator=gen, dtype=torch.float64).to(dtype)
    results = []
    for reverse in (False, True):
        out, new_state = torch.full_like(x, float("nan")), torch.full_like(state, float("nan"))
        fn = getattr(emulator, f"dynamic_conv_step_emulate_{SUFFIX[dtype]}")
        ints = [ctypes.c_int64(v) for v in (B, T_new, C, H, K)]
        fn(ptr(x), ptr(w), ptr(state), ptr(out), ptr(new_state), *ints, ctypes.c_int(int(softmax)),
           ctypes.c_int(int(reverse)))
        results.append((out, new_state))
    assert all(torch.equal(a, b) for a, b in zip(*results))
    want_out, want_state = _dynamic_conv_step_ref(x, w, state, softmax)
    assert_close(results[0][0], want_out, dtype)
    assert torch.equal(results[0][1], want_state)


# The CPU op's cases (any K, padding on either side, T=1, primes), plus the weight-gradient blocks' edges: a head
# wider than one round of 32 staged channels (R=48, R=80: a partial last round), several step tiles (T > 64, not a
# multiple), two tap chunks (K=37 > 32: a chunk of 5 taps), few threads per block (K=9: 16 taps, 128 threads).
CONV_CASES = DYNAMIC_CONV_CASES + [
    pytest.param(2, 40, 96, 2, 31, 15, id="K31-R48"),
    pytest.param(1, 150, 80, 1, 37, 20, id="T150-K37-R80"),
    pytest.param(2, 70, 12, 4, 9, 4, id="T70-K9-R3"),
]


@pytest.mark.parametrize("weight_dropout", [0.0, 0.3], ids=["", "dropconnect"])
@pytest.mark.parametrize("light", [False, True], ids=["dynamic", "light"])
@pytest.mark.parametrize("softmax", [False, True], ids=["normalised", "logits"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("B,T,C,H,K,P", CONV_CASES)
def test_dynamic_conv_element_programs(emulator, B, T, C, H, K, P, dtype, softmax, light, weight_dropout):
    """dynamic_conv_math.h's element and rows programs (the CUDA forward, grad x, taps and weight-gradient rows;
    softmax_row.h's lane programs; DropConnect's draws), the weight-gradient block program (dynamic_conv_tiles.h),
    run by the emulator as dynamic_conv.cu launches them (every phase in thread order and reversed: bitwise the
    same), against the reference with the same DropConnect seed; LightConv: one (H, K) kernel and one mask read by
    every position (the weight gradient stays per position: its sum over positions is the kernel's)."""
    gen = torch.Generator().manual_seed(K * T + C)
    x = torch.randn(B, T, C, generator=gen, dtype=torch.float64)
    w = 3 * torch.randn(*((H, K) if light else (B, T, H, K)), generator=gen, dtype=torch.float64)
    w = w if softmax else w.softmax(-1)
    g = torch.randn(B, T, C, generator=gen, dtype=torch.float64)
    seed = torch.tensor(K * 1_000_003 + T - 2**62)
    shared_mask = light and weight_dropout > 0  # the reference then takes the (H, K) kernel itself
    xr = x.clone().requires_grad_()
    wr = (w.clone() if shared_mask else w.expand(B, T, H, K).clone()).requires_grad_()
    want_out = ops.dynamic_conv_ref(xr, wr, P, softmax, weight_dropout, seed)
    want_out.backward(g)
    x, w, g = x.to(dtype), w.to(dtype), g.to(dtype)  # kept alive: the emulator reads them through raw pointers
    ints = [ctypes.c_int64(v) for v in (B, T, C, H, K, P)]
    flags = [ctypes.c_int(int(softmax)), ctypes.c_int(int(light)), ctypes.c_int64(seed.item()),
             ctypes.c_double(weight_dropout)]
    outs = []
    for reverse in (False, True):
        out = torch.full_like(x, float("nan"))
        getattr(emulator, f"dynamic_conv_fwd_emulate_{SUFFIX[dtype]}")(
            ptr(x), ptr(w), ptr(out), *ints, *flags, ctypes.c_int(int(reverse)))
        outs.append(out)
    assert torch.equal(outs[0], outs[1])
    assert_close(outs[0], want_out.detach(), dtype)
    grads = []
    for reverse in (False, True):
        gx, gw = torch.full_like(x, float("nan")), torch.full((B, T, H, K), float("nan"), dtype=dtype)
        status = getattr(emulator, f"dynamic_conv_bwd_emulate_{SUFFIX[dtype]}")(
            ptr(g), ptr(x), ptr(w), ptr(gx), ptr(gw), *ints, *flags, ctypes.c_int(int(reverse)))
        assert status == 0, "the weight-gradient threads reached different barriers"
        grads.append((gx, gw))
    assert all(torch.equal(a, b) for a, b in zip(*grads))
    assert_close(grads[0][0], xr.grad, dtype, name="grad x")
    got_gw = grads[0][1].double().sum((0, 1)).to(dtype) if shared_mask else grads[0][1]
    assert_close(got_gw, wr.grad, dtype, name="grad weight")


RFA_CASES = [  # B, T, H, F, D, chunk, grid (blocks; < B*H exercises the grid-stride loop), threads
    pytest.param(2, 1, 2, 8, 4, 64, 4, 32, id="T1"),
    pytest.param(1, 29, 3, 6, 5, 4, 2, 64, id="T29-chunk4-grid2"),
    pytest.param(2, 13, 2, 16, 7, 13, 4, 256, id="chunk=T-256-threads"),
    pytest.param(1, 10, 1, 70, 3, 3, 1, 32, id="F>threads"),
]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("B,T,H,F,D,chunk,grid,threads", RFA_CASES)
def test_rfa_block_programs(emulator, B, T, H, F, D, chunk, grid, threads, dtype):
    """rfa_blocks.h's forward and backward block programs (the CUDA RFA kernels' bodies), one fiber per thread, both
    thread orders, NaN-poisoned shared memory and workspace, against rfa_causal_ref with a decay gate and an initial
    state: outputs, final state and every gradient."""
    from tests.ops.test_rfa import features, gate

    gen = torch.Generator().manual_seed(T + F)
    q, k = features(B, T, H, F, gen), features(B, T, H, F, gen)
    v = torch.randn(B, T, H, D, generator=gen, dtype=torch.float64)
    decay = gate(B, T, H, gen)
    init = 0.1 * torch.randn(B, H, F, D + 1, generator=gen, dtype=torch.float64)
    go = torch.randn(B, T, H, D, generator=gen, dtype=torch.float64)
    gfinal = torch.randn(B, H, F, D + 1, generator=gen, dtype=torch.float64)
    leaves = [t.clone().requires_grad_() for t in (q, k, v, decay, init)]
    want_out, want_state = ops.rfa_causal_ref(*leaves, eps=0.1)
    torch.autograd.backward([want_out, want_state], [go, gfinal])

    q, k, v, decay, init, go, gfinal = (t.to(dtype) for t in (q, k, v, decay, init, go, gfinal))
    N = -(-T // chunk)
    ints = [ctypes.c_int64(n) for n in (B, T, H, F, D, chunk, grid)]
    nan = lambda *shape: torch.full(shape, float("nan"), dtype=dtype)  # noqa: E731
    sfx = SUFFIX[dtype]
    runs = []
    for reverse in (False, True):
        out, state, checkpoints = nan(B, T, H, D), nan(B, H, F, D + 1), nan(B, H, N, F, D + 1)
        assert getattr(emulator, f"rfa_fwd_emulate_{sfx}")(
            ptr(q), ptr(k), ptr(v), ptr(decay), ptr(init), ctypes.c_double(0.1), ptr(out), ptr(state),
            ptr(checkpoints), *ints, ctypes.c_int(threads), ctypes.c_int(int(reverse))) == 0
        grads_ = [nan(*t.shape) for t in (q, k, v, decay, init)]
        workspace = nan(B * H * (chunk + 2) * F * (D + 1))
        assert getattr(emulator, f"rfa_bwd_emulate_{sfx}")(
            ptr(go), ptr(gfinal), ptr(q), ptr(k), ptr(v), ptr(decay), ptr(checkpoints), ctypes.c_double(0.1),
            *[ptr(t) for t in grads_], ptr(workspace), *ints, ctypes.c_int(threads), ctypes.c_int(int(reverse))) == 0
        runs.append([out, state, *grads_])
    assert all(torch.equal(a, b) for a, b in zip(*runs))  # no phase reads what another thread writes in it
    names = ["out", "final state", "grad q", "grad k", "grad v", "grad decay", "grad initial state"]
    wants = [want_out, want_state] + [t.grad for t in leaves]
    for name, got, want in zip(names, runs[0], wants):
        assert_close(got, want.detach(), dtype, name=name)


@pytest.mark.parametrize("causal", [False, True], ids=["encoder", "causal"])
@pytest.mark.parametrize("B,T,C,H,max_left,max_right", [CASES[0], CASES[3], CASES[5]])
def test_talk_programs_in_bf16(emulator, B, T, C, H, max_left, max_right, causal):
    """bf16 inputs and outputs, fp32 accumulation (the kernels' low-precision path), against the fp64 reference
    on the same rounded inputs."""
    mr = 0 if causal else max_right
    x, ol, orr = inputs(B, T, C, H, causal, seed=T + C, dtype=torch.bfloat16)
    g = torch.randn(B, T, C, generator=torch.Generator().manual_seed(9), dtype=torch.float64).to(torch.bfloat16)
    leaves = [t.double().requires_grad_() for t in (x, ol) + (() if orr is None else (orr,))]
    out = ops.talk_conv_ref(*leaves, *([None] if orr is None else []), max_left, mr)
    out.backward(g.double())
    assert_close(emulate_fwd(emulator, x, ol, orr, max_left, mr), out.detach(), torch.bfloat16)
    for name, got, leaf in zip(["x", "offset_left", "offset_right"], emulate_bwd(emulator, g, x, ol, orr, max_left, mr),
                               leaves):
        assert_close(got, leaf.grad, torch.bfloat16, name=f"grad {name}")


@pytest.mark.parametrize("softmax", [False, True], ids=["normalised", "logits"])
def test_dynamic_conv_programs_in_bf16(emulator, softmax):
    """DynamicConv element programs and the decoding-step column program with bf16 storage."""
    from talk_hf.dynamic_conv import _dynamic_conv_step_ref

    B, T, C, H, K, P = 2, 40, 96, 2, 31, 15
    gen = torch.Generator().manual_seed(11)
    bf16 = torch.bfloat16
    x = torch.randn(B, T, C, generator=gen, dtype=torch.float64).to(bf16)
    w = 3 * torch.randn(B, T, H, K, generator=gen, dtype=torch.float64)
    w = (w if softmax else w.softmax(-1)).to(bf16)
    g = torch.randn(B, T, C, generator=gen, dtype=torch.float64).to(bf16)
    xr, wr = x.double().requires_grad_(), w.double().requires_grad_()
    want = ops.dynamic_conv_ref(xr, wr, P, softmax)
    want.backward(g.double())
    ints = [ctypes.c_int64(v) for v in (B, T, C, H, K, P)]
    out, gx, gw = torch.empty_like(x), torch.empty_like(x), torch.empty_like(w)
    flags = [ctypes.c_int(int(softmax)), ctypes.c_int(0), ctypes.c_int64(0), ctypes.c_double(0.0), ctypes.c_int(0)]
    emulator.dynamic_conv_fwd_emulate_bf16(ptr(x), ptr(w), ptr(out), *ints, *flags)
    emulator.dynamic_conv_bwd_emulate_bf16(ptr(g), ptr(x), ptr(w), ptr(gx), ptr(gw), *ints, *flags)
    assert_close(out, want.detach(), bf16)
    assert_close(gx, xr.grad, bf16, name="grad x")
    assert_close(gw, wr.grad, bf16, name="grad weight")

    state = torch.randn(B, K - 1, C, generator=gen, dtype=torch.float64).to(bf16)
    step_x, step_w = x[:, :1].contiguous(), w[:, :1].contiguous()  # kept alive: read through raw pointers
    out, new_state = torch.empty_like(step_x), torch.empty_like(state)
    emulator.dynamic_conv_step_emulate_bf16(ptr(step_x), ptr(step_w), ptr(state), ptr(out),
                                            ptr(new_state), *[ctypes.c_int64(v) for v in (B, 1, C, H, K)],
                                            ctypes.c_int(int(softmax)), ctypes.c_int(0))
    want_out, want_state = _dynamic_conv_step_ref(step_x.double(), step_w.double(), state.double(), softmax)
    assert_close(out, want_out, bf16)
    assert torch.equal(new_state, want_state.to(bf16))
