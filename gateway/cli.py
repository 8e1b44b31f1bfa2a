"""The ``gateway`` console script.

Each subcommand lives in ``gateway.commands.<name>`` and exposes ``add_arguments(parser)`` and
``main(args) -> int``. Modules are imported only when their command runs, so ``gateway --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "bench": ("gateway.commands.bench", "measure codec and call throughput (see docs/performance.md)"),
    "compile": ("gateway.commands.compile", "build the media plane's hot modules with mypyc (GATEWAY_COMPILED)"),
    "control": ("gateway.commands.control", "run the control plane alone: ops API, events, metrics, dashboard"),
    "run": ("gateway.commands.run", "all-in-one: control plane + media worker, echo agent by default"),
    "worker": ("gateway.commands.worker", "one media worker (SIP, RTP, sessions) registered with a control plane"),
    "drain": ("gateway.commands.drain", "ask a media worker to drain (a Kubernetes preStop hook), and wait for it"),
    "fake-provider": ("gateway.commands.fake_provider", "run the local OpenAI-Realtime-compatible fake server"),
    "loadtest": ("gateway.commands.loadtest", "synthetic SIP/RTP callers against a gateway, with a report"),
    "settings": ("gateway.commands.settings", "the table of every GATEWAY_* setting, from the settings classes"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gateway",
        description="Telephony gateway for realtime AI voice agents (SIP/RTP and WebRTC).",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        command_parser = sub.add_parser(name, help=help_text, description=help_text)
        command_parser.set_defaults(_module=module_name)
        module = importlib.import_module(module_name)
        module.add_arguments(command_parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    module = importlib.import_module(args._module)
    return int(module.main(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
