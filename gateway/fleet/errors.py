"""Errors of the fleet contract, raised on both sides of the control-plane/worker boundary.

Error tree::

    FleetError
     ├── CallNotFoundError        the worker (or plane) has no call with this id        -> 404
     ├── WorkerNotFoundError      no worker with this id is known                        -> 404
     ├── CommandRejectedError     the worker refused the command (bad state, bad target) -> 409
     └── LinkError                the other side could not be reached or answered badly  -> 502
          └── LinkAuthError       the other side rejected our token                      -> 502

The HTTP links translate httpx exceptions and error responses into these at the boundary, so callers
never see transport exceptions.
"""

from __future__ import annotations


class FleetError(Exception):
    """Base of every fleet error."""


class CallNotFoundError(FleetError):
    def __init__(self, call_id: str) -> None:
        super().__init__(f"no call {call_id!r}")
        self.call_id = call_id


class WorkerNotFoundError(FleetError):
    def __init__(self, worker_id: str) -> None:
        super().__init__(f"no worker {worker_id!r}")
        self.worker_id = worker_id


class CommandRejectedError(FleetError):
    """The worker understood the command but cannot do it (e.g. transfer of a call not yet answered)."""


class LinkError(FleetError):
    """The peer is unreachable, timed out after the bounded retries, or answered with a server error."""


class LinkAuthError(LinkError):
    """The peer answered 401: the API tokens of control plane and worker differ."""
