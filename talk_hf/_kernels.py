"""Python side of the compiled extension `talk_hf._C`: fake (meta) kernels and autograd for its operators.

The C++ library defines the schemas and the CPU/CUDA kernels (csrc/talk_hf.cpp). This module is imported once,
by talk_hf/backend.py, and only ever through the installed package (never as Hub remote code), so the
registrations below happen exactly once per process.
"""

import importlib
from pathlib import Path

import torch


def _load_extension():
    """-> (the module talk_hf._C or None, why it is None). Loading the library registers torch.ops.talk_hf.*. By
    its full name: ``from talk_hf import _C`` while talk_hf is initialising reports a missing file as a circular
    import."""
    try:
        return importlib.import_module("talk_hf._C"), None
    except ModuleNotFoundError as err:
        if err.name != "talk_hf._C":
            raise
        return None, _not_built()
    except ImportError as err:  # built, but does not load (e.g. against another torch than the one installed)
        return None, f"the extension talk_hf._C does not load ({err}); rebuild it against the installed torch"


def _not_built():
    """Why talk_hf._C is missing: talk_hf imported from a source tree whose extension is not built (a checkout on
    sys.path, e.g. as the working directory, shadows an installed package), or installed without it."""
    package = Path(__file__).resolve().parent
    if (package.parent / "setup.py").is_file() and (package.parent / "csrc").is_dir():
        return (f"the extension talk_hf._C is not built in the source tree talk_hf is imported from ({package}): "
                "build it there (`pip install --no-build-isolation -e .`, or `python setup.py build_ext --inplace`), "
                "or run outside the checkout to import an installed talk_hf")
    return ("the extension talk_hf._C is not built (the package was installed with TALK_HF_SKIP_BUILD=1): reinstall "
            "it without that variable, with `pip install --no-build-isolation`, to build it")


_C, _LOAD_ERROR = _load_extension()


def load_error():
    return _LOAD_ERROR


def _find_devices():
    if _C is None:
        return ()
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    return tuple(d for d, key in (("cpu", "CPU"), ("cuda", "CUDA")) if has("talk_hf::talk_conv_fwd", key))


_DEVICES = _find_devices()


def devices():
    """Device types that have compiled kernels: ("cpu",) or ("cpu", "cuda"); () without the extension."""
    return _DEVICES


def _dense(t):
    """A new uninitialised contiguous tensor of t's shape, dtype and device. The kernels return such tensors (they
    work on contiguous copies of their inputs), so the fake kernels must too, whatever the inputs' strides: compiled
    graphs lay out what follows an op by its fake kernel's strides."""
    return t.new_empty(t.shape)


def _register_fakes():
    @torch.library.register_fake("talk_hf::talk_conv_fwd")
    def _(x, offset_left, offset_right, max_left, max_right):
        return _dense(x)

    @torch.library.register_fake("talk_hf::talk_conv_bwd")
    def _(grad_out, x, offset_left, offset_right, max_left, max_right):
        grad_right = _dense(offset_left) if offset_right is not None else offset_left.new_empty(0)
        return _dense(x), _dense(offset_left), grad_right

    @torch.library.register_fake("talk_hf::talk_conv_step")
    def _(x, offset_left, state, max_left):
        return _dense(x), _dense(state)

    @torch.library.register_fake("talk_hf::dynamic_conv_fwd")
    def _(x, weight, padding_left, softmax=False, seed=None, weight_dropout=0.0):
        return _dense(x)

    @torch.library.register_fake("talk_hf::dynamic_conv_step")
    def _(x, weight, state, softmax=False):
        return _dense(x), _dense(state)

    @torch.library.register_fake("talk_hf::dynamic_conv_bwd")
    def _(grad_out, x, weight, padding_left, softmax=False, seed=None, weight_dropout=0.0):
        return _dense(x), _dense(weight)  # the weight gradient is per position, also for an expanded weight

    @torch.library.register_fake("talk_hf::rfa_causal_fwd")
    def _(q, k, v, decay, initial_state, eps, chunk, tf32=False):
        B, T, H, F = q.shape
        state = v.new_empty(B, H, F, v.shape[-1] + 1)
        num_chunks = -(-T // chunk) if chunk > 0 else 0  # chunk 0: no states saved (no backward)
        return _dense(v), state, v.new_empty(B, H, num_chunks, F, v.shape[-1] + 1)

    @torch.library.register_fake("talk_hf::rfa_causal_step_")
    def _(q, k, v, decay, state, eps):
        return _dense(v)

    @torch.library.register_fake("talk_hf::rfa_feature_map")
    def _(x, projection, tau):
        return x.new_empty(*x.shape[:3], 2 * projection.shape[1])

    @torch.library.register_fake("talk_hf::rfa_causal_bwd")
    def _(grad_out, grad_state, q, k, v, decay, initial_state, checkpoints, eps, chunk, tf32=False):
        grad_decay = _dense(decay) if decay is not None else q.new_empty(0)
        grad_state = _dense(initial_state) if initial_state is not None else q.new_empty(0)
        return _dense(q), _dense(k), _dense(v), grad_decay, grad_state


# The backward ops, the public ops whose gradients they compute, and the PyTorch forms that have second derivatives.
_BACKWARDS = {
    "talk_conv_bwd": ("talk_conv", "talk_hf.ops.talk_conv_ref"),
    "dynamic_conv_bwd": ("dynamic_conv / light_conv", "talk_hf.ops.dynamic_conv_ref"),
    "rfa_causal_bwd": ("rfa_causal", "talk_hf.ops.rfa_causal_chunked or talk_hf.ops.rfa_causal_ref"),
}


# The inference-only ops (kernels without a backward) and the public functions that run a differentiable form
# in their place when gradients are needed.
_INFERENCE_ONLY = {
    "rfa_feature_map": "talk_hf.ops.rfa_feature_map",
    "talk_conv_step": "talk_hf.ops.talk_conv_step",
    "dynamic_conv_step": "talk_hf.ops.dynamic_conv_step",
}


def _refuse_derivative(name, message):
    """Give the op `name` a derivative that raises `message`: an op without one would pass no gradient through it,
    silently (a backward op's to a second-order gradient, create_graph=True; an inference-only op's to the inputs of
    a graph exported or traced under torch.no_grad, which calls it directly)."""

    def backward(ctx, *grads):
        raise RuntimeError(message)

    torch.library.register_autograd(f"talk_hf::{name}", backward)


def _register():
    ops = torch.ops.talk_hf
    _register_fakes()
    for name, (public, reference) in _BACKWARDS.items():
        _refuse_derivative(name, f"talk_hf::{name}: the compiled kernels of {public} have no second-order gradients "
                                 f"(double backward through their backward); use {reference}, or set "
                                 "TALK_HF_FORCE_REFERENCE=1, for higher-order gradients")
    for name, public in _INFERENCE_ONLY.items():
        _refuse_derivative(name, f"talk_hf::{name} is an inference-only kernel without a backward: call {public} "
                                 "(which picks the differentiable form when gradients are needed), or export/trace "
                                 "the model with gradients enabled")

    def talk_setup(ctx, inputs, output):
        x, offset_left, offset_right, ctx.max_left, ctx.max_right = inputs
        ctx.has_right = offset_right is not None
        ctx.save_for_backward(x, offset_left, offset_right)

    def talk_backward(ctx, grad):
        x, offset_left, offset_right = ctx.saved_tensors
        gx, gl, gr = ops.talk_conv_bwd(grad, x, offset_left, offset_right, ctx.max_left, ctx.max_right)
        return gx, gl, (gr if ctx.has_right else None), None, None

    def conv_setup(ctx, inputs, output):
        x, weight, ctx.padding_left, ctx.softmax, seed, ctx.weight_dropout = inputs
        ctx.save_for_backward(x, weight, seed)

    def conv_backward(ctx, grad):
        x, weight, seed = ctx.saved_tensors
        gx, gw = ops.dynamic_conv_bwd(grad, x, weight, ctx.padding_left, ctx.softmax, seed, ctx.weight_dropout)
        return gx, gw, None, None, None, None

    def rfa_setup(ctx, inputs, output):
        q, k, v, decay, initial_state, ctx.eps, ctx.chunk, ctx.tf32 = inputs
        ctx.has_decay, ctx.has_state = decay is not None, initial_state is not None
        ctx.mark_non_differentiable(output[2])
        ctx.save_for_backward(q, k, v, decay, initial_state, output[2])

    def rfa_backward(ctx, grad_out, grad_state, _):
        q, k, v, decay, initial_state, checkpoints = ctx.saved_tensors
        gq, gk, gv, gdecay, gstate = ops.rfa_causal_bwd(grad_out, grad_state, q, k, v, decay, initial_state,
                                                        checkpoints, ctx.eps, ctx.chunk, ctx.tf32)
        return gq, gk, gv, (gdecay if ctx.has_decay else None), (gstate if ctx.has_state else None), None, None, None

    torch.library.register_autograd("talk_hf::rfa_causal_fwd", rfa_backward, setup_context=rfa_setup)
    torch.library.register_autograd("talk_hf::talk_conv_fwd", talk_backward, setup_context=talk_setup)
    torch.library.register_autograd("talk_hf::dynamic_conv_fwd", conv_backward, setup_context=conv_setup)


if _C is not None:
    _register()


def talk_conv(x, offset_left, offset_right, max_left, max_right):
    """Compiled TaLK convolution; arguments as `talk_hf.talk_conv.talk_conv` (already validated)."""
    return torch.ops.talk_hf.talk_conv_fwd(x, offset_left, offset_right, max_left, max_right)


def talk_conv_step(x, offset_left, state, max_left):
    """Compiled causal TaLK decoding step(s) (inference only: its backward raises); state already
    (B, max_left + 2, C) in the accumulation dtype. -> (out, new state)."""
    return torch.ops.talk_hf.talk_conv_step(x, offset_left, state, max_left)


def rfa_causal_step_(q, k, v, decay, state, eps):
    """Compiled decoding step(s) advancing `state` in place; every tensor already in the state dtype. -> out."""
    return torch.ops.talk_hf.rfa_causal_step_(q, k, v, decay, state, float(eps))


def rfa_causal(q, k, v, decay, initial_state, eps, chunk, tf32=False):
    """Compiled causal RFA; every tensor already in the state dtype (fp32 or fp64); chunk: steps between the states
    saved for the backward, 0 when no gradient will be asked for; tf32: the CUDA kernels may multiply on tensor cores
    with TF32 operands (forward and backward). -> (out, final state)."""
    out, state, _ = torch.ops.talk_hf.rfa_causal_fwd(q, k, v, decay, initial_state, float(eps), chunk, tf32)
    return out, state


def rfa_feature_map(x, projection, tau):
    """Compiled random feature map (inference only: its backward raises); x, projection and tau (or None) already
    in the accumulation dtype (fp32 or fp64). -> (B, T, H, 2D) features."""
    return torch.ops.talk_hf.rfa_feature_map(x, projection, tau)


def dynamic_conv_step(x, weight, state, softmax):
    """Compiled causal dynamic-convolution decoding step(s) (inference only: its backward raises); weight
    (B, T, H, K) (logits when softmax), state (B, K - 1, C) in x's dtype. -> (out, new state)."""
    return torch.ops.talk_hf.dynamic_conv_step(x, weight, state, softmax)


def dynamic_conv(x, weight, padding_left, softmax, seed=None, weight_dropout=0.0):
    """Compiled dynamic convolution; weight (B, T, H, K) (LightConv kernels arrive expanded; logits when softmax);
    DropConnect with probability weight_dropout and the mask of `seed` (unused, and may be None, when it is 0). A
    weight with strides 0 over B and T is read as its one (H, K) kernel, with one mask for every position."""
    return torch.ops.talk_hf.dynamic_conv_fwd(x, weight, padding_left, softmax, seed, float(weight_dropout))
