"""The per-call choice between compiled kernels and references: reporting, forced reference, and the fallback
when the extension is missing (one warning, same results, never zeros)."""

import os
import subprocess
import sys
import textwrap

import torch

from talk_hf import ops


def run_python(code, **env):
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env={**os.environ, **env}
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_compiled_ops_run_the_extension():
    x, o = torch.randn(1, 6, 4), torch.rand(1, 6, 2)
    with torch.profiler.profile() as prof:
        ops.talk_conv(x, o, o, 2, 2)
        ops.dynamic_conv(x, torch.rand(1, 6, 2, 3), 1)
    names = {e.name for e in prof.events()}
    assert {"talk_hf::talk_conv_fwd", "talk_hf::dynamic_conv_fwd"} <= names


def test_missing_extension_falls_back_with_one_warning():
    out = run_python(
        """
        import sys, warnings
        sys.modules["talk_hf._C"] = None  # as if the package was installed with TALK_HF_SKIP_BUILD=1
        import torch
        from talk_hf import ops
        assert ops.backend("cpu") == "reference" and ops.compiled_devices() == ()
        x, o, w = torch.randn(2, 7, 4), torch.rand(2, 7, 2), torch.rand(2, 7, 2, 3)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            a = ops.talk_conv(x, o, o, 3, 3)
            b = ops.dynamic_conv(x, w, 1)
            ops.talk_conv(x, o, None, 3, 0)
        messages = [str(m.message) for m in caught if "pure-PyTorch reference" in str(m.message)]
        assert len(messages) == 1 and "not built" in messages[0], messages
        assert torch.equal(a, ops.talk_conv_ref(x, o, o, 3, 3)) and a.abs().sum() > 0
        assert torch.equal(b, ops.dynamic_conv_ref(x, w, 1)) and b.abs().sum() > 0
        print("ok")
        """
    )
    assert out.strip() == "ok"


def test_forced_reference_is_silent_and_exact():
    out = run_python(
        """
        import warnings
        import torch
        from talk_hf import ops
        assert ops.backend("cpu") == "reference"
        x, o = torch.randn(2, 7, 4), torch.rand(2, 7, 2)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with torch.profiler.profile() as prof:
                out = ops.talk_conv(x, o, o, 3, 3)
        assert not any(e.name.startswith("talk_hf::") for e in prof.events())
        assert torch.equal(out, ops.talk_conv_ref(x, o, o, 3, 3))
        print("ok")
        """,
        TALK_HF_FORCE_REFERENCE="1",
    )
    assert out.strip() == "ok"
