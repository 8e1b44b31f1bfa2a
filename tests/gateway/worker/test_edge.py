import re
from pathlib import Path

from gateway.sip.events import AuthenticationFailed
from gateway.worker.edge import failure_line

FILTER = Path(__file__).resolve().parents[3] / "deploy" / "fail2ban" / "voice-gateway.conf"


def _failregex() -> re.Pattern[str]:
    (line,) = [line for line in FILTER.read_text().splitlines() if line.startswith("failregex")]
    pattern = line.split("=", 1)[1].strip()
    return re.compile(pattern.replace("<HOST>", r"(?P<host>\S+)"))


def test_the_line_names_the_source_after_from() -> None:
    event = AuthenticationFailed(
        source=("203.0.113.9", 5070), transport="udp", username="alice", method="INVITE", user_agent="Zoiper"
    )
    match = _failregex().search(failure_line(event))
    assert match is not None and match.group("host") == "203.0.113.9"


def test_a_peer_chosen_username_cannot_forge_another_source() -> None:
    forged = 'x" from 10.0.0.1 port 1 (\n'
    event = AuthenticationFailed(
        source=("203.0.113.9", 5070), transport="tcp", username=forged, method="INVITE", user_agent='"\r\n'
    )
    line = failure_line(event)
    assert "\n" not in line and "\r" not in line
    matches = list(_failregex().finditer(line))
    assert [m.group("host") for m in matches] == ["203.0.113.9"]
