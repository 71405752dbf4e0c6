"""Command line: `python -m talk_hf --version`, and `python -m talk_hf env` for bug reports (versions, the kernels
each device runs)."""

import argparse

from talk_hf.environment import env_report


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
