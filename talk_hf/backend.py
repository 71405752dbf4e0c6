"""The one place that chooses, per call, between the compiled kernels and the pure-PyTorch references.

This file is copied next to the modeling files when a model is saved with its code (Hub remote code), so it
imports the compiled extension only optionally: without the `talk_hf` package the references run.
"""

import os
import warnings

import torch
from torch.autograd import forward_ad

try:  # compiled fast path; an ImportError here is normal for Hub remote code without the package
    from talk_hf import _kernels
except ImportError:
    _kernels = None

FORCE_REFERENCE_ENV = "TALK_HF_FORCE_REFERENCE"
_ON = ("1", "true", "yes", "on")
_OFF = ("", "0", "false", "no", "off")
_warned = set()


def _forced_reference():
    """TALK_HF_FORCE_REFERENCE read as a boolean: 1/true/yes/on force the references, 0/false/no/off, empty or unset
    do not (case-insensitive, surrounding spaces ignored); any other value raises ValueError."""
    raw = os.environ.get(FORCE_REFERENCE_ENV, "")
    value = raw.strip().lower()
    if value in _ON:
        return True
    if value in _OFF:
        return False
    raise ValueError(
        f"{FORCE_REFERENCE_ENV}={raw!r} is not a boolean: set it to one of {'/'.join(_ON)} to force the pure-PyTorch "
        f"references, or to one of {'/'.join(_OFF[1:])} (or leave it empty or unset) for the compiled kernels"
    )


def compiled_devices():
    """Device types ("cpu", "cuda") the compiled extension was built for; empty if it is not built."""
    return _kernels.devices() if _kernels is not None else ()


def backend(device="cpu"):
    """Which implementation the ops use for tensors on `device`: "compiled" or "reference"."""
    if _forced_reference():
        return "reference"
    return "compiled" if torch.device(device).type in compiled_devices() else "reference"


def backend_reason(device="cpu"):
    """Why the compiled kernels do not run on `device`'s tensors, as one phrase (for warnings and errors)."""
    if _forced_reference():
        return f"{FORCE_REFERENCE_ENV} is set, forcing the pure-PyTorch references"
    reason = _kernels.load_error() if _kernels is not None else "the talk_hf package is not installed"
    return reason or f"talk_hf._C was built without {torch.device(device).type} kernels"


def use_kernels(x):
    """True when the compiled kernels should run on tensors like `x` (its device has them).

    Otherwise the reference runs, with one warning per device type unless TALK_HF_FORCE_REFERENCE=1 asked for it.
    """
    if backend(x.device) == "compiled":
        return True
    if not _forced_reference() and x.device.type not in _warned:
        _warned.add(x.device.type)
        warnings.warn(
            f"talk_hf: no compiled kernels for {x.device.type} tensors ({backend_reason(x.device)}); "
            "using the pure-PyTorch reference ops (same results, slower).",
            RuntimeWarning,
            stacklevel=3,
        )
    return False


def forward_mode(*tensors):
    """True inside a torch.func transform (jvp, jacfwd, hessian, vmap, grad) or for dual tensors of
    `torch.autograd.forward_ad` (None entries ignored). The compiled kernels' custom ops have reverse-mode
    derivatives only, and forward mode through them would give zero tangents without an error: the public ops run
    their PyTorch forms then."""
    if torch._C._are_functorch_transforms_active():
        return True
    if forward_ad._current_level < 0:
        return False
    if torch.compiler.is_compiling():  # the traced tensors show no tangents: an open dual level is enough
        return True
    return any(t is not None and forward_ad.unpack_dual(t).tangent is not None for t in tensors)


def needs_grad(*tensors):
    """True when autograd will record an op on these tensors (None entries ignored), in reverse or forward mode
    (`forward_mode`): the compiled inference-only paths (decoding steps, RFA without saved states) must not run
    then."""
    if forward_mode(*tensors):
        return True
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)
