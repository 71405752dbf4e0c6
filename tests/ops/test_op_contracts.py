"""Contracts the ops keep with PyTorch around them: the in-place RFA step as an in-place op (version counter,
inference tensors, under torch.compile and torch.func), fp32 products under autocast, DropConnect seeds under
torch.compile, torch.func over the ops (the feature map's derivatives, forward mode through every op), the
refused backward of the inference-only kernels, and the checks of chunk_size and key_scale. The "compiled" cases
need the CPU kernels, which `make test` builds (tests/test_cuda_sources.py checks that they are the ones in use)."""

import pytest
import torch

from talk_hf import ops
from talk_hf.rfa import rfa_causal_chunked


def step_inputs(seed, B=2, T=1, H=2, F=4, d=3):
    """Features, values, a gate and a state for rfa_step_: (q, k, v, decay, state), fp32."""
    g = torch.Generator().manual_seed(seed)
    q, k = 0.1 * torch.rand(B, T, H, F, generator=g), 0.1 * torch.rand(B, T, H, F, generator=g)
    v, decay = torch.randn(B, T, H, d, generator=g), torch.rand(B, T, H, generator=g) * 0.5 + 0.5
    return q, k, v, decay, 0.1 * torch.randn(B, H, F, d + 1, generator=g)


# ---------------------------------------------------------------------------------------------------------------
# rfa_step_: an in-place op


@pytest.mark.parametrize("backend", ["compiled", "reference"])
def test_in_place_step_invalidates_what_autograd_saved_of_the_state(backend, monkeypatch):
    """A backward that saved the state before rfa_step_ overwrote it raises, as for any in-place op, instead of
    reading the new values."""
    if backend == "reference":
        monkeypatch.setenv("TALK_HF_FORCE_REFERENCE", "1")
    q, k, v, decay, state = step_inputs(0)
    scale = torch.tensor(2.0, requires_grad=True)
    saved = (scale * state).sum()  # saves state for the gradient of scale
    version = state._version
    ops.rfa_step_(q, k, v, state, decay)
    assert state._version > version
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        saved.backward()


def test_in_place_step_op_bumps_the_version_of_its_state():
    q, k, v, decay, state = step_inputs(1)
    version = state._version
    torch.ops.talk_hf.rfa_causal_step_(q, k, v, decay, state, 0.1)
    assert state._version > version


@pytest.mark.parametrize("backend", ["compiled", "reference"])
def test_in_place_step_refuses_an_inference_state_outside_inference_mode(backend, monkeypatch):
    """As PyTorch's in-place ops do; inside inference mode the step runs."""
    if backend == "reference":
        monkeypatch.setenv("TALK_HF_FORCE_REFERENCE", "1")
    q, k, v, decay, state = step_inputs(2)
    want_out, want_state = ops.rfa_step(q, k, v, state.clone(), decay)
    with torch.inference_mode():
        inference_state = state.clone()
        torch.testing.assert_close(ops.rfa_step_(q, k, v, inference_state, decay), want_out)
    torch.testing.assert_close(inference_state, want_state)
    before = inference_state.clone()
    with pytest.raises(RuntimeError, match="Inplace update to inference tensor outside InferenceMode"):
        ops.rfa_step_(q, k, v, inference_state, decay)
    assert torch.equal(inference_state, before)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compiled_in_place_step_keeps_the_version_contract(backend):
    """Under torch.compile(fullgraph=True) the step gives the eager results, bumps the state's version (a saved
    state then fails its backward) and refuses an inference state outside inference mode."""
    q, k, v, decay, state = step_inputs(3)
    want_out, want_state = ops.rfa_step(q, k, v, state.clone(), decay)
    torch._dynamo.reset()
    step = torch.compile(lambda *a: ops.rfa_step_(*a) * 2, fullgraph=True, backend=backend)
    scale = torch.tensor(2.0, requires_grad=True)
    saved = (scale * state).sum()
    torch.testing.assert_close(step(q, k, v, state, decay), 2 * want_out)
    torch.testing.assert_close(state, want_state)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        saved.backward()
    with torch.inference_mode():
        inference_state = want_state.clone()
        step(q, k, v, inference_state, decay)
    with pytest.raises(RuntimeError, match="Inplace update to inference tensor outside InferenceMode"):
        step(q, k, v, inference_state, decay)


@pytest.mark.parametrize("grad_enabled", [True, False], ids=["grad-enabled", "no-grad"])
@pytest.mark.parametrize("transform", ["vmap", "grad", "jvp"])
def test_in_place_step_refuses_torch_func_transforms_by_name(transform, grad_enabled):
    """Inside a torch.func transform rfa_step_ refuses to run whether or not a gradient is asked for, and says so
    (not that a gradient was asked for); outside one, inputs that require grad get the autograd message."""
    q, k, v, decay, state = step_inputs(15)
    step = lambda q: ops.rfa_step_(q, k, v, state.clone(), decay).sum()  # noqa: E731
    batched = lambda q: ops.rfa_step_(q[None], k[:1], v[:1], state[:1].clone(), decay[:1])  # noqa: E731
    calls = {
        "vmap": lambda: torch.func.vmap(batched)(q),
        "grad": lambda: torch.func.grad(step)(q),
        "jvp": lambda: torch.func.jvp(step, (q,), (torch.ones_like(q),)),
    }
    match = (r"rfa_step_ overwrites its state and does not run inside torch.func transforms \(vmap, grad, jvp\); "
             "use rfa_step")
    with torch.set_grad_enabled(grad_enabled), pytest.raises(ValueError, match=match):
        calls[transform]()
    with pytest.raises(ValueError, match="rfa_step_ has no autograd .* use rfa_step when gradients are needed"):
        ops.rfa_step_(q, k, v.requires_grad_(), state, decay)


# ---------------------------------------------------------------------------------------------------------------
# autocast: the PyTorch forms keep their products in fp32


def rfa_inputs(seed, B=2, T=11, S=7, H=2, d=3, D=4):
    """Raw vectors x (B, T, H, d), projections (H, D, d), temperatures (H,), features q, k (B, T, H, 2D), values
    (B, T, H, d), a gate (B, T, H), source features and values (B, S, H, .), a source mask (B, S), fp32."""
    g = torch.Generator().manual_seed(seed)
    x, proj = torch.randn(B, T, H, d, generator=g), torch.randn(H, D, d, generator=g)
    tau = torch.rand(H, generator=g) + 0.5
    phi = lambda n: ops.rfa_feature_map_ref(torch.randn(B, n, H, d, generator=g), proj)  # noqa: E731
    mask = torch.ones(B, S)
    mask[0, -2:] = 0
    return dict(x=x, proj=proj, tau=tau, q=phi(T), k=phi(T), v=torch.randn(B, T, H, d, generator=g),
                decay=torch.rand(B, T, H, generator=g) * 0.5 + 0.5, sk=phi(S), sv=torch.randn(B, S, H, d, generator=g),
                mask=mask, scale=torch.rand(B, S, H, 1, generator=g) + 0.5)


RFA_PATHS = {  # name: (function of the inputs, names of the inputs it takes)
    "feature_map": (lambda x, p, t: ops.rfa_feature_map(x, p, t), ("x", "proj", "tau")),
    "feature_map_ref": (lambda x, p, t: ops.rfa_feature_map_ref(x, p, t), ("x", "proj", "tau")),
    "causal": (lambda *a: ops.rfa_causal(*a, chunk_size=4), ("q", "k", "v", "decay")),
    "causal_chunked": (lambda *a: rfa_causal_chunked(*a, chunk_size=4), ("q", "k", "v", "decay")),
    "causal_ref": (lambda *a: ops.rfa_causal_ref(*a), ("q", "k", "v", "decay")),
    "step": (lambda q, k, v, s: ops.rfa_step(q[:, :1], k[:, :1], v[:, :1], s), ("q", "k", "v", "state")),
    "cross_state": (lambda k, v, m: ops.rfa_cross_state(k, v, m), ("sk", "sv", "mask")),
    "cross_via_state": (lambda q, k, v, m: ops.rfa_cross(q, ops.rfa_cross_state(k, v, m)), ("q", "sk", "sv", "mask")),
    "cross_via_keys": (lambda q, k, v, s: ops.rfa_cross(q, ops.rfa_cross_source(k[:, :2], v[:, :2], None, s[:, :2])),
                       ("q", "sk", "sv", "scale")),
    "cross_step_via_keys": (lambda q, k, v: ops.rfa_cross(q[:, :1], ops.rfa_cross_source(k[:, :2], v[:, :2])),
                            ("q", "sk", "sv")),
    "cross_ref": (lambda q, k, v, m: ops.rfa_cross_ref(q, k, v, m), ("q", "sk", "sv", "mask")),
}


def outputs_and_grads(fn, inputs, grad, autocast):
    """fn's outputs (a tuple), run under CPU bf16 autocast or not, and, with grad, the gradients of a fixed weighting
    of them w.r.t. the float inputs (the backward outside autocast, as PyTorch recommends)."""
    inputs = [t.detach().clone().requires_grad_(grad and t.is_floating_point() and name != "mask")
              for name, t in inputs]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = fn(*inputs)
    out = out if isinstance(out, tuple) else (out,)
    if not grad:
        return out, []
    g = torch.Generator().manual_seed(5)
    sum(((o.float() * torch.randn(o.shape, generator=g)).sum() for o in out)).backward()
    return out, [t.grad for t in inputs if t.requires_grad]


def assert_autocast_changes_nothing(fn, inputs, grad):
    """fn under CPU bf16 autocast gives what it gives without autocast: the same dtypes, values and gradients."""
    want, want_grads = outputs_and_grads(fn, inputs, grad, autocast=False)
    got, got_grads = outputs_and_grads(fn, inputs, grad, autocast=True)
    assert [o.dtype for o in got] == [o.dtype for o in want]
    for a, b in zip(got + tuple(got_grads), want + tuple(want_grads)):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("grad", [True, False], ids=["grad", "no-grad"])
@pytest.mark.parametrize("path", list(RFA_PATHS))
def test_rfa_products_stay_fp32_under_autocast(path, grad):
    fn, names = RFA_PATHS[path]
    data = rfa_inputs(6)
    data["state"] = ops.rfa_causal_ref(data["q"], data["k"], data["v"])[1]
    assert_autocast_changes_nothing(fn, [(n, data[n]) for n in names], grad)


def conv_inputs(seed, B=2, T=9, H=3, K=4, R=2):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, T, H * R, generator=g), torch.randn(B, T, H, K, generator=g), torch.randn(H, K, generator=g),
            torch.randn(B, K - 1, H * R, generator=g))


CONV_PATHS = {  # name: function of (x, weight (B, T, H, K), kernel (H, K), state (B, K - 1, C)), each using some
    "dynamic_ref": lambda x, w, kern, s: ops.dynamic_conv_ref(x, w, 2),
    "dynamic_ref_softmax": lambda x, w, kern, s: ops.dynamic_conv_ref(x, w, 3, True),
    "dynamic_ref_dropconnect": lambda x, w, kern, s: ops.dynamic_conv_ref(x, w, 1, True, 0.3, torch.tensor(11)),
    "light_ref_softmax": lambda x, w, kern, s: ops.dynamic_conv_ref(x, kern, 3, True),
    "dynamic": lambda x, w, kern, s: ops.dynamic_conv(x, w, 3, True),
    "step": lambda x, w, kern, s: ops.dynamic_conv_step(x[:, :2], w[:, :2], s, True),
    "step_dropconnect": lambda x, w, kern, s: ops.dynamic_conv_step(x[:, :2], kern, s, True, 0.3, torch.tensor(3)),
}


@pytest.mark.parametrize("backend", ["default", "reference"])
@pytest.mark.parametrize("grad", [True, False], ids=["grad", "no-grad"])
@pytest.mark.parametrize("path", list(CONV_PATHS))
def test_conv_products_stay_fp32_under_autocast(path, grad, backend, monkeypatch):
    if backend == "reference":
        monkeypatch.setenv("TALK_HF_FORCE_REFERENCE", "1")
    inputs = [(n, t) for n, t in zip(("x", "weight", "kernel", "state"), conv_inputs(7))]
    assert_autocast_changes_nothing(CONV_PATHS[path], inputs, grad)


# ---------------------------------------------------------------------------------------------------------------
# DropConnect seeds


def test_draw_seed_takes_the_value_and_generator_state_of_random_():
    """draw_seed gives the value Tensor.random_ gives from the same generator state, and leaves the same state."""
    for seed in range(5):
        torch.manual_seed(seed)
        want, want_next = torch.empty((), dtype=torch.int64).random_(), torch.rand(3)
        torch.manual_seed(seed)
        got, got_next = ops.draw_seed(), torch.rand(3)
        assert got.shape == () and got.dtype == torch.int64 and got.item() >= 0
        assert got.item() == want.item() and torch.equal(got_next, want_next)
    g, h = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    assert ops.draw_seed(generator=g).item() == torch.empty((), dtype=torch.int64).random_(generator=h).item()


@pytest.mark.parametrize("backend", ["default", "reference"])
@pytest.mark.parametrize("form", ["light_conv", "dynamic_conv"])
def test_dropconnect_without_a_seed_compiles_in_one_graph(form, backend, monkeypatch):
    """torch.compile(fullgraph=True) of the op in training (gradients, weight_dropout > 0, seed None): the seed is
    drawn inside the graph, from the generator eager mode uses (aot_eager runs the traced ops), so a manual seed gives
    the eager output and gradients; the next call draws another mask."""
    if backend == "reference":
        monkeypatch.setenv("TALK_HF_FORCE_REFERENCE", "1")
    g = torch.Generator().manual_seed(8)
    x, kern = torch.randn(2, 9, 6, generator=g), torch.randn(3, 4, generator=g)
    if form == "light_conv":
        op = lambda x, k: ops.light_conv(x, k, 3, True, 0.3)  # noqa: E731
    else:
        op = lambda x, k: ops.dynamic_conv(x, k.expand(2, 9, 3, 4), 3, True, 0.3)  # noqa: E731

    def run(fn):
        a, k = x.clone().requires_grad_(), kern.clone().requires_grad_()
        torch.manual_seed(0)
        out = fn(a, k)
        (out * torch.arange(out.numel()).view(out.shape).sin()).sum().backward()
        return out.detach(), a.grad, k.grad, fn(a, k).detach()

    want = run(op)
    torch._dynamo.reset()
    got = run(torch.compile(op, fullgraph=True, backend="aot_eager"))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
    assert not torch.equal(got[0], got[3])  # another draw, another mask


# ---------------------------------------------------------------------------------------------------------------
# torch.func over the ops: the feature map's own derivatives, forward mode through every op


def test_torch_func_grad_of_the_feature_map_equals_autograd():
    g = torch.Generator().manual_seed(10)
    x, proj = torch.randn(2, 3, 2, 4, generator=g, dtype=torch.float64), torch.randn(2, 5, 4, generator=g).double()
    tau = torch.rand(2, generator=g, dtype=torch.float64) + 0.5
    weights = torch.randn(2, 3, 2, 10, generator=g, dtype=torch.float64)
    loss = lambda x, p, t: (ops.rfa_feature_map(x, p, t) * weights).sum()  # noqa: E731
    got = torch.func.grad(loss, argnums=(0, 1, 2))(x, proj, tau)
    inputs = [t.clone().requires_grad_() for t in (x, proj, tau)]
    want = torch.autograd.grad(loss(*inputs), inputs)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)


def test_torch_func_vmap_of_grad_and_jacrev_of_the_feature_map_equal_the_reference():
    g = torch.Generator().manual_seed(12)
    x, proj = torch.randn(3, 1, 2, 2, 4, generator=g, dtype=torch.float64), torch.randn(2, 5, 4, generator=g).double()
    features = lambda op: lambda x: op(x, proj).sin().sum()  # noqa: E731
    per_sample = torch.func.vmap(torch.func.grad(features(ops.rfa_feature_map)))(x)
    torch.testing.assert_close(per_sample, torch.func.vmap(torch.func.grad(features(ops.rfa_feature_map_ref)))(x))
    jacobian = torch.func.jacrev(lambda x: ops.rfa_feature_map(x, proj))(x[0])
    torch.testing.assert_close(jacobian, torch.func.jacrev(lambda x: ops.rfa_feature_map_ref(x, proj))(x[0]))


def forward_mode_cases():
    """(name, op, reference, differentiated input, other inputs) for every public op, fp64."""
    g = torch.Generator().manual_seed(13)
    r = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64)  # noqa: E731
    u = lambda *shape: torch.rand(*shape, generator=g, dtype=torch.float64)  # noqa: E731
    B, T, C, H = 2, 5, 4, 2
    left, right = u(B, T, H), u(B, T, H)
    weight, kernel = r(B, T, H, 3), r(H, 3)
    q, k, proj = u(B, T, H, 4), u(B, T, H, 4), r(H, 4, 3)
    state = ops.talk_conv_init_state(B, C, 3, dtype=torch.float64)
    return [
        ("talk_conv", lambda x: ops.talk_conv(x, left, right, 3, 2),
         lambda x: ops.talk_conv_ref(x, left, right, 3, 2), r(B, T, C)),
        ("talk_conv_step", lambda x: ops.talk_conv_step(x, left[:, :1], state, 3)[0],
         lambda x: ops.talk_conv_ref(x, left[:, :1], None, 3, 0), r(B, 1, C)),
        ("dynamic_conv", lambda x: ops.dynamic_conv(x, weight, 2, softmax=True),
         lambda x: ops.dynamic_conv_ref(x, weight, 2, softmax=True), r(B, T, C)),
        ("light_conv", lambda x: ops.light_conv(x, kernel, 2, softmax=True),
         lambda x: ops.dynamic_conv_ref(x, kernel, 2, softmax=True), r(B, T, C)),
        ("rfa_feature_map", lambda x: ops.rfa_feature_map(x, proj), lambda x: ops.rfa_feature_map_ref(x, proj),
         r(B, T, H, 3)),
        ("rfa_causal", lambda v: ops.rfa_causal(q, k, v)[0], lambda v: ops.rfa_causal_ref(q, k, v)[0], r(B, T, H, 3)),
    ]


@pytest.mark.parametrize("case", forward_mode_cases(), ids=lambda case: case[0])
def test_forward_mode_tangents_of_every_op_equal_the_reference(case):
    """torch.func.jvp and forward_ad dual tensors: the kernels' custom ops have reverse-mode derivatives only, so
    the ops run their PyTorch forms there instead of returning zero tangents."""
    import torch.autograd.forward_ad as fwAD

    _, op, reference, x = case
    tangent = torch.randn_like(x)
    want = torch.func.jvp(reference, (x,), (tangent,))[1]
    assert want.abs().max() > 0.1
    torch.testing.assert_close(torch.func.jvp(op, (x,), (tangent,))[1], want, rtol=1e-10, atol=1e-12)
    with fwAD.dual_level():
        got = fwAD.unpack_dual(op(fwAD.make_dual(x, tangent))).tangent
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_forward_mode_tangents_under_torch_compile_equal_the_reference():
    """The traced tensors show no tangents: an open dual level sends the ops to their PyTorch forms there too
    (dynamo with the eager backend; inductor drops forward-mode tangents of the PyTorch forms alike)."""
    import torch.autograd.forward_ad as fwAD

    _, op, reference, x = forward_mode_cases()[0]  # talk_conv
    tangent = torch.randn_like(x)
    want = torch.func.jvp(reference, (x,), (tangent,))[1]
    torch._dynamo.reset()
    compiled = torch.compile(op, backend="eager")
    with fwAD.dual_level():
        got = fwAD.unpack_dual(compiled(fwAD.make_dual(x, tangent))).tangent
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_rfa_causal_compiled_refuses_forward_mode():
    q, k, v, _, _ = step_inputs(14, T=3)
    with pytest.raises(RuntimeError, match="reverse-mode derivatives only"):
        torch.func.jvp(lambda v: ops.rfa_causal_compiled(q, k, v)[0], (v,), (torch.ones_like(v),))


# ---------------------------------------------------------------------------------------------------------------
# Inference-only kernels: their ops refuse a backward instead of giving no gradient


def inference_only_calls():
    """{op name: (the public function that picks the differentiable form, the op's arguments)} for the kernels with
    no backward, the first argument requiring grad."""
    g = torch.Generator().manual_seed(16)
    r = lambda *shape: torch.randn(*shape, generator=g)  # noqa: E731
    x = lambda *shape: r(*shape).requires_grad_()  # noqa: E731
    return {
        "rfa_feature_map": ("rfa_feature_map", (x(2, 3, 2, 4), r(2, 5, 4), torch.rand(2, generator=g) + 0.5)),
        "talk_conv_step": ("talk_conv_step", (x(2, 1, 4), torch.rand(2, 1, 2, generator=g), r(2, 5, 4), 3)),
        "dynamic_conv_step": ("dynamic_conv_step", (x(2, 2, 4), r(2, 2, 2, 3), r(2, 2, 4), True)),
    }


@pytest.mark.parametrize("name", list(inference_only_calls()))
def test_a_backward_through_an_inference_only_kernel_raises(name):
    """Called directly on inputs that require grad (as a graph exported under torch.no_grad calls them), the ops
    run forward and refuse the backward, naming the public function to call instead."""
    public, args = inference_only_calls()[name]
    out = getattr(torch.ops.talk_hf, name)(*args)
    first = out[0] if isinstance(out, tuple) else out
    assert first.requires_grad
    match = (rf"talk_hf::{name} is an inference-only kernel without a backward: call talk_hf.ops.{public} "
             r"\(which picks the differentiable form when gradients are needed\)")
    with pytest.raises(RuntimeError, match=match):
        torch.autograd.grad(first.sum(), args[0])


@pytest.mark.parametrize("name", list(inference_only_calls()))
def test_opcheck_of_an_inference_only_kernel_on_inputs_that_require_grad(name):
    """Schema, autograd registration and fake kernel hold on inputs that require grad too (opcheck's
    test_aot_dispatch_dynamic runs a backward, which these ops refuse)."""
    _, args = inference_only_calls()[name]
    torch.library.opcheck(getattr(torch.ops.talk_hf, name).default, args,
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))


def test_a_model_exported_under_no_grad_refuses_a_backward_through_the_feature_map_kernel():
    """torch.export under torch.no_grad records the inference kernel; training the exported module raises instead
    of leaving its parameters without gradients."""

    class Features(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)
            self.register_buffer("projection", torch.randn(2, 5, 4))

        def forward(self, x):
            return ops.rfa_feature_map(self.linear(x), self.projection).sum()

    x = torch.randn(2, 3, 2, 4)
    with torch.no_grad():
        exported = torch.export.export(Features(), (x,)).module()
    loss = exported(x)
    with pytest.raises(RuntimeError, match="rfa_feature_map is an inference-only kernel"):
        torch.autograd.grad(loss, list(exported.parameters()))


# ---------------------------------------------------------------------------------------------------------------
# Argument checks


@pytest.mark.parametrize("chunk_size", [2**31 + 1, 2**62, 2**63 - 1])
def test_a_chunk_size_near_the_int64_limit_gives_the_results_of_one_chunk(chunk_size):
    """Any chunk at least as long as the sequence saves one state: the kernels' results and gradients of
    chunk_size = T."""
    q, k, v, decay, state = step_inputs(11, T=5)
    inputs = [t.requires_grad_() for t in (q, k, v, decay, state)]

    def results(chunk):
        out, final = ops.rfa_causal_compiled(*inputs, chunk_size=chunk)
        grads = torch.autograd.grad((out.sum() + final.square().sum()), inputs)
        return (out, final, *grads)

    for a, b in zip(results(chunk_size), results(5)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("S", [10, 2], ids=["state-form", "keys-form"])
@pytest.mark.parametrize("shape", [(10, 2, 1), (1, 10, 2, 1), (3, 10, 1, 1), (3, 10, 2)])
def test_key_scale_of_another_shape_than_the_keys_is_refused(S, shape):
    """key_scale is (B, S, H, 1): one missing or broadcast dimension would silently scale other keys."""
    B, H, F, d = 3, 2, 4, 3
    k, v = torch.rand(B, S, H, F), torch.randn(B, S, H, d)
    shape = tuple(S if n == 10 else n for n in shape)
    expected = f"key_scale must be \\(B, S, H, 1\\) = \\(3, {S}, 2, 1\\) for k of shape \\(3, {S}, 2, 4\\), got "
    with pytest.raises(ValueError, match=expected + "\\(" + ", ".join(map(str, shape))):
        ops.rfa_cross_source(k, v, None, key_scale=torch.rand(shape))
    with pytest.raises(TypeError, match="key_scale must be a floating-point tensor"):
        ops.rfa_cross_source(k, v, None, key_scale=torch.ones(B, S, H, 1, dtype=torch.long))
    ops.rfa_cross_source(k, v, None, key_scale=torch.rand(B, S, H, 1))
