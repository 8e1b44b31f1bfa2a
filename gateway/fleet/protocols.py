"""The two directions of the fleet contract, as Protocols.

``WorkerCommands``: what a media worker does when the control plane asks (hang up, transfer, DTMF,
originate, drain, snapshot). Implemented by the worker itself, and on the control plane side by
:class:`gateway.fleet.http.HttpWorkerCommands`, which forwards over HTTP to :func:`gateway.fleet.worker_api`.

``ControlLink``: what a worker calls on the control plane (register, heartbeat, admit, report). Two
implementations: :class:`gateway.fleet.links.InProcessControlLink` (``gateway run``: worker and plane in
one process) and :class:`gateway.fleet.http.HttpControlLink` (``gateway worker --control URL``).

``ControlPlaneApi``: what the control plane exposes to links. It is ControlLink's server side; the
in-process link hands the worker's own ``WorkerCommands`` along so the plane can call it directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from gateway.fleet.models import (
    AdmissionDecision,
    AdmissionRequest,
    AgentCommand,
    CallSnapshot,
    OriginateRequest,
    TransferLine,
    WarmTransferRequest,
    WorkerEvent,
    WorkerInfo,
)


@runtime_checkable
class WorkerCommands(Protocol):
    """Commands a worker executes. Raise CallNotFoundError for unknown ids, CommandRejectedError otherwise."""

    async def hang_up(self, call_id: str, reason: str) -> None: ...

    async def transfer(self, call_id: str, target: str) -> None: ...

    async def send_dtmf(self, call_id: str, digits: str) -> None: ...

    async def hold(self, call_id: str, held: bool) -> None:
        """Put the caller on hold with hold audio (True) or take them off it (CommandRejectedError: 409)."""
        ...

    async def warm_transfer(self, call_id: str, request: WarmTransferRequest) -> TransferLine:
        """Bring a human in, briefed, then join them with the caller (gateway/worker/warm.py); returns once their
        phone rings (CommandRejectedError: 409 naming why it cannot)."""
        ...

    async def warm_transfer_join(self, call_id: str) -> TransferLine:
        """Join a warm transfer's caller and human now, instead of waiting for the briefing (CommandRejectedError:
        409 when the call has no transfer in briefing)."""
        ...

    async def command_agent(self, call_id: str, command: AgentCommand) -> None:
        """Live call control: the agent says, is told, or is changed (CommandRejectedError unless it is up)."""
        ...

    async def originate(self, request: OriginateRequest, admission: AdmissionDecision) -> str:
        """Start dialling; return the call id (``admission.call_id``) once the call exists on the worker."""
        ...

    async def drain(self, exit_when_empty: bool, deadline_s: float | None = None) -> None:
        """Refuse new calls from now on; when ``exit_when_empty``, exit after the last call ends; calls still up
        ``deadline_s`` from now are ended politely (None: they run to their end)."""
        ...

    async def snapshot(self) -> list[CallSnapshot]: ...


@runtime_checkable
class ControlLink(Protocol):
    """A worker's handle on the control plane. Raises LinkError when the plane cannot be reached."""

    async def register(self, info: WorkerInfo) -> WorkerInfo:
        """Announce the worker; returns the record as the plane stored it (status, stamped heartbeat)."""
        ...

    async def heartbeat(self, info: WorkerInfo, calls: Sequence[CallSnapshot]) -> WorkerInfo:
        """Load + the snapshot of every live call. A plane that forgot the worker re-registers it."""
        ...

    async def admit(self, request: AdmissionRequest) -> AdmissionDecision: ...

    async def report(self, events: Sequence[WorkerEvent]) -> None: ...

    async def aclose(self) -> None: ...


@runtime_checkable
class ControlPlaneApi(Protocol):
    """The control plane's side of ControlLink (implemented by gateway.control.plane.ControlPlane)."""

    async def register(self, info: WorkerInfo, *, commands: WorkerCommands | None = None) -> WorkerInfo: ...

    async def heartbeat(
        self, info: WorkerInfo, calls: Sequence[CallSnapshot], *, commands: WorkerCommands | None = None
    ) -> WorkerInfo: ...

    async def admit(self, request: AdmissionRequest) -> AdmissionDecision: ...

    async def report(self, events: Sequence[WorkerEvent]) -> None: ...
