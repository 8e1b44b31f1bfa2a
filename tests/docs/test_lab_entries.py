"""The documentation's one-fact-in-one-place structure holds: lab entries are named by date, listed in the
summary's index, and the relative links of the docs reach files that exist.

docs/performance.md is a short summary with an index of the dated lab entries under docs/performance/; an entry
that is not in the index is as good as lost, and a link that names a moved or renamed file sends the reader
nowhere. docs/sizing.md is the one home of call costs and capacity.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
ENTRY_NAME = re.compile(r"^(\d{4})-(\d{2})-(\d{2})-[a-z0-9]+(?:-[a-z0-9]+)*\.md$")
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")


def entries() -> list[Path]:
    return sorted((DOCS / "performance").glob("*.md"))


def test_lab_entries_are_named_by_date_and_topic() -> None:
    found = entries()
    assert len(found) >= 40
    bad = [path.name for path in found if not ENTRY_NAME.match(path.name)]
    assert bad == [], f"name lab entries YYYY-MM-DD-topic.md (lowercase words joined by '-'): {bad}"


def test_each_lab_entry_has_a_title() -> None:
    untitled = [path.name for path in entries() if not path.read_text().startswith("# ")]
    assert untitled == [], f"a lab entry starts with '# Title': {untitled}"


def test_every_lab_entry_is_in_the_summary_index() -> None:
    summary = (DOCS / "performance.md").read_text()
    index = summary[summary.index("## Index") :]
    missing = [path.name for path in entries() if f"(performance/{path.name})" not in index]
    assert missing == [], "add a line for each under its date in docs/performance.md's index: " + "; ".join(
        f"- [topic](performance/{name}): one-sentence conclusion." for name in missing
    )


def test_the_summary_stays_a_summary() -> None:
    summary = (DOCS / "performance.md").read_text()
    before_index = summary[: summary.index("## Index")]
    assert len(before_index.splitlines()) <= 70, "the summary above the index is one screen: move detail to an entry"


def test_relative_links_in_the_docs_resolve() -> None:
    pages = [ROOT / "README.md", *DOCS.glob("*.md"), *DOCS.glob("adr/*.md"), *entries()]
    broken = []
    for page in pages:
        for target in LINK.findall(page.read_text()):
            if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
                continue
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert broken == []


def test_plain_path_references_to_lab_entries_exist() -> None:
    """Comments and ADRs name entries by path (docs/performance/FILE.md): each such file exists."""
    sources = [*ROOT.glob("gateway/**/*.py"), *ROOT.glob("codecs/**/*.py"), *ROOT.glob("tests/**/*.py")]
    sources += [ROOT / "README.md", *DOCS.glob("*.md"), *DOCS.glob("adr/*.md"), *entries()]
    named = re.compile(r"docs/performance/(\d{4}-\d{2}-\d{2}-[a-z0-9-]+\.md)")
    missing = sorted(
        {
            f"{path.relative_to(ROOT)}: {name}"
            for path in sources
            for name in named.findall(path.read_text(errors="replace"))
            if not (DOCS / "performance" / name).exists()
        }
    )
    assert missing == []


def setting_default(model: type[BaseModel], name: str) -> Any:
    """A worker setting's default, wherever it sits: on the settings class or in one of its slices."""
    if name in model.model_fields:
        return model.model_fields[name].default
    for field in model.model_fields.values():
        inner = field.annotation
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            found = setting_default(inner, name)
            if found is not None:
                return found
    return None


def test_sizing_shows_each_call_cost_setting_with_its_default() -> None:
    from gateway.worker.settings import WorkerSettings

    sizing = (DOCS / "sizing.md").read_text()
    for name in ("g722_call_cost", "opus_call_cost", "webrtc_call_cost", "srtp_call_cost", "capacity"):
        default = setting_default(WorkerSettings, name)
        assert default is not None, f"no worker setting {name}"
        env = f"`GATEWAY_{name.upper()}`"
        assert env in sizing, f"docs/sizing.md does not name {env}"
        shown = f"{default:g}" if isinstance(default, float) else str(default)
        assert re.search(rf"{re.escape(env)}[^|]*\|?[^|]*\*\*\+?{re.escape(shown)}\*\*", sizing), (
            f"docs/sizing.md does not show {env}'s default {shown} in bold beside it: update the page with the default"
        )
