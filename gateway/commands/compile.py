"""``gateway compile``: build the media plane's hot modules with mypyc (see :mod:`gateway.compiled`).

Run a gateway on the build with ``GATEWAY_COMPILED=DIR``. Exit status 0 when built, 2 when this machine cannot
build (what is missing is printed), 1 when the build failed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="build/compiled", help="directory to write the build to (replaced)")
    parser.add_argument("--verbose", action="store_true", help="show mypyc's and the compiler's output")


def main(args: argparse.Namespace) -> int:
    from gateway.compiled.build import BuildError, build, missing_tools

    missing = missing_tools()
    if missing:
        print(f"gateway compile: cannot compile here: missing {', '.join(missing)}", file=sys.stderr)
        return 2
    try:
        result = build(Path(args.out), quiet=not args.verbose)
    except BuildError as exc:
        print(f"gateway compile: {exc}", file=sys.stderr)
        return 1
    print(
        f"compiled {result.modules} modules into {result.out} in {result.seconds:.0f} s; "
        f"use it with GATEWAY_COMPILED={result.out}"
    )
    return 0
