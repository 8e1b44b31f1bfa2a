"""The settings table of docs/operations.md is written from the settings classes: the file and the classes agree,
every setting of every class has a description, and every class the product reads is in the table."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.commands import settings as settings_doc
from gateway.worker.settings import SLICES, WorkerSettings
from tests.deploy.support import gateway_env_names

OPERATIONS = Path(__file__).resolve().parents[3] / "docs" / "operations.md"


def test_the_table_in_docs_operations_is_the_generated_one() -> None:
    generated = settings_doc.markdown()
    written = settings_doc.current_table(OPERATIONS.read_text())
    assert written == generated, "run `gateway settings --write docs/operations.md`"


def test_every_setting_has_its_meaning_in_one_description() -> None:
    missing = [
        f"{cls.__name__}.{name}"
        for _, cls in settings_doc.settings_classes()
        for name, field in cls.model_fields.items()
        if not (field.description or "").strip()
    ]
    assert missing == []


def test_every_variable_the_gateway_reads_is_in_the_table() -> None:
    table = settings_doc.markdown()
    compiled = {"GATEWAY_COMPILED"}  # read by `import gateway` itself, documented with the compiled build
    assert [name for name in sorted(gateway_env_names() - compiled) if f"`{name}`" not in table] == []


def test_every_settings_class_in_the_source_is_in_the_table() -> None:
    import re

    root = Path(__file__).resolve().parents[3] / "gateway"
    declared = {
        match
        for path in root.rglob("*.py")
        for match in re.findall(r"^class (\w+)\((?:BaseSettings|_Slice)\):", path.read_text(), re.M)
    } - {"_Slice"}
    listed = {cls.__name__ for _, cls in settings_doc.settings_classes()}
    assert declared == listed


def test_the_flags_in_the_table_are_the_commands_flags() -> None:
    from gateway.cli import build_parser

    parser = build_parser()
    run_help = next(a for a in parser._subparsers._group_actions if a.dest == "command").choices["run"]  # type: ignore[union-attr]
    options = {option for action in run_help._actions for option in action.option_strings}
    assert set(settings_doc.flags().values()) <= options


def test_the_command_writes_the_table_between_the_markers(tmp_path: Path) -> None:
    from gateway.cli import main

    page = tmp_path / "page.md"
    page.write_text(f"before\n{settings_doc.BEGIN}\nstale\n{settings_doc.END}\nafter\n")
    assert main(["settings", "--write", str(page)]) == 0
    assert page.read_text() == f"before\n{settings_doc.markdown()}after\n"
    page.write_text("no markers\n")
    assert main(["settings", "--write", str(page)]) == 2


def test_flat_setting_names_reach_their_slice_and_an_unknown_one_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_SIP_HOST", "127.0.0.2")
    settings = WorkerSettings(sip_port=5070, codecs="pcmu")
    assert (settings.sip.sip_host, settings.sip.sip_port, settings.media.codecs) == ("127.0.0.2", 5070, ("PCMU",))
    with pytest.raises(TypeError, match="sip_prot"):
        WorkerSettings(sip_prot=5070)
    names = [name for cls in SLICES.values() for name in cls.model_fields]
    assert len(names) == len(set(names))
