"""The one place that chooses, per call, between the compiled kernels and the pure-PyTorch references.

This file is copied next to the modeling files when a model is saved with its code (Hub remote code), so it
imports the compiled extension only optionally: without the `talk_hf` package the references run.
"""

import os
import warnings

import torch

try:  # compiled fast path; an ImportError here is normal for Hub remote code without the package
    from talk_hf import _kernels
except ImportError:
    _kernels = None

FORCE_REFERENCE_ENV = "TALK_HF_FORCE_REFERENCE"
_KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_warned = set()


def _warn_once(key, message):
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def compiled_devices():
    """Device types ("cpu", "cuda") the compiled extension was built for; empty if it is not built."""
    return _kernels.devices() if _kernels is not None else ()


def backend(device="cpu"):
    """Which implementation the ops use for tensors on `device`: "compiled" or "reference"."""
    if os.environ.get(FORCE_REFERENCE_ENV, "0") not in ("", "0"):
        return "reference"
    return "compiled" if torch.device(device).type in compiled_devices() else "reference"


def use_kernels(*tensors):
    """True when the compiled kernels should run on these tensors (same device, supported dtype).

    Falls back to the reference with one warning per device type when the extension is missing.
    """
    x = tensors[0]
    if x.dtype not in _KERNEL_DTYPES or backend(x.device) == "reference":
        if backend(x.device) == "reference" and not os.environ.get(FORCE_REFERENCE_ENV):
            reason = _kernels.load_error() if _kernels is not None else "the talk_hf package is not installed"
            _warn_once(
                x.device.type,
                f"talk_hf: no compiled kernels for {x.device.type} tensors ({reason}); "
                "using the pure-PyTorch reference ops (same results, slower).",
            )
        return False
    return True
