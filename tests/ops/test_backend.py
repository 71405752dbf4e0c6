"""The per-call choice between compiled kernels and references: reporting, forced reference, and the fallback
when the extension is missing (one warning, same results, never zeros)."""

import os
import re
import subprocess
import sys
import textwrap

import pytest
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


@pytest.mark.parametrize("value", ["1", "true", "True", "YES", "on", " On "])
def test_force_reference_accepts_the_usual_words_for_on(value, monkeypatch):
    monkeypatch.setenv("TALK_HF_FORCE_REFERENCE", value)
    assert ops.backend("cpu") == "reference"


@pytest.mark.parametrize("value", [None, "", "0", "false", "FALSE", "no", "No", "off", "OFF "])
def test_force_reference_accepts_the_usual_words_for_off(value, monkeypatch):
    if value is None:
        monkeypatch.delenv("TALK_HF_FORCE_REFERENCE", raising=False)
    else:
        monkeypatch.setenv("TALK_HF_FORCE_REFERENCE", value)
    assert ops.backend("cpu") == ("compiled" if "cpu" in ops.compiled_devices() else "reference")


@pytest.mark.parametrize("value", ["2", "enable", "n", "1.0"])
def test_force_reference_refuses_other_values(value, monkeypatch):
    monkeypatch.setenv("TALK_HF_FORCE_REFERENCE", value)
    named = re.escape(f"TALK_HF_FORCE_REFERENCE={value!r}")
    with pytest.raises(ValueError, match=rf"{named}.*1/true/yes/on.*0/false/no/off"):
        ops.backend("cpu")
    with pytest.raises(ValueError, match="TALK_HF_FORCE_REFERENCE"):
        ops.talk_conv(torch.randn(1, 3, 2), torch.rand(1, 3, 1), None, 1, 0)
