"""Session core errors.

Error tree::

    SessionError
     ├── SessionConfigError      a SessionConfig / webhook tool declaration is invalid (raised at construction)
     ├── SessionStartError       entering the call failed; everything acquired was released (state ENDED)
     ├── SessionStateError       the operation is not allowed in the session's current state
     │    └── InvalidTransitionError   a state change outside the transition table (a bug in the session)
     ├── ProfileUpdateError      a mid-call profile update failed; the call keeps its previous profile
     ├── HandoffError            a handoff to another agent failed; the previous agent keeps the call
     │    └── HandoffRefusedError      the target profile is unknown, not allowed, or its tools cannot be made
     ├── ToolResolutionError     a profile names a tool the registry cannot run
     └── GuardrailError          a guardrail check failed (bad answer, timeout); the check is skipped

Tool implementations raise :class:`ToolError` (in :mod:`gateway.session.tools`) for failures the agent should
hear about; any other exception from a tool is contained the same way and reported as an error event.
"""

from __future__ import annotations


class SessionError(Exception):
    """Base of every error the session core raises."""


class SessionConfigError(SessionError, ValueError):
    """A configuration value is out of range or inconsistent."""


class SessionStartError(SessionError):
    """The call could not be entered. ``reason`` is the recorded end reason."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class SessionStateError(SessionError):
    """The session is in a state where the operation is not allowed."""


class InvalidTransitionError(SessionStateError):
    """A state transition outside the table in :mod:`gateway.session.state`."""


class ProfileUpdateError(SessionError):
    """Switching the call to another agent profile failed; the previous profile and connection stay in use."""


class HandoffError(SessionError):
    """Handing the call to another agent profile failed; the previous agent and connection stay in use."""


class HandoffRefusedError(HandoffError):
    """The handoff target is unknown or not allowed (nothing was connected)."""


class ToolResolutionError(SessionError):
    """A profile lists a tool that no registered implementation provides."""


class GuardrailError(SessionError):
    """An output guardrail could not give a verdict (its hook timed out or answered badly); it is skipped."""
