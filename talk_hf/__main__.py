"""Command line: `python -m talk_hf --version`, and `python -m talk_hf env` for bug reports (versions, the kernels
each device runs)."""

import argparse
import platform
import sys


def env_report():
    """What this installation is and runs, one `name: value` line each: talk_hf, Python, platform, torch (and its
    CUDA), transformers (and the supported range), and per device type whether the compiled kernels or the PyTorch
    references run (with the reason the extension did not load, if it did not)."""
    import torch
    import transformers

    import talk_hf
    from talk_hf import _kernels, versions
    from talk_hf.backend import FORCE_REFERENCE_ENV, _forced_reference, backend

    lines = [
        ("talk_hf", f"{talk_hf.__version__} ({talk_hf.__path__[0]})"),
        ("python", sys.version.split()[0]),
        ("platform", platform.platform()),
        ("torch", f"{torch.__version__} (CUDA {torch.version.cuda or 'none'}; "
                  f"GPU: {torch.cuda.get_device_name() if torch.cuda.is_available() else 'none'})"),
        ("transformers", f"{transformers.__version__} (supported: >={versions.OLDEST},<{versions.FIRST_UNTESTED}; "
                         f"decoding state passed as `{versions.CACHE_NAME}`)"),
        ("kernels on cpu", backend("cpu")),
        ("kernels on cuda", backend("cuda")),
    ]
    if _forced_reference():
        lines.append(("references forced", f"{FORCE_REFERENCE_ENV}=1"))
    if _kernels.load_error():
        lines.append(("extension not loaded", _kernels.load_error()))
    return "\n".join(f"{name}: {value}" for name, value in lines)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m talk_hf", description=__doc__)
    parser.add_argument("--version", action="store_true", help="print talk_hf's version")
    parser.add_argument("command", nargs="?", choices=["env"], help="env: the environment report for bug reports")
    args = parser.parse_args(argv)
    if args.version:
        import talk_hf

        print(talk_hf.__version__)
    elif args.command == "env":
        print(env_report())
    else:
        parser.print_help()


if __name__ == "__main__":
    main()
