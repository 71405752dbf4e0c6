"""`python -m talk_hf`: the version and the environment report."""

import subprocess
import sys

import torch
import transformers

import talk_hf
from talk_hf.__main__ import main
from talk_hf.environment import env_report


def test_version_from_the_command_line():
    result = subprocess.run([sys.executable, "-m", "talk_hf", "--version"], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == talk_hf.__version__


def test_env_report_names_versions_and_the_kernels_each_device_runs(monkeypatch, capsys):
    main(["env"])
    report = dict(line.split(": ", 1) for line in capsys.readouterr().out.strip().splitlines())
    assert report["talk_hf"].startswith(talk_hf.__version__)
    assert report["torch"].startswith(torch.__version__) and report["transformers"].startswith(transformers.__version__)
    assert report["kernels on cpu"] == talk_hf.ops.backend("cpu")
    monkeypatch.setenv("TALK_HF_FORCE_REFERENCE", "1")
    forced = dict(line.split(": ", 1) for line in env_report().splitlines())
    assert forced["kernels on cpu"] == "reference" and forced["references forced"] == "TALK_HF_FORCE_REFERENCE=1"
    monkeypatch.setenv("TALK_HF_FORCE_REFERENCE", "yes")  # the value as set, not a normalised one
    assert dict(line.split(": ", 1) for line in env_report().splitlines())["references forced"] == \
        "TALK_HF_FORCE_REFERENCE=yes"
