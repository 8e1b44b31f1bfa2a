"""SRTP and SRTCP (RFC 3711) for one call: libsrtp through pylibsrtp, keys from SDES (gateway/sip/sdes.py).

Owns: the two libsrtp sessions of a call (inbound: the peer's master key, any SSRC it sends with; outbound:
ours), protecting every RTP and RTCP packet we send and unprotecting every one we receive, and turning
libsrtp's refusals into stable drop reasons. It is pure computation (no sockets, no clock), so the tick engine
calls it on the media path and tests run it with real keys.

Rules followed, and why:

* RFC 3711 §3.3 / §3.4: a received packet is authenticated (and checked against the replay window) before
  anything reads it; one that fails is dropped and counted, never parsed, played or used to latch an address.
  libsrtp keeps the replay window (128 packets unless the peer's WSH asks for more) and the rollover counter.
* Inbound streams are keyed by the peer's key for *any* SSRC (libsrtp's ``ssrc_any_inbound`` template), so a
  phone that changes its SSRC mid-call (a re-INVITE, a transfer) keeps being heard, as with plain RTP.
* Rekeying (RFC 4568 §7.1.4, :meth:`SrtpContext.rekey`): only the side whose key changed gets a new libsrtp
  session; the other keeps its replay window and rollover counter.
* Reasons (:data:`SRTP_DROP_REASONS`): ``auth_failed`` (the tag does not verify: tampered, wrong key, or a
  packet that was never SRTP), ``replay`` (seen already, or older than the window), ``unencrypted`` (SRTCP
  without the E flag, which plain RTCP is: we never accept unencrypted SRTCP), ``too_long``, ``rejected``
  (anything else libsrtp refuses: too short for a header and tag, bad version). The tick names a failed packet
  that is exactly a plain G.711 packet of the call ``plaintext`` (gateway/media/call.py).

Error tree: :class:`SrtpError` (a :class:`~gateway.media.errors.RemoteMediaError`) for a packet we refuse;
:class:`~gateway.media.errors.LocalMediaError` for a bad configuration or a packet of ours libsrtp will not
protect (a programming error).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import final

import pylibsrtp

from gateway.media.errors import LocalMediaError, RemoteMediaError

#: SDES crypto-suite name -> (libsrtp profile, master key || salt octets, authentication tag octets).
SRTP_SUITES: dict[str, tuple[int, int, int]] = {
    "AES_CM_128_HMAC_SHA1_80": (pylibsrtp.Policy.SRTP_PROFILE_AES128_CM_SHA1_80, 30, 10),
    "AES_CM_128_HMAC_SHA1_32": (pylibsrtp.Policy.SRTP_PROFILE_AES128_CM_SHA1_32, 30, 4),
}
#: Stable labels of :attr:`SrtpError.reason` (the tick counts them as ``srtp_<reason>``/``srtcp_<reason>``).
SRTP_DROP_REASONS = ("auth_failed", "replay", "unencrypted", "too_long", "rejected")
_REASON_OF_LIBSRTP = {
    "authentication failure": "auth_failed",
    "replay check failed (bad index)": "replay",
    "replay check failed (index too old)": "replay",
    "unable to perform desired validation": "unencrypted",  # SRTCP without its E flag: plain RTCP, say
}


class SrtpError(RemoteMediaError):
    """A received packet that libsrtp refused; ``reason`` is one of :data:`SRTP_DROP_REASONS`."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SrtpConfig:
    """One call's SRTP as SDES negotiated it: the suite and both master keys (key || salt, 30 octets)."""

    suite: str
    local_key: bytes = field(repr=False)  # we protect with it
    remote_key: bytes = field(repr=False)  # the peer protects with it
    replay_window: int = 0  # packets; 0 = libsrtp's default (128)

    def __post_init__(self) -> None:
        shape = SRTP_SUITES.get(self.suite)
        if shape is None:
            raise LocalMediaError(f"SRTP suite {self.suite!r} is not supported; one of {tuple(SRTP_SUITES)}")
        if len(self.local_key) != shape[1] or len(self.remote_key) != shape[1]:
            raise LocalMediaError(f"{self.suite} keys are {shape[1]} octets of master key and salt")
        if self.replay_window and not 64 <= self.replay_window <= 0x7FFF:
            raise LocalMediaError(f"replay window {self.replay_window} outside 64..32767")

    @property
    def tag_size(self) -> int:
        """Octets the authentication tag adds to each SRTP packet."""
        return SRTP_SUITES[self.suite][2]


def _session(config: SrtpConfig, *, inbound: bool) -> pylibsrtp.Session:
    policy = pylibsrtp.Policy(
        key=config.remote_key if inbound else config.local_key,
        ssrc_type=pylibsrtp.Policy.SSRC_ANY_INBOUND if inbound else pylibsrtp.Policy.SSRC_ANY_OUTBOUND,
        srtp_profile=SRTP_SUITES[config.suite][0],
    )
    if inbound and config.replay_window:
        policy.window_size = config.replay_window
    return pylibsrtp.Session(policy)


def _refused(exc: Exception) -> SrtpError:
    if isinstance(exc, ValueError):  # pylibsrtp: larger than its 1500-octet buffer
        return SrtpError("too_long", str(exc))
    return SrtpError(_REASON_OF_LIBSRTP.get(str(exc), "rejected"), str(exc))


@final
class SrtpContext:
    """Both directions of one call's SRTP and SRTCP. Not thread-safe (libsrtp's sessions are not)."""

    __slots__ = ("_rx", "_tx", "config")

    def __init__(self, config: SrtpConfig) -> None:
        self.config = config
        self._rx = _session(config, inbound=True)
        self._tx = _session(config, inbound=False)

    @property
    def suite(self) -> str:
        return self.config.suite

    def rekey(self, config: SrtpConfig) -> None:
        """New keys from a re-offer: only a direction whose key (or suite, or window) changed starts afresh."""
        old = self.config
        if (
            config.suite != old.suite
            or config.remote_key != old.remote_key
            or config.replay_window != old.replay_window
        ):
            self._rx = _session(config, inbound=True)
        if config.suite != old.suite or config.local_key != old.local_key:
            self._tx = _session(config, inbound=False)
        self.config = config

    def protect(self, packet: bytes) -> bytes:
        """Our RTP packet as SRTP (encrypted payload, authentication tag appended)."""
        try:
            return self._tx.protect(packet)
        except (pylibsrtp.Error, ValueError) as exc:
            raise LocalMediaError(f"libsrtp would not protect an RTP packet of ours: {exc}") from exc

    def protect_rtcp(self, packet: bytes) -> bytes:
        """Our RTCP compound packet as SRTCP (encrypted, E flag and index, tag)."""
        try:
            return self._tx.protect_rtcp(packet)
        except (pylibsrtp.Error, ValueError) as exc:
            raise LocalMediaError(f"libsrtp would not protect an RTCP packet of ours: {exc}") from exc

    def unprotect(self, data: bytes) -> bytes:
        """The plain RTP packet of a received SRTP datagram; raises :class:`SrtpError` when refused."""
        try:
            return self._rx.unprotect(data)
        except (pylibsrtp.Error, ValueError) as exc:
            raise _refused(exc) from None

    def unprotect_rtcp(self, data: bytes) -> bytes:
        """The plain RTCP of a received SRTCP datagram; raises :class:`SrtpError` when refused."""
        try:
            return self._rx.unprotect_rtcp(data)
        except (pylibsrtp.Error, ValueError) as exc:
            raise _refused(exc) from None
