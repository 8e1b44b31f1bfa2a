"""What the SIP edge reports: failed authentications and blocks, as log lines fail2ban can read and as
`security.blocked` events on the control plane's stream.

The log lines are fixed text with the address after "from" (deploy/fail2ban/ has a filter that matches them),
so a host firewall can take over a source the gateway keeps blocking. Blocks are rare (a few failures each),
so each is reported to the control plane; single failures are only logged.
"""

from __future__ import annotations

import logging
import time

from gateway.fleet.models import WorkerEvent
from gateway.sip.events import AuthenticationFailed, SourceBlocked

from .ports import CallHost

log = logging.getLogger("gateway.security")

__all__ = ["EdgeReporter", "failure_line"]


def _printable(text: str | None) -> str:
    """A peer-chosen value made safe for one log line (no quotes or control characters to forge a line)."""
    if not text:
        return "-"
    return "".join(ch if ch.isprintable() and ch not in '"\\' else "?" for ch in text)[:64]


def failure_line(event: AuthenticationFailed) -> str:
    host, port = event.source
    return (
        f'SIP authentication failed for user "{_printable(event.username)}" from {host} port {port} '
        f'({event.transport}, {event.method}, agent "{_printable(event.user_agent)}")'
    )


class EdgeReporter:
    def __init__(self, host: CallHost) -> None:
        self._host = host

    def observed(self, event: AuthenticationFailed | SourceBlocked) -> None:
        if isinstance(event, AuthenticationFailed):
            log.warning("%s", failure_line(event))
            return
        log.warning(
            "SIP %s %s blocked for %.0f s after %d failed authentications",
            event.scope,
            _printable(event.key),
            event.block_s,
            event.failures,
        )
        if self._host.link is not None:
            self._host.spawn(self._report(event), name=f"edge-report-{event.key}")

    async def _report(self, event: SourceBlocked) -> None:
        link = self._host.link
        assert link is not None
        data = {
            "scope": event.scope,
            "key": event.key,
            "failures": event.failures,
            "block_s": event.block_s,
            "transport": event.transport,
        }
        try:
            await link.report([WorkerEvent(type="security.blocked", worker=self._host.id, time=time.time(), data=data)])
        except Exception as exc:
            log.warning("report of the block of %s failed: %s", event.key, exc)
