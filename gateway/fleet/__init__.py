"""Fleet: the contract between the control plane and media workers (models, links, internal API).

Sits below gateway.control and gateway.worker, which both import it. Public surface:

* models — WorkerInfo (with its TrunkRegistration), CallSnapshot, CallStats, FleetEvent, WorkerEvent,
  AdmissionRequest/Decision, ProfileModel (wire form of AgentProfile + webhook tools), OriginateRequest,
  TransferRequest, DtmfRequest, DrainRequest, HangupRequest
* protocols — WorkerCommands (plane -> worker), ControlLink (worker -> plane), ControlPlaneApi
* InProcessControlLink, HttpControlLink, HttpWorkerCommands, RetryPolicy, worker_api(commands, token)
* estimate_mos (ITU-T G.107 E-model, simplified)
"""

from gateway.fleet.errors import (
    CallNotFoundError,
    CommandRejectedError,
    FleetError,
    LinkAuthError,
    LinkError,
    WorkerNotFoundError,
)
from gateway.fleet.http import HttpControlLink, HttpWorkerCommands, RetryPolicy
from gateway.fleet.json_errors import install_json_errors
from gateway.fleet.links import InProcessControlLink
from gateway.fleet.models import (
    AdmissionDecision,
    AdmissionRequest,
    CallSnapshot,
    CallStats,
    DrainRequest,
    DtmfRequest,
    FleetEvent,
    HangupRequest,
    OriginateRequest,
    ProfileModel,
    ToolCallLine,
    ToolModel,
    TranscriptLine,
    TransferRequest,
    TrunkRegistration,
    WebhookSpec,
    WorkerEvent,
    WorkerInfo,
)
from gateway.fleet.mos import estimate_mos, r_factor
from gateway.fleet.protocols import ControlLink, ControlPlaneApi, WorkerCommands
from gateway.fleet.worker_api import worker_api

__all__ = [
    "AdmissionDecision",
    "AdmissionRequest",
    "CallNotFoundError",
    "CallSnapshot",
    "CallStats",
    "CommandRejectedError",
    "ControlLink",
    "ControlPlaneApi",
    "DrainRequest",
    "DtmfRequest",
    "FleetError",
    "FleetEvent",
    "HangupRequest",
    "HttpControlLink",
    "HttpWorkerCommands",
    "InProcessControlLink",
    "LinkAuthError",
    "LinkError",
    "OriginateRequest",
    "ProfileModel",
    "RetryPolicy",
    "ToolCallLine",
    "ToolModel",
    "TranscriptLine",
    "TransferRequest",
    "TrunkRegistration",
    "WebhookSpec",
    "WorkerCommands",
    "WorkerEvent",
    "WorkerInfo",
    "WorkerNotFoundError",
    "estimate_mos",
    "install_json_errors",
    "r_factor",
    "worker_api",
]
