"""The ``gateway`` console script.

Each subcommand lives in ``gateway.commands.<name>`` and exposes ``add_arguments(parser)`` and
``main(args) -> int``. Modules are imported only when their command runs, so ``gateway --help`` stays fast.

Commands that are not part of the product plug in through the ``gateway.commands`` entry-point group: a module
with the same two functions and a one-line ``HELP``. The benchmarks (``bench/``, docs/adr/0025) arrive that way,
so the product never imports them by name; where they are not installed, ``gateway bench`` says how to install them.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Iterable, Sequence
from importlib.metadata import EntryPoint, entry_points

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "compile": ("gateway.commands.compile", "build the media plane's hot modules with mypyc (GATEWAY_COMPILED)"),
    "control": ("gateway.commands.control", "run the control plane alone: ops API, events, metrics, dashboard"),
    "run": ("gateway.commands.run", "all-in-one: control plane + media worker, echo agent by default"),
    "worker": ("gateway.commands.worker", "one media worker (SIP, RTP, sessions) registered with a control plane"),
    "drain": ("gateway.commands.drain", "ask a media worker to drain (a Kubernetes preStop hook), and wait for it"),
    "fake-provider": ("gateway.commands.fake_provider", "run the local OpenAI-Realtime-compatible fake server"),
    "loadtest": ("gateway.commands.loadtest", "synthetic SIP/RTP callers against a gateway, with a report"),
    "settings": ("gateway.commands.settings", "the table of every GATEWAY_* setting, from the settings classes"),
}

PLUGIN_GROUP = "gateway.commands"

# Plug-in commands the documentation names, and how to get them where they are missing.
NOT_INSTALLED: dict[str, str] = {
    "bench": "the benchmarks are not installed here; they live beside the gateway in its repository "
    "(bench/README.md): from a checkout, `pip install -e ./bench` (`make setup` does)",
}


def build_parser(plugins: Iterable[EntryPoint] | None = None) -> argparse.ArgumentParser:
    """Every command of the product, and those of ``plugins`` (default: the installed ``gateway.commands``)."""
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
    if plugins is None:
        plugins = entry_points(group=PLUGIN_GROUP)
    found = {point.name: point for point in plugins if point.name not in COMMANDS}
    for name in sorted(found.keys() | NOT_INSTALLED.keys()):
        _add_plugin(sub, name, found.get(name))
    return parser


def _add_plugin(sub: argparse._SubParsersAction[argparse.ArgumentParser], name: str, point: EntryPoint | None) -> None:
    try:
        module = point.load() if point is not None else None
    except ImportError as exc:  # installed once, then its files or its dependencies went away
        module, reason = None, f"the {name} command is installed but does not load ({exc}); reinstall it"
    else:
        reason = NOT_INSTALLED.get(name, "")
    if module is None:
        command_parser = sub.add_parser(name, help=f"(not installed) {reason}", add_help=False)
        command_parser.add_argument("rest", nargs=argparse.REMAINDER)
        command_parser.set_defaults(_missing=f"gateway {name}: {reason}")
        return
    command_parser = sub.add_parser(name, help=module.HELP, description=module.HELP)
    command_parser.set_defaults(_plugin=module)
    module.add_arguments(command_parser)


def main(argv: Sequence[str] | None = None, plugins: Iterable[EntryPoint] | None = None) -> int:
    parser = build_parser(plugins)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    missing = getattr(args, "_missing", None)
    if missing is not None:
        print(missing, file=sys.stderr)
        return 2
    module = getattr(args, "_plugin", None) or importlib.import_module(args._module)
    return int(module.main(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
