"""``gateway bench``: sizing benchmarks. ``codecs`` measures the DSP path; ``calls`` the whole worker."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bench", metavar="WHAT", required=True)
    codecs = sub.add_parser(
        "codecs", help="µs per call per 20 ms frame: G.711/Opus <-> 24 kHz, batched vs per-call"
    )
    codecs.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    codecs.add_argument("--repeats", type=int, default=5, help="interleaved repetitions (median is reported)")
    codecs.add_argument("--quick", action="store_true", help="fewer frames per measurement (for tests)")


def main(args: argparse.Namespace) -> int:
    if args.bench == "codecs":
        from gateway.bench.codecs import run

        return run(json_output=args.json, repeats=args.repeats, quick=args.quick)
    raise SystemExit(f"unknown benchmark {args.bench!r}")
