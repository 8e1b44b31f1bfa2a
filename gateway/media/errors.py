"""The media layer's error tree. Bad input from the network is expected: it is counted and dropped.

Error tree::

    MediaError
     ├── RemoteMediaError(reason)      the peer sent something we cannot use (count it, drop it)
     │    ├── RtpError                  malformed RTP packet (RFC 3550 §5.1 / A.1 header validity)
     │    ├── RtcpError                 malformed RTCP compound packet (RFC 3550 §6.4 / A.2)
     │    └── DtmfPayloadError          malformed RFC 4733 telephone-event payload
     └── LocalMediaError               we asked for something illegal (bad config, unknown call, bad digit)

``reason`` is a short, stable token (``"short"``, ``"version"``, ...) used as a counter label, so the
datagram boundary can count by reason without parsing messages.
"""

from __future__ import annotations


class MediaError(Exception):
    """Base of every error the media layer raises."""


class RemoteMediaError(MediaError):
    """The peer sent malformed media; ``reason`` is a stable counter label."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


class RtpError(RemoteMediaError):
    """A datagram is not a valid RTP packet. Reasons: see :data:`gateway.media.rtp.RTP_ERROR_REASONS`."""


class RtcpError(RemoteMediaError):
    """A datagram is not a valid RTCP compound packet. Reasons: see :data:`gateway.media.rtcp.RTCP_ERROR_REASONS`."""


class DtmfPayloadError(RemoteMediaError):
    """A telephone-event payload is shorter than the 4 bytes RFC 4733 §2.3 requires."""


class LocalMediaError(MediaError, ValueError):
    """The caller (our own code) asked for something illegal: an invalid config, an unknown call, a bad digit."""
