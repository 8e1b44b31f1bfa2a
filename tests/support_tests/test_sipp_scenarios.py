"""The SIPp scenarios shipped for users are well-formed and carry the SIP dialogue they promise.

SIPp itself is not packaged for Debian 12, so the scenarios are checked structurally here."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

SIPP_DIR = Path(__file__).resolve().parents[2] / "deploy" / "sipp"


def _steps(name: str) -> list[tuple[str, str]]:
    root = ET.parse(SIPP_DIR / name).getroot()
    steps = []
    for element in root:
        if element.tag == "send":
            steps.append(("send", (element.text or "").strip().split(" ", 1)[0]))
        elif element.tag == "recv":
            steps.append(("recv", element.get("response", "") + ("?" if element.get("optional") else "")))
        elif element.tag == "pause":
            steps.append(("pause", ""))
    return steps


def test_invite_bye_scenario_is_a_complete_dialogue() -> None:
    assert _steps("uac_invite_bye.xml") == [
        ("send", "INVITE"),
        ("recv", "100?"),
        ("recv", "180?"),
        ("recv", "183?"),
        ("recv", "200"),
        ("send", "ACK"),
        ("pause", ""),
        ("send", "BYE"),
        ("recv", "200"),
    ]
    text = (SIPP_DIR / "uac_invite_bye.xml").read_text()
    assert "a=rtpmap:0 PCMU/8000" in text and "telephone-event/8000" in text


def test_options_scenario() -> None:
    assert _steps("options_ping.xml") == [("send", "OPTIONS"), ("recv", "200")]
