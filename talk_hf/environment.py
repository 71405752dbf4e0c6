"""What this process runs on, described once: the device line every results and benchmark file records
(`device_description`) and the report for bug reports (`env_report`, printed by `python -m talk_hf env`)."""

import os
import platform
import sys

import torch


def device_description(device=None):
    """The GPU's name, or the CPU and the thread count torch uses. device: "cpu", "cuda" or a torch.device; None: the
    GPU when there is one."""
    device = torch.device(device if device is not None else "cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{platform.processor() or platform.machine()} CPU, {torch.get_num_threads()} threads"


def env_report():
    """What this installation is and runs, one `name: value` line each: talk_hf, Python, platform, torch (and its
    CUDA), transformers (and the supported range), and per device type whether the compiled kernels or the PyTorch
    references run (with the reason the extension did not load, if it did not)."""
    import transformers

    import talk_hf
    from talk_hf import _kernels, versions
    from talk_hf.backend import FORCE_REFERENCE_ENV, _forced_reference, backend

    lines = [
        ("talk_hf", f"{talk_hf.__version__} ({talk_hf.__path__[0]})"),
        ("python", sys.version.split()[0]),
        ("platform", platform.platform()),
        ("torch", f"{torch.__version__} (CUDA {torch.version.cuda or 'none'}; "
                  f"GPU: {device_description('cuda') if torch.cuda.is_available() else 'none'})"),
        ("transformers", f"{transformers.__version__} (supported: >={versions.OLDEST},<{versions.FIRST_UNTESTED}; "
                         f"decoding state passed as `{versions.CACHE_NAME}`)"),
        ("kernels on cpu", backend("cpu")),
        ("kernels on cuda", backend("cuda")),
    ]
    if _forced_reference():
        lines.append(("references forced", f"{FORCE_REFERENCE_ENV}={os.environ[FORCE_REFERENCE_ENV]}"))
    if _kernels.load_error():
        lines.append(("extension not loaded", _kernels.load_error()))
    return "\n".join(f"{name}: {value}" for name, value in lines)
