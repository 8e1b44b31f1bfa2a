"""Session timers (RFC 4028): negotiation of Session-Expires / Min-SE / refresher, and the two deadlines.

Owns: `SessionTimer` (interval, whether we refresh, last refresh time) and the negotiation helpers:

- UAS (§9): a Session-Expires below our Min-SE (or the peer's own Min-SE) -> 422 with our Min-SE. The
  interval is the smaller of the peer's and ours (never under either Min-SE). The refresher is the one the
  request names; without one we take the job ("uas"), also when the peer lacks `Supported: timer`.
- UAC (§7): we offer `Supported: timer`, Session-Expires and Min-SE without a refresher; the 2xx decides.
  A 2xx without Session-Expires means no session timer. A 422 is retried once with the peer's Min-SE.
- Refresh (§10): the refresher refreshes at half the interval (re-INVITE, or UPDATE when the peer allows
  it). The other side ends the session with BYE when no refresh arrived by
  interval - min(32, interval / 3) after the last one.
"""

from __future__ import annotations

from dataclasses import dataclass

from .config import SessionTimerConfig
from .errors import RemoteProtocolError
from .grammar import get_param, parse_params
from .headers import Headers, parse_int_header
from .message import SipRequest, SipResponse


@dataclass(kw_only=True)
class SessionTimer:
    interval: int
    we_refresh: bool
    last_refresh: float
    refresh_sent: bool = False  # our refresh is in flight: only expiry remains to watch

    @property
    def refresh_at(self) -> float:
        return self.last_refresh + self.interval / 2

    @property
    def expire_at(self) -> float:
        return self.last_refresh + self.interval - min(32.0, self.interval / 3)

    @property
    def deadline(self) -> float:
        return self.refresh_at if self.we_refresh and not self.refresh_sent else self.expire_at

    def refreshed(self, now: float) -> None:
        self.last_refresh = now
        self.refresh_sent = False


def _session_expires(headers: Headers) -> tuple[int, str | None] | None:
    value = headers.get("Session-Expires")
    if value is None:
        return None
    number, _, params = value.partition(";")
    refresher = get_param(parse_params(params), "refresher")
    if refresher is not None and refresher.lower() not in ("uac", "uas"):
        raise RemoteProtocolError("bad refresher parameter")
    return parse_int_header(number, "Session-Expires"), refresher.lower() if refresher else None


def negotiate_as_uas(
    request: SipRequest, config: SessionTimerConfig, now: float
) -> tuple[SessionTimer | None, tuple[tuple[str, str], ...]]:
    """The timer for a dialog-creating or refreshing request we answer, and the 2xx headers for it."""
    if not config.enabled:
        return None, ()
    offered = _session_expires(request.headers)
    peer_min_text = request.headers.get("Min-SE")
    peer_min = parse_int_header(peer_min_text.split(";")[0], "Min-SE") if peer_min_text else 0
    floor = max(config.min_se, peer_min)
    peer_supports = "timer" in request.headers.tokens("Supported") or "timer" in request.headers.tokens("Require")
    if offered is None:
        interval, refresher = max(config.session_expires, floor), "uas"
    else:
        if offered[0] < config.min_se:
            raise RemoteProtocolError(
                "Session Interval Too Small", status_code=422, headers=(("Min-SE", str(config.min_se)),)
            )
        interval = max(min(offered[0], config.session_expires), floor)
        refresher = offered[1] or "uas"
    if not peer_supports:
        refresher = "uas"  # §9: a UAC without the extension cannot refresh on purpose
    headers: list[tuple[str, str]] = [("Session-Expires", f"{interval};refresher={refresher}")]
    if peer_supports:
        headers.append(("Require", "timer"))
    return SessionTimer(interval=interval, we_refresh=refresher == "uas", last_refresh=now), tuple(headers)


def offer_headers(config: SessionTimerConfig, *, interval: int | None = None) -> tuple[tuple[str, str], ...]:
    """Headers for an INVITE we send (dialog-creating: no refresher, the UAS picks)."""
    if not config.enabled:
        return ()
    return (
        ("Session-Expires", str(interval or config.session_expires)),
        ("Min-SE", str(config.min_se)),
    )


def refresh_headers(timer: SessionTimer) -> tuple[tuple[str, str], ...]:
    """Headers for a refresh we send as the refresher: we stay the refresher (we are its UAC)."""
    return (("Session-Expires", f"{timer.interval};refresher=uac"), ("Supported", "timer"))


def negotiate_as_uac(response: SipResponse, now: float) -> SessionTimer | None:
    """The timer a 2xx to our INVITE/UPDATE sets up (None: no session expiration)."""
    offered = _session_expires(response.headers)
    if offered is None:
        return None
    interval, refresher = offered
    return SessionTimer(interval=interval, we_refresh=refresher == "uac", last_refresh=now)


def min_se_of_422(response: SipResponse) -> int | None:
    value = response.headers.get("Min-SE")
    if value is None:
        return None
    try:
        return parse_int_header(value.split(";")[0], "Min-SE")
    except RemoteProtocolError:
        return None
