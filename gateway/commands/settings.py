"""``gateway settings --markdown``: the table of every setting, written from the settings classes themselves.

Each setting's meaning lives once, in its ``Field(description=...)``; its environment name and default come
from the class, its command-line flag from the parsers of ``gateway run`` and ``gateway worker``. The table in
docs/operations.md sits between :data:`BEGIN` and :data:`END` and is rewritten with ``--write FILE``; a test
fails when the file and the classes differ.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from enum import Enum
from pathlib import Path
from typing import Any

from pydantic import AliasChoices
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

BEGIN = "<!-- BEGIN settings table: `gateway settings --write docs/operations.md`; edit the descriptions, not this -->"
END = "<!-- END settings table -->"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--markdown", action="store_true", help="print the settings table (Markdown)")
    what.add_argument("--write", metavar="FILE", type=Path, help="rewrite the table between the markers of FILE")


def main(args: argparse.Namespace) -> int:
    table = markdown()
    if args.markdown:
        sys.stdout.write(table)
        return 0
    path: Path = args.write
    try:
        path.write_text(replace_table(path.read_text(), table))
    except (OSError, ValueError) as exc:
        print(f"gateway settings: {exc}", file=sys.stderr)
        return 2
    return 0


def settings_classes() -> list[tuple[str, type[BaseSettings]]]:
    """Every settings class of the product, with the heading of its part of the table, in table order."""
    from gateway.control.settings import ControlSettings
    from gateway.control.webhooks import EventWebhookSettings
    from gateway.control.webrtc_api import WebRtcApiSettings
    from gateway.providers.pipeline.local.factories import LocalSettings
    from gateway.providers.registry import ProviderSettings
    from gateway.worker.settings import SLICES
    from gateway.worker.webrtc import WebRtcSettings

    return [
        *((f"Worker: {cls.title}", cls) for cls in SLICES.values()),
        ("Worker: browser calls", WebRtcSettings),
        ("Control plane", ControlSettings),
        ("Control plane: browser call offers", WebRtcApiSettings),
        ("Control plane: event webhooks", EventWebhookSettings),
        ("Providers", ProviderSettings),
        ("Providers: local pipeline components", LocalSettings),
    ]


def env_names(cls: type[BaseSettings], name: str, field: FieldInfo) -> list[str]:
    """The environment variables a field is read from (its aliases, or the class prefix and its name)."""
    alias = field.validation_alias
    if isinstance(alias, AliasChoices):
        return [str(choice) for choice in alias.choices if isinstance(choice, str) and choice.isupper()]
    if isinstance(alias, str):
        return [alias.upper()]
    prefix = str(cls.model_config.get("env_prefix", ""))
    return [f"{prefix}{name}".upper()]


def flags() -> dict[str, str]:
    """GATEWAY_* name -> the flag of ``gateway run``/``gateway worker`` that overrides it."""
    from gateway.commands.worker_args import FLAG_SETTINGS

    found = {f"GATEWAY_{key.upper()}": f"--{dest.replace('_', '-')}" for dest, key in FLAG_SETTINGS}
    found["GATEWAY_PROVIDER"] = "--provider"
    for name in ("http_host", "http_port", "config"):  # `gateway run` and `gateway control`
        found[f"GATEWAY_{name.upper()}"] = f"--{name.replace('_', '-')}"
    return found


def default_text(field: FieldInfo) -> str:
    extra = field.json_schema_extra
    if isinstance(extra, dict) and "doc_default" in extra:
        return f"`{extra['doc_default']}`"
    value: Any = field.get_default(call_default_factory=False)
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, tuple):
        return f"`{','.join(map(str, value))}`" if value else "empty"
    if isinstance(value, float):
        return f"`{value:g}`"
    if isinstance(value, str) and not value:
        return "empty"
    return f"`{value}`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("``", "`").replace("|", "\\|")


def _rows(cls: type[BaseSettings], flag_of: dict[str, str]) -> Iterator[str]:
    for name, field in cls.model_fields.items():
        names = env_names(cls, name, field)
        variable = " or ".join(f"`{n}`" for n in names)
        flag = " ".join(f"`{flag_of[n]}`" for n in names if n in flag_of)
        yield f"| {variable} | {flag} | {default_text(field)} | {_cell(field.description or '')} |"


def markdown() -> str:
    """The whole table: one part per settings class."""
    flag_of = flags()
    lines = [BEGIN, ""]
    for heading, cls in settings_classes():
        lines += [f"#### {heading}", ""]
        doc = (cls.__doc__ or "").strip()
        if doc:
            lines += [_cell(doc), ""]
        lines += ["| variable | flag | default | meaning |", "|---|---|---|---|", *_rows(cls, flag_of), ""]
    lines.append(END)
    return "\n".join(lines) + "\n"


def replace_table(text: str, table: str) -> str:
    """``text`` with the part between the markers (included) replaced by ``table``."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError("the settings table markers are missing")
    return text[:start] + table + text[end + len(END) + 1 :]


def current_table(text: str) -> str:
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError("the settings table markers are missing")
    return text[start : end + len(END) + 1]
