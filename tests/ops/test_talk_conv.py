"""TaLK convolution: compiled kernel and reference against a naive loop, gradients, dtypes, shapes, padding,
decoding steps and argument checks."""

import math

import numpy as np
import pytest
import torch

from talk_hf import ops
from tests.utils import (
    DTYPES,
    REL_TOL,
    assert_close,
    assert_compiled_matches,
    grads,
    noncontiguous,
    offsets,
    rel_err,
    transposed,
)



def talk_naive(x, offset_left, offset_right, max_left, max_right):
    """The definition token by token: whole tokens inside [l, r] plus the two fractional edge tokens."""
    B, T, C = x.shape
    H = offset_left.shape[-1]
    R = C // H
    out = torch.zeros(B, T, C, dtype=torch.float64)
    for b in range(B):
        for t in range(T):
            for h in range(H):
                l = min(max(t - offset_left[b, t, h].item() * max_left, 0.0), T - 1.0)
                r = t if offset_right is None else min(max(t + offset_right[b, t, h].item() * max_right, 0.0), T - 1.0)
                cl, fr = math.ceil(l), math.floor(r)
                xs = x[b, :, h * R : (h + 1) * R].double()
                window = xs[cl : fr + 1].sum(0) + (cl - l) * xs[math.floor(l)] + (r - fr) * xs[math.ceil(r)]
                out[b, t, h * R : (h + 1) * R] = window / (max_left + max_right + 1)
    return out


CASES = [  # B, T, C, H, max_left, max_right
    pytest.param(2, 13, 6, 3, 3, 4, id="B2-T13-C6-H3-l3-r4"),
    pytest.param(1, 1, 4, 2, 2, 2, id="T1"),
    pytest.param(3, 5, 8, 8, 15, 15, id="T<window-H=C"),
    pytest.param(2, 97, 5, 1, 7, 0, id="T97-H1-noright"),
    pytest.param(1, 300, 8, 4, 31, 31, id="T>>window"),
]


@pytest.mark.parametrize("causal", [False, True], ids=["encoder", "causal"])
@pytest.mark.parametrize("B,T,C,H,max_left,max_right", CASES)
def test_matches_naive_loop(B, T, C, H, max_left, max_right, causal):
    g = torch.Generator().manual_seed(T * 31 + C)
    x = torch.randn(B, T, C, dtype=torch.float64, generator=g)
    ol = offsets(B, T, H, generator=g)
    orr, mr = (None, 0) if causal else (offsets(B, T, H, generator=g), max_right)
    expected = talk_naive(x, ol, orr, max_left, mr)
    assert_close(ops.talk_conv_ref(x, ol, orr, max_left, mr), expected, name="reference")
    assert_close(ops.talk_conv(x, ol, orr, max_left, mr), expected, name="kernel")


@pytest.mark.parametrize("causal", [False, True], ids=["encoder", "causal"])
def test_many_tiles_channel_blocks_and_offsets_beyond_one(causal):
    """Outputs and gradients over several time tiles (T=389 > 128) and channel blocks (R=160 > 64), with offsets in
    [-0.5, 2.5] (offset dropout scales sigmoid outputs past 1): windows reach beyond max_left/max_right, a left end
    can pass the right one, and only the sequence ends clamp them."""
    g = torch.Generator().manual_seed(12)
    B, T, C, H = 2, 389, 320, 2
    x = torch.randn(B, T, C, dtype=torch.float64, generator=g)
    wild = lambda: torch.rand(B, T, H, dtype=torch.float64, generator=g) * 3 - 0.5  # noqa: E731
    ol, orr, mr = wild(), (None if causal else wild()), (0 if causal else 9)
    inputs = (x, ol) if causal else (x, ol, orr)
    call = lambda fn: lambda x, ol, orr=None: fn(x, ol, orr, 13, mr)  # noqa: E731
    out, got = grads(call(ops.talk_conv), *inputs)
    expected, want = grads(call(ops.talk_conv_ref), *inputs)
    assert_close(out, expected)
    for name, a, b in zip(["x", "offset_left", "offset_right"], got, want):
        assert_close(a, b, name=f"grad {name}")


LAYOUTS = [  # B, T, C, H: how the CPU forward splits rows into tasks (talk_conv_cpu.cpp, head_groups)
    pytest.param(4, 300, 600, 3, id="2+1-heads-per-task"),  # 512 // 200 = 2 heads per task: a group and a remainder
    pytest.param(4, 260, 512, 8, id="whole-rows"),  # 8 heads of 64 in one task, two time tiles
    pytest.param(1, 40, 1100, 1, id="head-split-512-512-76"),  # a head wider than a task: three channel blocks
    pytest.param(1, 9, 256, 8, id="few-tasks"),  # one tile: groups halved until every thread has tasks
]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("B,T,C,H", LAYOUTS)
def test_every_task_layout_matches_reference(B, T, C, H, threads):
    """Outputs and gradients for each way the forward groups heads or splits a head, with offsets beyond one (windows
    larger than the halo), under 1 and 2 threads (the grouping depends on the thread count)."""
    g = torch.Generator().manual_seed(B * T + C)
    x = torch.randn(B, T, C, dtype=torch.float64, generator=g)
    ol, orr = (torch.rand(B, T, H, dtype=torch.float64, generator=g) * 2.5 - 0.25 for _ in range(2))
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out, got = grads(lambda *a: ops.talk_conv(*a, 11, 5), x, ol, orr)
    finally:
        torch.set_num_threads(previous)
    expected, want = grads(lambda *a: ops.talk_conv_ref(*a, 11, 5), x, ol, orr)
    assert_close(out, expected)
    for name, a, b in zip(["x", "offset_left", "offset_right"], got, want):
        assert_close(a, b, name=f"grad {name}")


def test_full_and_empty_windows():
    """Offsets 1: a box filter of width max_left + max_right + 1 truncated at the ends; offsets 0: x / norm."""
    x = torch.randn(2, 20, 6, dtype=torch.float64)
    ones, zeros = torch.ones(2, 20, 3, dtype=torch.float64), torch.zeros(2, 20, 3, dtype=torch.float64)
    padded = torch.nn.functional.pad(x, (0, 0, 3, 2))
    box = torch.stack([padded[:, t : t + 6].sum(1) for t in range(20)], 1) / 6
    for fn in (ops.talk_conv, ops.talk_conv_ref):
        assert_close(fn(x, ones, ones, 3, 2), box)
        assert_close(fn(x, zeros, zeros, 3, 2), x / 6)
        assert_close(fn(x, zeros, None, 4, 0), x / 5)


@pytest.mark.parametrize("causal", [False, True], ids=["encoder", "causal"])
@pytest.mark.parametrize("fn", [ops.talk_conv, ops.talk_conv_ref], ids=["kernel", "reference"])
def test_gradcheck(fn, causal):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(2, 9, 6, dtype=torch.float64, generator=g, requires_grad=True)
    ol = offsets(2, 9, 2, generator=g).requires_grad_()
    if causal:
        assert torch.autograd.gradcheck(lambda a, b: fn(a, b, None, 4, 0), (x, ol))
    else:
        orr = offsets(2, 9, 2, generator=g).requires_grad_()
        assert torch.autograd.gradcheck(lambda a, b, c: fn(a, b, c, 4, 3), (x, ol, orr))


def test_offset_gradient_vanishes_when_clamped():
    """Windows clamped at the sequence ends have no offset gradient (the slope of a clamped end is zero)."""
    x = torch.randn(1, 4, 2, dtype=torch.float64)
    ol = torch.full((1, 4, 1), 0.9, dtype=torch.float64)  # reach 9 > t for every t: always clamped at 0
    for fn in (ops.talk_conv, ops.talk_conv_ref):
        _, (gx, gl) = grads(lambda a, b: fn(a, b, None, 10, 0), x, ol)
        assert torch.equal(gl, torch.zeros_like(gl))
        assert gx.abs().sum() > 0


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["encoder", "causal"])
def test_dtype_tolerances(dtype, causal):
    """Kernel and reference in each dtype vs float64 on the same rounded inputs: outputs and all gradients."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 67, 16, dtype=torch.float64, generator=g).to(dtype)
    ol = offsets(2, 67, 4, generator=g, dtype=dtype)
    orr = None if causal else offsets(2, 67, 4, generator=g, dtype=dtype)
    inputs = (x, ol) if causal else (x, ol, orr)
    mr = 0 if causal else 9

    def run(fn):
        return lambda *a: fn(a[0], a[1], a[2] if len(a) > 2 else None, 11, mr)

    out64, grads64 = grads(run(ops.talk_conv_ref), *[t.double() for t in inputs])
    for fn in (ops.talk_conv, ops.talk_conv_ref):
        out, gs = grads(run(fn), *inputs)
        assert out.dtype == dtype
        assert_close(out, out64, dtype, "output")
        for i, (a, b) in enumerate(zip(gs, grads64)):
            assert_close(a, b, dtype, f"grad {i}")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_long_sequence_keeps_fractions(dtype):
    """At T=10,000 the windows keep their fractional edges: low-precision results match float64 math on the same
    inputs to output rounding, and the offset gradients past t=2048 are not zero (fp16 positions lose both)."""
    g = torch.Generator().manual_seed(11)
    T = 10_000
    x = (torch.randn(1, T, 8, dtype=torch.float64, generator=g) + 0.3).to(dtype)
    ol = offsets(1, T, 2, generator=g, dtype=dtype)
    orr = offsets(1, T, 2, generator=g, dtype=dtype)
    expected = ops.talk_conv_ref(x.double(), ol.double(), orr.double(), 31, 31)
    out, (gx, gl, gr) = grads(lambda a, b, c: ops.talk_conv(a, b, c, 31, 31), x, ol, orr)
    tail = slice(2048, None)
    # fp32 prefix sums of mean-0.3 inputs reach ~3,000 here, so their cancellation costs ~1e-4 relative in fp32;
    # fp16/bf16 stay at output rounding because their sums are fp32 too.
    assert rel_err(out[:, tail], expected[:, tail]) <= max(REL_TOL[dtype], 1e-4)
    assert (gl[:, tail] != 0).float().mean() > 0.99 and (gr[:, tail] != 0).float().mean() > 0.99


@pytest.mark.parametrize("causal", [False, True], ids=["encoder", "causal"])
def test_noncontiguous_inputs(causal):
    x = torch.randn(2, 11, 6, dtype=torch.float64)
    ol, orr = offsets(2, 11, 3), None if causal else offsets(2, 11, 3)
    mr = 0 if causal else 2
    expected = ops.talk_conv_ref(x, ol, orr, 3, mr)
    nc = [noncontiguous(t) if t is not None else None for t in (x, ol, orr)]
    assert_close(ops.talk_conv(nc[0], nc[1], nc[2], 3, mr), expected)
    xt = x.transpose(0, 1).contiguous().transpose(0, 1)  # another stride pattern
    assert_close(ops.talk_conv(xt, ol, orr, 3, mr), expected)


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("causal", [False, True], ids=["encoder", "causal"])
def test_zero_padding_does_not_change_real_tokens(side, causal):
    """Padding zeroed on either side leaves the outputs of real tokens exactly as without padding."""
    T, pad = 9, 5
    x = torch.randn(1, T, 4, dtype=torch.float64)
    ol, orr = offsets(1, T, 2), offsets(1, T, 2)
    mr, orr = (0, None) if causal else (6, orr)
    expected = ops.talk_conv(x, ol, orr, 6, mr)
    spec = (0, 0, pad, 0) if side == "left" else (0, 0, 0, pad)
    real = slice(pad, None) if side == "left" else slice(0, T)
    padded = [torch.nn.functional.pad(t, spec, value=0.5) if t is not None else None for t in (ol, orr)]
    out = ops.talk_conv(torch.nn.functional.pad(x, spec), padded[0], padded[1], 6, mr)
    torch.testing.assert_close(out[:, real], expected, rtol=1e-12, atol=1e-12)


def test_batch_equals_rows_one_at_a_time():
    x = torch.randn(4, 17, 6)
    ol, orr = offsets(4, 17, 2, dtype=torch.float32), offsets(4, 17, 2, dtype=torch.float32)
    batched = ops.talk_conv(x, ol, orr, 5, 5)
    for b in range(4):
        assert torch.equal(batched[b : b + 1], ops.talk_conv(x[b : b + 1], ol[b : b + 1], orr[b : b + 1], 5, 5))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["encoder", "causal"])
@pytest.mark.parametrize(
    "H,R",
    [
        pytest.param(8, 4, id="H8-R4"),  # 8, 4 or 2 heads per task (batch of 3 or 1 sample, 1 or 2 threads)
        pytest.param(3, 200, id="H3-R200"),  # 2 + 1 heads per task, or 1 (1 sample under 2 threads)
    ],
)
def test_cpu_forward_is_bitwise_independent_of_threads_and_batch(H, R, causal, dtype):
    """The CPU forward groups heads into tasks by the thread count and the batch size (talk_conv_cpu.cpp,
    head_groups); each head's sums start at its own first row read in a time tile, so the outputs are bitwise the same
    under 1 and 2 threads and for a sample alone or in a batch. Heads of very different reach (offsets below 0 and
    past 1) over two time tiles (T=301)."""
    g = torch.Generator().manual_seed(H * R)
    B, T, max_left, max_right = 3, 301, 9, (0 if causal else 5)
    x = torch.randn(B, T, H * R, dtype=dtype, generator=g)
    reach = torch.linspace(0.05, 1.6, H, dtype=dtype)
    ol = torch.rand(B, T, H, dtype=dtype, generator=g) * reach - 0.1
    orr = None if causal else torch.rand(B, T, H, dtype=dtype, generator=g) * reach.flip(0) - 0.1
    forward = lambda x, ol, orr: torch.ops.talk_hf.talk_conv_fwd(x, ol, orr, max_left, max_right)  # noqa: E731
    batched = {}
    previous = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            batched[threads] = forward(x, ol, orr)
            for b in range(B):
                alone = forward(x[b : b + 1], ol[b : b + 1], None if causal else orr[b : b + 1])
                assert torch.equal(alone, batched[threads][b : b + 1]), f"sample {b} alone, {threads} thread(s)"
    finally:
        torch.set_num_threads(previous)
    assert torch.equal(batched[1], batched[2]), "1 vs 2 threads"


@pytest.mark.parametrize("max_left,split", [(0, 6), (1, 6), (7, 6), (4, 5), (4, 6), (4, 7)])
def test_steps_equal_causal_op(max_left, split):
    """Prefix via the full op, then single steps and a chunk from the fixed-size state, equal the full causal op
    (prefixes shorter than, as long as, and longer than the max_left + 2 state)."""
    T = 23
    x = torch.randn(2, T, 6, dtype=torch.float64)
    ol = offsets(2, T, 3)
    full = ops.talk_conv(x, ol, None, max_left, 0)
    state = ops.talk_conv_state_from_prefix(x[:, :split], max_left)
    outs = [ops.talk_conv(x[:, :split], ol[:, :split], None, max_left, 0)]
    for t in range(split, T - 5):
        out, state = ops.talk_conv_step(x[:, t : t + 1], ol[:, t : t + 1], state, max_left)
        assert state.shape == (2, max_left + 2, 6)
        outs.append(out)
    out, state = ops.talk_conv_step(x[:, T - 5 :], ol[:, T - 5 :], state, max_left)  # a multi-token chunk
    outs.append(out)
    torch.testing.assert_close(torch.cat(outs, 1), full, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(state, ops.talk_conv_state_from_prefix(x, max_left), rtol=1e-12, atol=1e-12)


def test_fp32_decoding_does_not_drift_over_20000_steps():
    """Inputs with a non-zero mean make absolute prefix sums grow with the position (20,000 here), and fp32 windows
    read as differences of them lose digits (7.8e-4 relative error by the end when the state held absolute sums).
    The state is kept relative to the row before it, so the last steps are as exact as the first."""
    g = torch.Generator().manual_seed(4)
    B, T, C, H, max_left = 1, 20_000, 8, 2, 31
    x = torch.randn(B, T, C, generator=g) * 0.1 + 1.0
    ol = offsets(B, T, H, generator=g, dtype=torch.float32)
    state, outs = ops.talk_conv_init_state(B, C, max_left), []
    for t in range(T):
        out, state = ops.talk_conv_step(x[:, t : t + 1], ol[:, t : t + 1], state, max_left)
        outs.append(out)
    expected = ops.talk_conv_ref(x.double(), ol.double(), None, max_left, 0)
    assert_close(torch.cat(outs, 1)[:, -1000:], expected[:, -1000:], torch.float32)
    assert state.abs().max() < 100  # window-sized values, not position-sized ones


def test_steps_from_empty_state_in_fp16_keep_fp32_state():
    x = torch.randn(1, 12, 4).half()
    ol = offsets(1, 12, 2, dtype=torch.float16)
    state = ops.talk_conv_init_state(1, 4, 3)
    outs = []
    for t in range(12):
        out, state = ops.talk_conv_step(x[:, t : t + 1], ol[:, t : t + 1], state, 3)
        outs.append(out)
    assert state.dtype == torch.float32 and outs[0].dtype == torch.float16
    assert_close(torch.cat(outs, 1), ops.talk_conv_ref(x.double(), ol.double(), None, 3, 0), torch.float16)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("T_new,max_left,H", [(1, 0, 1), (1, 3, 2), (1, 31, 8), (5, 7, 4), (3, 2, 8), (0, 3, 2)])
def test_compiled_step_matches_its_pytorch_form(dtype, T_new, max_left, H):
    """The fused decoding-step kernel against the same math in PyTorch ops (`_talk_conv_step_ref`, the autograd
    path): outputs and new state from a random state, offsets outside [0, 1] included (clipped by both); no new
    tokens leave the state as it is."""
    from talk_hf.talk_conv import _talk_conv_step_ref

    g = torch.Generator().manual_seed(T_new * 10 + max_left)
    B, C = 3, 8
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    x = torch.randn(B, T_new, C, generator=g, dtype=torch.float64).to(dtype)
    ol = (torch.rand(B, T_new, H, generator=g, dtype=torch.float64) * 1.4 - 0.2).to(dtype)
    state = torch.randn(B, max_left + 2, C, generator=g, dtype=torch.float64).to(acc)
    with torch.no_grad():
        out, new_state = torch.ops.talk_hf.talk_conv_step(x, ol, state, max_left)
        want_out, want_state = _talk_conv_step_ref(x, ol, state, max_left)
    assert out.dtype == dtype and new_state.dtype == acc
    torch.testing.assert_close(out, want_out, rtol=REL_TOL[dtype], atol=REL_TOL[dtype])
    torch.testing.assert_close(new_state, want_state, rtol=1e-6 if acc == torch.float32 else 1e-12, atol=1e-6)


def test_step_uses_the_kernel_without_gradients_and_pytorch_ops_with_them():
    x, ol = torch.randn(2, 1, 6), offsets(2, 1, 3, dtype=torch.float32)
    state = ops.talk_conv_init_state(2, 6, 4)

    def kernel_calls(*args):
        with torch.profiler.profile() as prof:
            ops.talk_conv_step(*args, state, 4)
        return sum(e.name == "talk_hf::talk_conv_step" for e in prof.events())

    with torch.no_grad():
        assert kernel_calls(x, ol) == 1
    assert kernel_calls(x, ol) == 1  # nothing requires grad
    xg = x.clone().requires_grad_()
    assert kernel_calls(xg, ol) == 0
    out, _ = ops.talk_conv_step(xg, ol, state, 4)
    out.sum().backward()
    assert xg.grad is not None and xg.grad.abs().sum() > 0


def test_step_kernel_checks_its_inputs():
    x, ol = torch.randn(2, 1, 6), offsets(2, 1, 3, dtype=torch.float32)
    with pytest.raises(RuntimeError, match=r"state must be \(B, max_left \+ 2, C\)"):
        torch.ops.talk_hf.talk_conv_step(x, ol, torch.zeros(2, 5, 6), 4)
    with pytest.raises(RuntimeError, match="state must be Float"):
        torch.ops.talk_hf.talk_conv_step(x, ol, torch.zeros(2, 6, 6, dtype=torch.float64), 4)
    with pytest.raises(RuntimeError, match="divisible by heads"):
        torch.ops.talk_hf.talk_conv_step(x, offsets(2, 1, 4, dtype=torch.float32), torch.zeros(2, 6, 6), 4)


def test_step_and_init_state_name_a_missing_state_or_a_bad_size():
    x, ol = torch.randn(2, 1, 6), offsets(2, 1, 3, dtype=torch.float32)
    with pytest.raises(TypeError, match="state must be a torch.Tensor, got NoneType"):
        ops.talk_conv_step(x, ol, None, 4)
    with pytest.raises(ValueError, match="state must have 3 dimensions"):
        ops.talk_conv_step(x, ol, torch.zeros(6, 6), 4)
    with pytest.raises(ValueError, match="max_left must be >= 0, got -3"):
        ops.talk_conv_init_state(2, 6, -3)
    with pytest.raises(ValueError, match="batch must be >= 0, got -1"):
        ops.talk_conv_init_state(-1, 6, 3)
    with pytest.raises(TypeError, match="channels must be an int"):
        ops.talk_conv_init_state(2, 6.0, 3)
    assert ops.talk_conv_init_state(np.int64(2), torch.tensor(6), np.int32(3)).shape == (2, 5, 6)  # sizes as torch takes them


def test_opcheck():
    x = torch.randn(2, 7, 6)
    ol, orr = offsets(2, 7, 3, dtype=torch.float32), offsets(2, 7, 3, dtype=torch.float32)
    fwd = torch.ops.talk_hf.talk_conv_fwd.default
    torch.library.opcheck(fwd, (x.requires_grad_(), ol.requires_grad_(), orr.requires_grad_(), 3, 2))
    torch.library.opcheck(fwd, (x, ol, None, 3, 0))
    torch.library.opcheck(torch.ops.talk_hf.talk_conv_bwd.default,
                          (torch.randn(2, 7, 6), x.detach(), ol.detach(), None, 3, 0))
    torch.library.opcheck(torch.ops.talk_hf.talk_conv_step.default, (x.detach(), ol.detach(), torch.randn(2, 5, 6), 3))


def test_torch_compile_matches_eager():
    x, ol, orr = torch.randn(2, 9, 6), offsets(2, 9, 3, dtype=torch.float32), offsets(2, 9, 3, dtype=torch.float32)
    compiled = torch.compile(lambda a, b, c: ops.talk_conv(a, b, c, 4, 4) * 2, fullgraph=True)
    torch.testing.assert_close(compiled(x, ol, orr), ops.talk_conv(x, ol, orr, 4, 4) * 2)


def test_opcheck_with_transposed_inputs():
    """The fake kernels return what the kernels return, contiguous tensors, whatever the inputs' strides."""
    x = transposed(torch.randn(2, 7, 6))
    ol, orr = transposed(offsets(2, 7, 3, dtype=torch.float32)), transposed(offsets(2, 7, 3, dtype=torch.float32))
    fwd = torch.ops.talk_hf.talk_conv_fwd.default
    torch.library.opcheck(fwd, (x.requires_grad_(), ol.requires_grad_(), orr.requires_grad_(), 3, 2))
    torch.library.opcheck(fwd, (x, ol, None, 3, 0))
    grad_out = transposed(torch.randn(2, 7, 6))
    torch.library.opcheck(torch.ops.talk_hf.talk_conv_bwd.default,
                          (grad_out, x.detach(), ol.detach(), orr.detach(), 3, 2))
    torch.library.opcheck(torch.ops.talk_hf.talk_conv_step.default,
                          (x.detach(), ol.detach(), transposed(torch.randn(2, 5, 6)), 3))


def test_torch_compile_of_a_channels_first_input():
    """Inductor lays out what follows the op by the fake kernel's strides: a (B, C, T) input transposed to (B, T, C),
    then a reshape that depends on the output's layout; forward and backward."""
    x, ol = torch.randn(2, 6, 9), offsets(2, 9, 3, dtype=torch.float32)

    def fn(a, b):
        return ops.talk_conv(a.transpose(1, 2), b, None, 4, 0).reshape(2, -1)

    assert_compiled_matches(fn, x, ol)


def test_second_order_gradients_of_the_kernel_raise():
    """The kernels' backward has no derivative of its own: a second derivative through it raises instead of being
    zero, and names the references, which have one."""
    x = torch.randn(1, 5, 4, dtype=torch.float64, requires_grad=True)
    ol = offsets(1, 5, 2).requires_grad_()
    for causal in (False, True):
        orr, max_right = (None, 0) if causal else (ol, 1)
        out = ops.talk_conv(x, ol, orr, 2, max_right)
        (gx,) = torch.autograd.grad(out.square().sum(), x, create_graph=True)
        torch.testing.assert_close(gx, torch.autograd.grad(out.square().sum(), x, retain_graph=True)[0])
        with pytest.raises(RuntimeError, match=r"talk_conv_bwd.*second-order.*talk_conv_ref.*"
                                               r"TALK_HF_FORCE_REFERENCE=1"):
            torch.autograd.grad(gx.sum(), ol)
        (gx,) = torch.autograd.grad(ops.talk_conv_ref(x, ol, orr, 2, max_right).square().sum(), x, create_graph=True)
        assert torch.autograd.grad(gx.sum(), ol)[0].abs().sum() > 0


def grads_of_every_output(fn, *inputs):
    """fn's outputs (a tensor or a tuple) and the gradients of the sum of all their entries w.r.t. every input."""
    inputs = [t.detach().clone().requires_grad_() for t in inputs]
    outputs = fn(*inputs)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    sum(out.sum() for out in outputs).backward()
    return [out.detach() for out in outputs], [t.grad for t in inputs]


@pytest.mark.parametrize("backend", ["compiled", "reference"])
@pytest.mark.parametrize("B,T", [(0, 7), (2, 0), (0, 0)])
def test_empty_batch_or_sequence(B, T, backend, monkeypatch):
    """Zero sizes give empty outputs of the compiled op's shapes, connected to the graph (a backward runs), in the
    compiled op, the references and the forced-reference path of the public ops; a step over no token keeps the
    state."""
    x, ol = torch.randn(B, T, 6), offsets(B, T, 3, dtype=torch.float32)
    state = torch.randn(B, 4, 6)
    shapes = [tuple(t.shape) for t in (*torch.ops.talk_hf.talk_conv_step(x, ol, state, 2), ol)]
    if backend == "reference":
        monkeypatch.setenv("TALK_HF_FORCE_REFERENCE", "1")
    calls = {
        "encoder": lambda a, b: ops.talk_conv(a, b, b, 2, 3),
        "causal": lambda a, b: ops.talk_conv(a, b, None, 2, 0),
        "reference": lambda a, b: ops.talk_conv_ref(a, b, b, 2, 3),
    }
    for name, call in calls.items():
        (out,), (gx, gol) = grads_of_every_output(call, x, ol)
        assert (out.shape, gx.shape, gol.shape) == (x.shape, x.shape, ol.shape), name
    (out, new_state), (_, gol, _) = grads_of_every_output(lambda *a: ops.talk_conv_step(*a, 2), x, ol, state)
    assert [tuple(t.shape) for t in (out, new_state, gol)] == shapes
    if T == 0:
        assert torch.equal(new_state, state)


@pytest.mark.parametrize("max_left,max_right", [(2**62, 0), (2**61, 2**61), (2**62, 2**62), (2**63 - 1, 0)])
def test_reaches_past_the_kernels_int64_window_sizes_are_refused(max_left, max_right):
    """The kernels compute the window size max_left + max_right + 1 in int64, and add tiles of steps to it: sizes
    above 2**62 are refused by name in every op."""
    x, ol = torch.randn(1, 4, 2, dtype=torch.float64), offsets(1, 4, 1)
    orr = ol if max_right else None
    match = (rf"max_left \+ max_right \+ 1 = {max_left + max_right + 1} is more than 2\*\*62.*max_left={max_left}, "
             rf"max_right={max_right}")
    for op in (ops.talk_conv, ops.talk_conv_ref):
        with pytest.raises(ValueError, match=match):
            op(x, ol, orr, max_left, max_right)
    if not max_right:
        with pytest.raises(ValueError, match=match):
            ops.talk_conv_step(x, ol, torch.zeros(1, 0, 2, dtype=torch.float64), max_left)


@pytest.mark.parametrize("max_left,max_right", [(2**61, 2**61 - 1), (2**62 - 1, 0)])
def test_windows_of_2_to_the_62_steps_match_the_reference(max_left, max_right):
    x, ol = torch.randn(1, 4, 2, dtype=torch.float64), offsets(1, 4, 1)
    orr = ol if max_right else None
    assert_close(ops.talk_conv(x, ol, orr, max_left, max_right), ops.talk_conv_ref(x, ol, orr, max_left, max_right))


BAD_INPUTS = [
    (lambda x, o: ops.talk_conv(x[0], o, o, 2, 2), ValueError, "x must have 3 dimensions"),
    (lambda x, o: ops.talk_conv(x, torch.rand(2, 5, 4), torch.rand(2, 5, 4), 2, 2), ValueError, "divisible"),
    (lambda x, o: ops.talk_conv(x, o, o, -1, 2), ValueError, "max_left"),
    (lambda x, o: ops.talk_conv(x, o, o, 2, -3), ValueError, "max_right"),
    (lambda x, o: ops.talk_conv(x, o, None, 2, 2), ValueError, "offset_right"),
    (lambda x, o: ops.talk_conv(x, o.double(), o, 2, 2), TypeError, "offset_left"),
    (lambda x, o: ops.talk_conv(x, o, o[:, :3], 2, 2), ValueError, "offset_right"),
    (lambda x, o: ops.talk_conv(x, o.to("meta"), o, 2, 2), ValueError, "offset_left"),
    (lambda x, o: ops.talk_conv(x.long(), o, o, 2, 2), TypeError, "x must be a floating-point"),
    (lambda x, o: ops.talk_conv(x, o, o, 2.5, 2), TypeError, "max_left"),
    (lambda x, o: ops.talk_conv_step(x, o, torch.zeros(2, 3, 6), 2), ValueError, "state"),
]


@pytest.mark.parametrize("call,error,match", BAD_INPUTS)
def test_bad_input_names_the_argument(call, error, match):
    with pytest.raises(error, match=match):
        call(torch.randn(2, 5, 6), torch.rand(2, 5, 3))
