"""The in-process ControlLink: a worker and the control plane in one process (``gateway run``).

The worker talks to the plane through exactly the interface it would use over HTTP, so the all-in-one
process and a split deployment run the same code paths. Models are passed through unchanged (they are
frozen), and the worker's own WorkerCommands object is handed to the plane on register/heartbeat so the
plane calls it directly instead of over HTTP.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.fleet.models import AdmissionDecision, AdmissionRequest, CallSnapshot, WorkerEvent, WorkerInfo
from gateway.fleet.protocols import ControlPlaneApi, WorkerCommands


class InProcessControlLink:
    """ControlLink calling a ControlPlaneApi object in the same event loop."""

    def __init__(self, plane: ControlPlaneApi, commands: WorkerCommands) -> None:
        self._plane = plane
        self._commands = commands

    async def register(self, info: WorkerInfo) -> WorkerInfo:
        return await self._plane.register(info, commands=self._commands)

    async def heartbeat(self, info: WorkerInfo, calls: Sequence[CallSnapshot]) -> WorkerInfo:
        return await self._plane.heartbeat(info, list(calls), commands=self._commands)

    async def admit(self, request: AdmissionRequest) -> AdmissionDecision:
        return await self._plane.admit(request)

    async def report(self, events: Sequence[WorkerEvent]) -> None:
        await self._plane.report(list(events))

    async def aclose(self) -> None:
        return None
