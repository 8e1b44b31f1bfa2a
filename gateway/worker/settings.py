"""Media worker settings, read once at start-up from the environment (``GATEWAY_*``) and command-line flags.

:class:`WorkerSettings` is composed of frozen slices (gateway/worker/slices.py), each validated on its own and
handed to the part that uses it (a part never receives the whole bag):

==============================  ================  =====================================================
slice                           attribute         used by
==============================  ================  =====================================================
:class:`WorkerIdSettings`       ``identity``      the worker's id (``settings.worker_id``)
:class:`SipListenSettings`      ``sip``           the SIP endpoint and transport
:class:`SipTlsSettings`         ``tls``           the SIP over TLS contexts (gateway/worker/sip_tls.py)
:class:`SipEdgeSettings`        ``edge``          password guessing and scanners shut out (gateway/sip/lockout.py)
:class:`TrunkSettings`          ``trunking``      outbound calls and trunk registration
:class:`MediaSettings`          ``media``         RTP ports, codecs, SRTP, jitter buffers, the tick
:class:`CapacitySettings`       ``costs``         admission: the capacity and what each call takes
:class:`GcSettings`             ``gc``            the collector paced by the tick (ADR 0010)
:class:`SessionSettings`        ``session``       each call's session: provider audio, tools
:class:`DrainSettings`          ``drain``         drains with a deadline
:class:`RecordingSettings`      ``recording``     call recordings (gateway/worker/recorder.py)
:class:`WarmTransferSettings`   ``warm``          warm transfers to a human (gateway/worker/warm.py)
==============================  ================  =====================================================

The environment names are a contract: a setting ``x`` of any slice is ``GATEWAY_X`` and, on the command line,
the flag named in gateway/commands/worker_args.py. ``WorkerSettings(sip_port=5070, codecs=("PCMU",))`` takes
the same flat names and gives each to its slice; what is not given is read from the environment. Rules that
span slices (TLS needs a certificate when ``tls`` is a transport, the registrar's transport must be listened
on) are checked by :class:`WorkerSettings`. Every setting's meaning is its ``Field(description=...)``, from
which ``gateway settings --markdown`` writes the table in docs/operations.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from gateway.worker.slices import (
    CapacitySettings,
    DrainSettings,
    GcSettings,
    MediaSettings,
    RecordingSettings,
    SessionSettings,
    SipEdgeSettings,
    SipListenSettings,
    SipTlsSettings,
    TrunkSettings,
    WarmTransferSettings,
    WorkerIdSettings,
    _Slice,
)
from gateway.worker.trunk_config import Trunk, worker_trunks

__all__ = [
    "SLICES",
    "CapacitySettings",
    "DrainSettings",
    "GcSettings",
    "MediaSettings",
    "RecordingSettings",
    "SessionSettings",
    "SipEdgeSettings",
    "SipListenSettings",
    "SipTlsSettings",
    "TrunkSettings",
    "WarmTransferSettings",
    "WorkerIdSettings",
    "WorkerSettings",
]


#: The slices of WorkerSettings, by attribute, in the order of the generated settings table.
SLICES: dict[str, type[_Slice]] = {
    "identity": WorkerIdSettings,
    "sip": SipListenSettings,
    "tls": SipTlsSettings,
    "edge": SipEdgeSettings,
    "trunking": TrunkSettings,
    "media": MediaSettings,
    "costs": CapacitySettings,
    "gc": GcSettings,
    "session": SessionSettings,
    "drain": DrainSettings,
    "recording": RecordingSettings,
    "warm": WarmTransferSettings,
}
# Each flat name (GATEWAY_<NAME>, a flag's key) belongs to one slice.
_SLICE_OF: dict[str, str] = {name: attr for attr, cls in SLICES.items() for name in cls.model_fields}
assert len(_SLICE_OF) == sum(len(cls.model_fields) for cls in SLICES.values()), "a setting name in two slices"
assert not set(SLICES) & set(_SLICE_OF), "a slice named like a setting"


class WorkerSettings(BaseModel):
    """One media worker's settings: its slices, and the rules between them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    identity: WorkerIdSettings = Field(default_factory=WorkerIdSettings)
    sip: SipListenSettings = Field(default_factory=SipListenSettings)
    tls: SipTlsSettings = Field(default_factory=SipTlsSettings)
    edge: SipEdgeSettings = Field(default_factory=SipEdgeSettings)
    trunking: TrunkSettings = Field(default_factory=TrunkSettings)
    media: MediaSettings = Field(default_factory=MediaSettings)
    costs: CapacitySettings = Field(default_factory=CapacitySettings)
    gc: GcSettings = Field(default_factory=GcSettings)
    session: SessionSettings = Field(default_factory=SessionSettings)
    drain: DrainSettings = Field(default_factory=DrainSettings)
    recording: RecordingSettings = Field(default_factory=RecordingSettings)
    _trunks: dict[str, Trunk] = PrivateAttr(default_factory=dict)
    warm: WarmTransferSettings = Field(default_factory=WarmTransferSettings)

    def __init__(self, **values: Any) -> None:
        """Slices as they are, or flat names (``sip_port=5070``) given to their slice, which reads the rest of
        itself from the environment. An unknown name is refused."""
        flat: dict[str, dict[str, Any]] = {}
        sliced: dict[str, Any] = {}
        for name, value in values.items():
            if name in SLICES:
                sliced[name] = value
            elif name in _SLICE_OF:
                flat.setdefault(_SLICE_OF[name], {})[name] = value
            else:
                raise TypeError(f"WorkerSettings has no setting {name!r}")
        for attr, given in flat.items():
            if attr in sliced:
                raise TypeError(f"give {attr} as a slice or as its settings ({', '.join(given)}), not both")
            sliced[attr] = SLICES[attr](**given)
        super().__init__(**sliced)

    @model_validator(mode="after")
    def _across_slices(self) -> WorkerSettings:
        transports, tls = self.sip.sip_transports, self.tls
        if "tls" in transports:
            if tls.sip_tls_cert is None and not tls.sip_tls_self_signed:
                raise ValueError(
                    "the tls transport needs sip_tls_cert and sip_tls_key (or sip_tls_self_signed=true for a test pair)"
                )
            if tls.sip_tls_cert is not None and tls.sip_tls_self_signed:
                raise ValueError("sip_tls_self_signed is for running without a certificate: unset one of them")
            if "tcp" in transports and tls.sip_tls_port == self.sip.sip_port:
                raise ValueError(f"sip_tls_port {tls.sip_tls_port} is taken by SIP over TCP (sip_port)")
        if self.trunking.sip_outbound_proxy is not None:
            from gateway.sip.config import check_outbound_proxy
            from gateway.sip.errors import SipConfigError

            try:
                check_outbound_proxy(self.trunking.sip_outbound_proxy, transports)
            except SipConfigError as exc:
                raise ValueError(f"sip_outbound_proxy: {exc}") from exc
        self._trunks = worker_trunks(
            self.trunking, transports=transports, worker_id=self.worker_id, source=self.trunking.config
        )
        return self

    @property
    def trunks(self) -> dict[str, Trunk]:
        """The worker's trunks by name (gateway/worker/trunk_config.py), checked at start-up."""
        return self._trunks

    @property
    def worker_id(self) -> str:
        return self.identity.worker_id

    @property
    def media_host(self) -> str:
        """The address RTP (and browser calls' ICE host candidates) bind to."""
        return self.media.rtp_host or self.sip.sip_host

    @property
    def recordings_dir(self) -> Path:
        """Where recordings go: ``GATEWAY_RECORDINGS_DIR``, else ``recordings`` in the state directory."""
        given = self.recording.recordings_dir
        return (given if given is not None else self.tls.state_dir / "recordings").expanduser()

    def offer_cost(self) -> float:
        return self.costs.offer_cost(self.media)
