"""The CUDA kernels against the references, on a GPU (scripts/gpu_check.sh runs this file, then compute-sanitizer
over its `small` tests). Without a CUDA device there is nothing to run these kernels on and the module is skipped;
with one, the extension must have been built with its CUDA kernels (otherwise every test fails).

Each case runs the op on CUDA in float64 (and fp32/bf16 where noted) and compares outputs and gradients with the
pure-PyTorch reference on the CPU by relative error (tests/utils.py tolerances)."""

import pytest
import torch

from talk_hf import ops
from talk_hf.rfa import rfa_causal_chunked
from tests.ops.test_rfa import check_feature_map_bounded, check_feature_map_sine_and_cosine, features, gate
from tests.utils import REL_TOL, assert_close, grads, offsets, rel_err

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
CUDA = torch.device("cuda")


def on(device, *tensors):
    return [None if t is None else t.to(device) for t in tensors]


@pytest.fixture(autouse=True)
def cuda_kernels_built():
    """Every test here fails without the CUDA kernels: the ops would fall back to the reference on CUDA tensors,
    and comparing the reference with itself checks nothing."""
    assert "cuda" in ops.compiled_devices(), "talk_hf._C was built without CUDA kernels (needs nvcc and CUDA torch)"
    assert ops.backend("cuda") == "compiled"


TALK_CASES = [  # B, T, C, H, max_left, max_right; "small" ones also run under compute-sanitizer
    pytest.param(2, 13, 6, 3, 3, 4, id="small-T13"),
    pytest.param(1, 1, 4, 2, 2, 2, id="small-T1"),
    pytest.param(3, 5, 8, 8, 15, 15, id="small-T<window-H=C"),
    pytest.param(2, 389, 320, 2, 13, 9, id="T389-R160"),
    pytest.param(1, 10_000, 64, 4, 31, 31, id="T10000"),
]


@pytest.mark.parametrize("causal", [False, True], ids=["encoder", "causal"])
@pytest.mark.parametrize("B,T,C,H,max_left,max_right", TALK_CASES)
def test_talk_conv_matches_reference(B, T, C, H, max_left, max_right, causal):
    g = torch.Generator().manual_seed(T + C)
    x = torch.randn(B, T, C, dtype=torch.float64, generator=g)
    ol = offsets(B, T, H, generator=g) * 1.5  # past 1, as offset dropout makes them
    orr, mr = (None, 0) if causal else (offsets(B, T, H, generator=g), max_right)
    inputs = (x, ol) if causal else (x, ol, orr)
    call = lambda fn: lambda x, ol, orr=None: fn(x, ol, orr, max_left, mr)  # noqa: E731
    expected, want = grads(call(ops.talk_conv_ref), *inputs)
    out, got = grads(call(ops.talk_conv), *on(CUDA, *inputs))
    assert_close(out.cpu(), expected)
    for name, a, b in zip(["x", "offset_left", "offset_right"], got, want):
        assert_close(a.cpu(), b, name=f"grad {name}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_talk_conv_low_precision(dtype):
    g = torch.Generator().manual_seed(3)
    x, ol, orr = (torch.randn(2, 3000, 64, generator=g), offsets(2, 3000, 4, generator=g),
                  offsets(2, 3000, 4, generator=g))
    x, ol, orr = x.to(dtype), ol.to(dtype), orr.to(dtype)
    expected = ops.talk_conv_ref(x.double(), ol.double(), orr.double(), 31, 31)
    out = ops.talk_conv(*on(CUDA, x, ol, orr), 31, 31)
    assert out.dtype == dtype and rel_err(out.cpu(), expected) <= REL_TOL[dtype]


CONV_CASES = [pytest.param(2, 11, 6, 3, 3, 1, id="small-K3"), pytest.param(1, 7, 4, 4, 9, 8, id="small-K>T"),
              pytest.param(2, 500, 96, 8, 31, 15, id="K31"), pytest.param(1, 50, 8, 2, 1, -3, id="small-K1-P<0")]


@pytest.mark.parametrize("weight_dropout", [0.0, 0.3], ids=["", "dropconnect"])
@pytest.mark.parametrize("light", [False, True], ids=["dynamic", "light"])
@pytest.mark.parametrize("softmax", [False, True], ids=["normalised", "logits"])
@pytest.mark.parametrize("B,T,C,H,K,P", CONV_CASES)
def test_dynamic_conv_matches_reference(B, T, C, H, K, P, softmax, light, weight_dropout):
    """DropConnect: the seed on the GPU draws the mask that the CPU reference draws from the same seed."""
    g = torch.Generator().manual_seed(K * T)
    x = torch.randn(B, T, C, dtype=torch.float64, generator=g)
    w = 3 * torch.randn(*((H, K) if light else (B, T, H, K)), dtype=torch.float64, generator=g)  # light: read in place
    w = w if softmax else w.softmax(-1)
    seed = torch.tensor(K * T - 2**40)
    expected, want = grads(lambda x, w: ops.dynamic_conv_ref(x, w, P, softmax, weight_dropout, seed), x, w)
    out, got = grads(lambda x, w: ops.dynamic_conv(x, w, P, softmax, weight_dropout, seed.to(CUDA)),
                     *on(CUDA, x, w))
    assert_close(out.cpu(), expected)
    for name, a, b in zip(["x", "weight"], got, want):
        assert_close(a.cpu(), b, name=f"grad {name}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_dynamic_conv_softmax_low_precision(dtype):
    """Logits in fp32/bf16, probabilities in fp32 registers: against the fp64 reference."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, 300, 64, dtype=torch.float64, generator=g)
    w = 3 * torch.randn(2, 300, 4, 31, dtype=torch.float64, generator=g)
    expected, want = grads(lambda x, w: ops.dynamic_conv_ref(x, w, 30, True), x.to(dtype).double(),
                           w.to(dtype).double())
    out, got = grads(lambda x, w: ops.dynamic_conv(x, w, 30, True), *on(CUDA, x.to(dtype), w.to(dtype)))
    assert out.dtype == dtype
    assert_close(out.cpu(), expected, dtype)
    for name, a, b in zip(["x", "logits"], got, want):
        assert_close(a.cpu(), b, dtype, name=f"grad {name}")


RFA_CASES = [pytest.param(2, 1, 2, 8, 4, 64, id="small-T1"), pytest.param(1, 29, 3, 6, 5, 4, id="small-T29-chunk4"),
             pytest.param(2, 300, 4, 64, 64, 64, id="T300-F64-d64")]


@pytest.mark.parametrize("B,T,H,F,d,chunk", RFA_CASES)
def test_rfa_causal_matches_reference(B, T, H, F, d, chunk):
    g = torch.Generator().manual_seed(T + F)
    q, k = features(B, T, H, F, g), features(B, T, H, F, g)
    v = torch.randn(B, T, H, d, generator=g, dtype=torch.float64)
    decay = gate(B, T, H, g)
    initial = 0.1 * torch.randn(B, H, F, d + 1, generator=g, dtype=torch.float64)
    expected = rfa_grads(ops.rfa_causal_ref, q, k, v, decay, initial, torch.float64)
    got = rfa_grads(lambda *a: ops.rfa_causal_compiled(*a, chunk_size=chunk), *on(CUDA, q, k, v, decay, initial),
                    torch.float64)
    assert_rfa_close(got, expected, REL_TOL[torch.float64])
    chunked = rfa_causal_chunked(*on(CUDA, q, k, v, decay, initial), chunk_size=chunk)[0]
    assert_close(chunked.cpu(), expected[0], name="chunked form on CUDA")


STEP_CASES = [  # B, T_new, C, H, reach (max_left, or K - 1)
    pytest.param(3, 1, 40, 4, 31, id="small-T1"),
    pytest.param(2, 5, 8, 8, 3, id="small-T5-H=C"),
    pytest.param(4, 1, 1024, 16, 0, id="reach0"),
]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("B,T,C,H,reach", STEP_CASES)
def test_decoding_step_kernels_match_the_cpu(B, T, C, H, reach, dtype):
    """talk_conv_step and dynamic_conv_step on CUDA against the same ops on the CPU (both checked there against
    their PyTorch forms): outputs and new states."""
    g = torch.Generator().manual_seed(B * T + reach)
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    x = torch.randn(B, T, C, generator=g, dtype=torch.float64).to(dtype)
    ol = (torch.rand(B, T, H, generator=g, dtype=torch.float64) * 1.4 - 0.2).to(dtype)
    state = torch.randn(B, reach + 2, C, generator=g, dtype=torch.float64).to(acc)
    logits = torch.randn(B, T, H, reach + 1, generator=g, dtype=torch.float64)
    w, logits = logits.softmax(-1).to(dtype), logits.to(dtype)
    ring = torch.randn(B, reach, C, generator=g, dtype=torch.float64).to(dtype)
    with torch.no_grad():
        for fn, args in [(ops.talk_conv_step, (x, ol, state, reach)), (ops.dynamic_conv_step, (x, w, ring)),
                         (ops.dynamic_conv_step, (x, logits, ring, True))]:
            want = fn(*args)
            got = fn(*[a.to(CUDA) if isinstance(a, torch.Tensor) else a for a in args])
            for name, a, b in zip(["out", "new state"], got, want):
                assert a.device.type == "cuda" and a.dtype == b.dtype
                assert_close(a.cpu(), b, dtype, name=f"{fn.__name__} {name}")


def test_opcheck_on_cuda():
    x, ol, orr = torch.randn(2, 9, 6, device=CUDA), torch.rand(2, 9, 3, device=CUDA), torch.rand(2, 9, 3, device=CUDA)
    torch.library.opcheck(torch.ops.talk_hf.talk_conv_fwd.default, (x.requires_grad_(), ol, orr, 3, 2))
    w = torch.rand(2, 9, 3, 4, device=CUDA).softmax(-1)
    torch.library.opcheck(torch.ops.talk_hf.dynamic_conv_fwd.default, (x, w.requires_grad_(), 2))
    torch.library.opcheck(torch.ops.talk_hf.dynamic_conv_fwd.default, (x, w, 2, True))
    torch.library.opcheck(torch.ops.talk_hf.dynamic_conv_fwd.default, (x, w, 2, True, torch.tensor(3, device=CUDA),
                                                                        0.5))
    g = torch.Generator().manual_seed(0)
    q = features(2, 9, 2, 4, g, torch.float32).to(CUDA)
    v = torch.randn(2, 9, 2, 3, device=CUDA)
    torch.library.opcheck(torch.ops.talk_hf.rfa_causal_fwd.default, (q.requires_grad_(), q, v, None, None, 0.1, 4))
    torch.library.opcheck(torch.ops.talk_hf.rfa_causal_fwd.default, (q.detach(), q.detach(), v, None, None, 0.1, 0))
    torch.library.opcheck(torch.ops.talk_hf.talk_conv_step.default,
                          (x.detach(), ol, torch.randn(2, 5, 6, device=CUDA), 3))
    torch.library.opcheck(torch.ops.talk_hf.dynamic_conv_step.default, (x.detach(), w.detach(), torch.randn(2, 3, 6,
                                                                                                        device=CUDA)))


# The chunked RFA kernels (csrc/cuda/rfa_chunked_blocks.h) run for T > 1 when their shared memory fits the device,
# the per-step kernels (csrc/cuda/rfa_blocks.h) for decoding steps (T = 1) and for shapes too large for it.
RFA_KERNELS = ("rfa_fwd_kernel", "rfa_bwd_kernel", "rfa_chunked_fwd_kernel", "rfa_chunked_bwd_kernel")


def rfa_grads(fn, q, k, v, decay, initial, dtype):
    """Output, final state and the gradients of q, k, v, decay and the initial state under autograd, in `dtype`, for a
    loss reaching the outputs and the final state -> fp64 tensors on the CPU."""
    inputs = [None if t is None else t.detach().to(dtype).requires_grad_() for t in (q, k, v, decay, initial)]
    out, state = fn(*inputs)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64).to(out.device)
    u = torch.randn(state.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64).to(out.device)
    ((out.double() * w).sum() + (state.double() * u).sum()).backward()
    return [t.detach().double().cpu() for t in (out, state)] + [None if t is None else t.grad.double().cpu()
                                                                for t in inputs]


def assert_rfa_close(got, expected, tol):
    """rfa_grads results (None where an input is absent) within relative error `tol` of the expected ones."""
    for name, a, b in zip(["out", "state", "q", "k", "v", "decay", "initial"], got, expected):
        assert (a is None) == (b is None), name
        if a is not None:
            assert a.shape == b.shape and rel_err(a, b) <= tol, name


def rfa_inputs(B, T, H, F, d, decay, seed):
    g = torch.Generator().manual_seed(seed)
    q, k = (features(B, T, H, F + 1, g)[..., :F].contiguous() for _ in range(2))  # any F, odd ones too
    v = torch.randn(B, T, H, d, generator=g, dtype=torch.float64)
    r, u = torch.rand(B, T, H, generator=g, dtype=torch.float64), torch.rand(B, T, H, generator=g, dtype=torch.float64)
    gates = {"none": None, "gate": gate(B, T, H, g),
             "zeros-ones": torch.where(r < 0.15, 0.0, torch.where(r < 0.6, 1.0, u))}  # exact 0s and 1s, and (0, 1)
    initial = 0.1 * torch.randn(B, H, F, d + 1, generator=g, dtype=torch.float64)
    return q, k, v, gates[decay], initial


def launched_rfa_kernels(fn):
    """(names (RFA_KERNELS) of the RFA kernels that fn() launches, fn()'s result)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        result = fn()
        torch.cuda.synchronize()
    return {name for e in prof.events() for name in RFA_KERNELS if name in e.name}, result


RFA_CHUNKED_CASES = [  # B, T, H, F, d, chunk; "small" ones also run under compute-sanitizer
    pytest.param(2, 1, 2, 8, 4, 64, id="small-T1-per-step"),
    pytest.param(1, 29, 3, 6, 5, 4, id="small-T29-chunk4"),
    pytest.param(2, 17, 3, 33, 17, 16, id="small-T17=L+1-F33-d17"),
    pytest.param(1, 64, 2, 8, 4, 64, id="small-T=L"),
    pytest.param(2, 131, 4, 64, 64, 64, id="T131-F64-d64"),
]


@pytest.mark.parametrize("decay", ["gate", "zeros-ones", "none"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("B,T,H,F,d,chunk", RFA_CHUNKED_CASES)
def test_rfa_causal_kernels_train_against_reference(B, T, H, F, d, chunk, dtype, decay):
    """ops.rfa_causal on CUDA with gradients (the kernels, chunked for T > 1) against rfa_causal_ref in fp64 on the
    same rounded inputs: outputs, final state and every gradient through torch.autograd."""
    q, k, v, dec, initial = rfa_inputs(B, T, H, F, d, decay, seed=T + F)
    rounded = [None if t is None else t.to(dtype).double() for t in (q, k, v, dec, initial)]
    expected = rfa_grads(ops.rfa_causal_ref, *rounded, torch.float64)
    got = rfa_grads(lambda *a: ops.rfa_causal(*a, chunk_size=chunk), *on(CUDA, q, k, v, dec, initial), dtype)
    # fp32 with exact zero decays: exponents near log(FLT_MIN) lose ~1e-5 (tests/ops/test_rfa_chunked_programs.py)
    scale = 3 if dtype == torch.float32 and decay == "zeros-ones" else 1
    assert_rfa_close(got, expected, scale * REL_TOL[dtype])


@pytest.mark.parametrize("T", [pytest.param(1, id="small-T1-per-step"), pytest.param(40, id="small-T40-chunked")])
def test_rfa_in_place_step_on_cuda(T):
    """rfa_step_ on CUDA: the kernels read the state and write the new one over it (the per-step kernel for one
    token, the chunked one for more), against the out-of-place step on the CPU."""
    q, k, v, dec, initial = [t.float() for t in rfa_inputs(2, T, 2, 8, 4, "gate", seed=T)]
    want, want_state = ops.rfa_step(q, k, v, initial.clone(), dec)
    state = initial.to(CUDA)
    address = state.data_ptr()
    out = ops.rfa_step_(*on(CUDA, q, k, v), state, dec.to(CUDA))
    assert state.data_ptr() == address
    assert rel_err(out.cpu(), want) <= REL_TOL[torch.float32]
    assert rel_err(state.cpu(), want_state) <= REL_TOL[torch.float32]


def tensor_core_launches(fn):
    """("all" when every RFA kernel fn() launches is a tensor-core (WarpTile) instantiation, "none" when none is,
    "mixed" otherwise, fn()'s result); fails if fn() launches no RFA kernel. The kind is None when the profiler
    records no CUDA activity at all (under compute-sanitizer, which holds CUPTI): the results are still checked."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        result = fn()
        torch.cuda.synchronize()
    if not any(e.device_type == torch.autograd.DeviceType.CUDA for e in prof.events()):
        return None, result
    names = [e.name for e in prof.events() if any(k in e.name for k in RFA_KERNELS)]
    assert names, "no RFA kernel launched"
    tensor_cores = ["WarpTile" in n for n in names]
    return ("all" if all(tensor_cores) else "none" if not any(tensor_cores) else "mixed"), result


@pytest.mark.parametrize("decay", ["gate", "zeros-ones"])
@pytest.mark.parametrize("B,T,H,F,d,chunk", RFA_CHUNKED_CASES)
def test_rfa_tensor_core_kernels_train_against_reference(B, T, H, F, d, chunk, decay):
    """The op with tf32=True runs the tensor-core instantiations for fp32 calls of T > 1, forward and backward:
    outputs and every gradient within fp16 rounding (2e-3) of the fp64 reference, and not the exact kernels' results."""
    from talk_hf import _kernels
    from talk_hf.rfa import DEFAULT_EPS

    q, k, v, dec, initial = rfa_inputs(B, T, H, F, d, decay, seed=T + F)
    rounded = [None if t is None else t.float().double() for t in (q, k, v, dec, initial)]
    expected = rfa_grads(ops.rfa_causal_ref, *rounded, torch.float64)

    def call(tf32):
        return lambda *a: _kernels.rfa_causal(*a, DEFAULT_EPS, chunk, tf32)

    kind, got = tensor_core_launches(lambda: rfa_grads(call(True), *on(CUDA, q, k, v, dec, initial), torch.float32))
    # T = 1: the per-step kernels; F = d = 64 on a device below 227 KiB a block (A100): a per-step backward
    assert kind in (None, "none" if T == 1 else "all" if F < 64 or h100_class() else "mixed")
    assert_rfa_close(got, expected, REL_TOL[torch.float16])
    exact = rfa_grads(call(False), *on(CUDA, q, k, v, dec, initial), torch.float32)
    if T > 1:
        assert rel_err(got[0], exact[0]) > 2 * REL_TOL[torch.float32]


def test_rfa_causal_multiplies_exactly():
    """rfa_causal runs the exact fp32 products (the faster ones on an H100) for fp32, bf16 and fp16 v, with TF32
    allowed for fp32 matmuls or not; the tensor-core kernels only when the op is asked for them."""
    from talk_hf import _kernels
    from talk_hf.rfa import DEFAULT_EPS

    q, k, v, dec, initial = on(CUDA, *rfa_inputs(1, 40, 2, 8, 4, "gate", seed=4))
    q, k, dec, initial = q.float(), k.float(), dec.float(), initial.float()
    previous = torch.backends.cuda.matmul.allow_tf32
    try:
        with torch.no_grad():
            for allowed in (False, True):
                torch.backends.cuda.matmul.allow_tf32 = allowed
                for values in (v.float(), v.bfloat16(), v.half()):
                    assert tensor_core_launches(lambda: ops.rfa_causal(q, k, values, dec, initial))[0] in (None, "none")
            args = (q, k, v.float(), dec, initial, DEFAULT_EPS, 0)
            assert tensor_core_launches(lambda: _kernels.rfa_causal(*args, True))[0] in (None, "all")
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous


def h100_class():
    """The device grants a block 227 KiB of shared memory (H100, H200; an A100 grants 163 KiB)."""
    return torch.cuda.get_device_properties(CUDA).shared_memory_per_block_optin >= 227 * 1024


@pytest.mark.parametrize("T,F,d,expected", [
    (1, 8, 4, {"rfa_fwd_kernel", "rfa_bwd_kernel"}),                          # a decoding step
    (40, 8, 4, {"rfa_chunked_fwd_kernel", "rfa_chunked_bwd_kernel"}),
    (40, 64, 64, None),                                                       # the Table 6 head shape
    (40, 512, 16, {"rfa_fwd_kernel", "rfa_bwd_kernel"}),                      # too large for shared memory
])
def test_rfa_kernel_choice_and_fallback(T, F, d, expected):
    """Which kernels a training call launches (fp32, chunk 64), and that each path matches the reference; the
    fallback keeps any F and d working. F = d = 64: the forward needs 98 KiB of shared memory, the backward 196 KiB
    (chunked on an H100, per-step on an A100)."""
    if expected is None:
        expected = {"rfa_chunked_fwd_kernel", "rfa_chunked_bwd_kernel" if h100_class() else "rfa_bwd_kernel"}
    q, k, v, dec, initial = rfa_inputs(1, T, 2, F, d, "gate", seed=F)
    call = lambda *a: ops.rfa_causal(*a, chunk_size=64)  # noqa: E731
    launched, got = launched_rfa_kernels(lambda: rfa_grads(call, *on(CUDA, q, k, v, dec, initial), torch.float32))
    assert launched == expected
    want = rfa_grads(ops.rfa_causal_ref, *[t.float().double() for t in (q, k, v, dec, initial)], torch.float64)
    assert_rfa_close(got, want, REL_TOL[torch.float32])


def test_rfa_inference_runs_the_chunked_kernel_without_checkpoints():
    """No gradient: chunk 0 (nothing saved), the chunked forward alone, same results as with checkpoints."""
    q, k, v, dec, initial = rfa_inputs(2, 150, 2, 16, 8, "gate", seed=3)
    q, k, v, dec, initial = on(CUDA, q, k, v, dec, initial)
    fwd = torch.ops.talk_hf.rfa_causal_fwd
    launched, (out, state, saved) = launched_rfa_kernels(lambda: fwd(q, k, v, dec, initial, 0.1, 0))
    assert launched == {"rfa_chunked_fwd_kernel"}
    out64, state64, checkpoints = fwd(q, k, v, dec, initial, 0.1, 64)
    assert saved.shape == (2, 2, 0, 16, 9) and checkpoints.shape == (2, 2, 3, 16, 9)
    torch.testing.assert_close(out, out64, rtol=0, atol=0)
    torch.testing.assert_close(state, state64, rtol=0, atol=0)
    want_out, want_state = ops.rfa_causal_ref(*[t.cpu() for t in (q, k, v, dec, initial)])
    assert_close(out.cpu(), want_out)
    assert_close(state.cpu(), want_state, name="state")


def test_rfa_long_fp32_sequence():
    """fp32 kernels over 157 chunks (T = 10,000, chunk 64, a head of the Table 6 shape) against the fp64 recurrence."""
    q, k, v, dec, initial = rfa_inputs(1, 10_000, 1, 64, 64, "gate", seed=10)
    expected = rfa_grads(ops.rfa_causal_ref, *[t.float().double() for t in (q, k, v, dec, initial)], torch.float64)
    got = rfa_grads(lambda *a: ops.rfa_causal(*a, chunk_size=64), *on(CUDA, q, k, v, dec, initial), torch.float32)
    assert_rfa_close(got, expected, 10 * REL_TOL[torch.float32])  # 10,000 sequential fp32 steps


def test_rfa_opcheck_chunked_backward_on_cuda():
    g = torch.Generator().manual_seed(5)
    q, v = features(2, 19, 2, 6, g, torch.float32).to(CUDA), torch.randn(2, 19, 2, 3, generator=g).to(CUDA)
    decay, initial = gate(2, 19, 2, g, torch.float32).to(CUDA), (0.1 * torch.randn(2, 2, 6, 4, generator=g)).to(CUDA)
    _, _, checkpoints = torch.ops.talk_hf.rfa_causal_fwd(q, q, v, decay, initial, 0.1, 8)
    grads = (torch.randn_like(v), torch.randn_like(initial))
    torch.library.opcheck(torch.ops.talk_hf.rfa_causal_bwd.default,
                          (*grads, q, q, v, decay, initial, checkpoints, 0.1, 8))
    torch.library.opcheck(torch.ops.talk_hf.rfa_causal_fwd.default, (q.requires_grad_(), q, v, decay, initial, 0.1, 8))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("B,T,H,d,D", [pytest.param(8, 1, 4, 64, 256, id="small-decoding-step"),
                                       pytest.param(2, 37, 3, 7, 300, id="small-odd-d-D300"),
                                       pytest.param(4, 2000, 4, 64, 256, id="prefill")])
def test_rfa_feature_map_kernel_matches_reference(B, T, H, d, D, dtype):
    """The CUDA feature map (decoding and inference: no gradient) against the PyTorch form on the CPU; blocks of 128
    frequencies, so D = 300 covers a partial block."""
    g = torch.Generator().manual_seed(T + D)
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    x = torch.randn(B, T, H, d, generator=g, dtype=torch.float64).to(dtype)
    proj = ops.rfa_random_projection(H, D, d, generator=g, dtype=acc)
    tau = torch.rand(H, generator=g, dtype=acc) + 0.3
    expected = ops.rfa_feature_map_ref(x, proj, tau)
    with torch.no_grad():
        got = ops.rfa_feature_map(*on(CUDA, x, proj, tau))
    assert got.is_cuda and got.dtype == expected.dtype == acc
    assert rel_err(got.cpu(), expected) <= REL_TOL[acc]


@pytest.mark.parametrize("dtype,reach", [(torch.float32, 8000.0), (torch.float64, 1e8)], ids=["fp32", "fp64"])
def test_rfa_feature_map_kernel_sine_and_cosine_over_a_wide_range(dtype, reach):
    """The CUDA build of csrc/rfa_features.h's sine and cosine (nvcc may contract them into FMAs) to a few units in
    the last place of float64 truth, as on the CPU."""
    check_feature_map_sine_and_cosine(dtype, reach, CUDA)


@pytest.mark.parametrize("dtype,top", [(torch.float32, 38), (torch.float64, 300)], ids=["fp32", "fp64"])
def test_rfa_feature_map_kernel_stays_bounded_and_passes_inf_and_nan(dtype, top):
    check_feature_map_bounded(dtype, top, CUDA)
