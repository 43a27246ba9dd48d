"""``python -m sim``: the same command as ``gavel sim``, for a tree without the console script."""

from __future__ import annotations

import argparse
import sys

from sim.cli import add_arguments, run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gavel sim", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
