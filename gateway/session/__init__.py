"""Session core: one CallSession per call between the media leg and a realtime provider.

Public surface: :class:`CallSession` (lifecycle, media tick contract, events, stats, transcript),
:class:`SessionConfig`, the :class:`CallControl` protocol the worker implements, :class:`ToolRegistry` and the
event types in :mod:`gateway.session.events`.

`CallSession` is loaded on first use: the session module brings the media tick (and scipy) with it, and the
control plane, which imports the session's configuration models through the fleet's, never runs a call.
"""

from typing import TYPE_CHECKING, Any

from gateway.session.config import LocalVadConfig, SessionConfig, WebhookToolConfig
from gateway.session.control import CallControl, TransferOutcome
from gateway.session.errors import (
    InvalidTransitionError,
    ProfileUpdateError,
    SessionConfigError,
    SessionError,
    SessionStartError,
    SessionStateError,
    ToolResolutionError,
)
from gateway.session.events import EventRecord, EventRing, EventRingClosedError, SessionEvent
from gateway.session.state import CallState
from gateway.session.stats import SessionStats
from gateway.session.tools import Tool, ToolError, ToolInvocation, ToolRegistry
from gateway.session.transcript import TranscriptEntry

if TYPE_CHECKING:
    from gateway.session.session import CallSession


def __getattr__(name: str) -> Any:
    if name == "CallSession":
        from gateway.session.session import CallSession

        return CallSession
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CallControl",
    "CallSession",
    "CallState",
    "EventRecord",
    "EventRing",
    "EventRingClosedError",
    "InvalidTransitionError",
    "LocalVadConfig",
    "ProfileUpdateError",
    "SessionConfig",
    "SessionConfigError",
    "SessionError",
    "SessionEvent",
    "SessionStartError",
    "SessionStateError",
    "SessionStats",
    "Tool",
    "ToolError",
    "ToolInvocation",
    "ToolRegistry",
    "ToolResolutionError",
    "TranscriptEntry",
    "TransferOutcome",
    "WebhookToolConfig",
]
