"""The worker's composition root: :func:`assemble_worker` builds its parts, each with only the ports it uses.

::

                      ┌──────────── MediaWorker (CallHost; the tick; heartbeats; commands) ───────────┐
                      │                                                                              │
   SipTransport ──events──▶ route ──▶ TrunkRegistrations (one per trunk with register = true)       │
        ▲                     └─────▶ SipCalls(CallHost, SipSignalling, MediaPlant, LegRegistry,     │
        │                                      sip, media, costs, trunking slices)                   │
   SipSignalling ◀─── actions + pump          WebRtcCalls(CallHost, WebRtcSettings, LegRegistry, costs) │
   MediaPlant (TickEngine, RtpPortPool, RtpDrain, routes) ◀── read by the tick                        │
   WorkerDrain(LegRegistry, drain slice, stop_taking_calls) ───────────────────────────────────────────┘

The parts never hold the worker: where they need it they hold a port (gateway/worker/ports.py) that the worker
implements (``CallHost``), or a callback the root wires here (``stop_taking_calls``, ``on_change``).
"""

from __future__ import annotations

import gc
import secrets
import time
from dataclasses import dataclass
from typing import Protocol

from gateway.heap import CollectorPolicy, Observe, PacedCollector
from gateway.media.tick import TickEngine
from gateway.sip.auth import ClientCredentials, DigestAuthenticator, DigestClientCredentials
from gateway.sip.config import RateLimit, SessionTimerConfig, SipConfig
from gateway.sip.digest import DigestChallenger
from gateway.sip.endpoint import SipEndpoint
from gateway.sip.events import SipEvent
from gateway.sip.trunk_auth import SourceTrunks, TrunkSource
from gateway.transport.rtp_socket import RtpDrain, RtpPortPool, RtpPortRange
from gateway.transport.sip_transport import SipTransport
from gateway.transport.tls import TlsContexts
from gateway.worker.drain import WorkerDrain
from gateway.worker.legs import LegRegistry
from gateway.worker.ports import CallHost, MediaPlant, SipSignalling
from gateway.worker.recorder import Recordings
from gateway.worker.registration import REGISTRATION_EVENTS, TrunkRegistration, TrunkRegistrations
from gateway.worker.settings import WorkerSettings
from gateway.worker.sip_calls import SipCalls
from gateway.worker.sip_tls import sip_tls_contexts
from gateway.worker.webrtc import WebRtcCalls, WebRtcSettings


class WorkerHost(CallHost, Protocol):
    """The call host, and the worker's heartbeat (a drain or a registration change is told at once)."""

    def heartbeat_soon(self) -> None: ...


@dataclass(eq=False)
class WorkerParts:
    """Everything :func:`assemble_worker` built, for the worker to drive."""

    signalling: SipSignalling
    transport: SipTransport
    sip_tls: TlsContexts | None
    plant: MediaPlant
    legs: LegRegistry
    sip_calls: SipCalls
    webrtc: WebRtcCalls
    drain: WorkerDrain
    registration: TrunkRegistrations
    collector: PacedCollector | None


def sip_config(settings: WorkerSettings) -> SipConfig:
    """The SIP endpoint's configuration from the listener, TLS, trunk and capacity slices."""
    sip = settings.sip
    nonce_secret = secrets.token_bytes(32)
    authenticator = None
    if sip.sip_auth_user is not None and sip.sip_auth_password is not None:
        authenticator = _authenticator(
            {sip.sip_auth_user: sip.sip_auth_password.get_secret_value()}, sip.sip_auth_realm, nonce_secret
        )
    sourced = [trunk for trunk in settings.trunks.values() if trunk.sources]
    trunks = None
    if sourced or settings.trunking.trunk_unmatched_calls == "reject":
        trunks = SourceTrunks(
            tuple(
                TrunkSource(
                    name=trunk.name,
                    networks=trunk.sources,
                    authenticator=_authenticator(trunk.inbound_credentials, sip.sip_auth_realm, nonce_secret)
                    if trunk.inbound_credentials
                    else None,
                )
                for trunk in sourced
            ),
            reject_unmatched=settings.trunking.trunk_unmatched_calls == "reject",
        )
    return SipConfig(
        local_host=sip.sip_host,
        local_port=sip.sip_port,
        tls_port=settings.tls.sip_tls_port,
        advertised_host=sip.advertised_host,
        advertised_port=sip.advertised_sip_port,
        advertised_tls_port=settings.tls.advertised_sip_tls_port,
        transports=sip.sip_transports,
        user_agent=sip.user_agent,
        allow_cidrs=sip.sip_allow,
        authenticator=authenticator,
        trunks=trunks,
        lockout=settings.edge.lockout(),
        scanner_agents=settings.edge.sip_drop_user_agents,
        rate_limit=RateLimit(per_second=sip.sip_rate_limit_per_s, burst=int(sip.sip_rate_limit_per_s * 2)),
        session_timer=SessionTimerConfig(session_expires=sip.session_expires_s),
        outbound_proxy=settings.trunking.sip_outbound_proxy,
        max_calls=max(settings.costs.capacity * 2, 10),
    )


def _authenticator(credentials: dict[str, str], realm: str, nonce_secret: bytes) -> DigestAuthenticator:
    return DigestAuthenticator(DigestChallenger(realm=realm, credentials=credentials.get, nonce_secret=nonce_secret))


def trunk_credentials_of(settings: WorkerSettings) -> ClientCredentials | None:
    trunk = settings.trunking
    if trunk.trunk_user and trunk.trunk_password:
        return DigestClientCredentials(username=trunk.trunk_user, password=trunk.trunk_password.get_secret_value())
    return None


def assemble_worker(
    settings: WorkerSettings,
    host: WorkerHost,
    *,
    sip: SipConfig | None = None,
    trunk_credentials: ClientCredentials | None = None,
    webrtc_settings: WebRtcSettings | None = None,
    observe_gc: Observe | None = None,
) -> WorkerParts:
    """Build the parts of one worker hosted by ``host``. Raises TlsConfigError (unusable certificate files) or
    OSError (a self-signed pair cannot be written)."""
    endpoint = SipEndpoint(sip or sip_config(settings))
    legs = LegRegistry()
    parts: WorkerParts | None = None

    def route(events: list[SipEvent]) -> None:
        assert parts is not None  # events come once the transport is started, after assembly
        if any(isinstance(event, REGISTRATION_EVENTS) for event in events):
            parts.registration.on_events(events)
            events = [event for event in events if not isinstance(event, REGISTRATION_EVENTS)]
        parts.sip_calls.on_sip_events(events)

    tls = sip_tls_contexts(
        settings.tls,
        transports=settings.sip.sip_transports,
        hosts=(settings.sip.advertised_host, settings.sip.sip_host),
    )
    transport = SipTransport(
        endpoint,
        host=settings.sip.sip_host,
        port=settings.sip.sip_port,
        transports=settings.sip.sip_transports,
        on_events=route,
        tls=tls,
        tls_port=settings.tls.sip_tls_port,
    )
    signalling = SipSignalling(endpoint, transport)
    media = settings.media
    first, last = media.rtp_port_bounds
    plant = MediaPlant(
        engine=TickEngine(wall_clock_offset=time.time() - time.monotonic()),
        ports=RtpPortPool(RtpPortRange(host=settings.media_host, first=first, last=last)),
        rtp_drain=RtpDrain() if media.rtp_read_at_tick and RtpDrain.supported() else None,
        recordings=Recordings(
            settings.recordings_dir,
            worker_id=settings.worker_id,
            queue_ticks=settings.recording.recording_queue_ticks,
        ),
    )
    sip_calls = SipCalls(
        host,
        signalling,
        plant,
        legs,
        sip=settings.sip,
        media=media,
        costs=settings.costs,
        trunk=settings.trunking,
        trunks=settings.trunks,
        trunk_credentials=trunk_credentials or trunk_credentials_of(settings),
        warm=settings.warm,
    )
    webrtc = WebRtcCalls(
        host, webrtc_settings or WebRtcSettings(), legs=legs, costs=settings.costs, media_host=settings.media_host
    )
    registrations = {
        name: TrunkRegistration(
            signalling,
            trunk.registration,
            worker_id=settings.worker_id,
            trunk=name,
            unregister_timeout_s=settings.trunking.trunk_unregister_timeout_s,
            on_change=host.heartbeat_soon,
        )
        for name, trunk in settings.trunks.items()
        if trunk.registration is not None
    }
    registration = TrunkRegistrations(registrations)

    def stop_taking_calls() -> None:
        signalling.set_accepting_calls(False)  # 503 to INVITEs and OPTIONS: Kamailio's probes mark us down
        registration.begin_unregister("drain")  # the trunk's registrar stops offering calls here
        host.heartbeat_soon()  # readiness follows at once

    drain = WorkerDrain(
        legs,
        settings=settings.drain,
        session_config=host.session_config,
        spawn=host.spawn,
        stop_taking_calls=stop_taking_calls,
        worker_id=settings.worker_id,
    )
    gc_settings = settings.gc
    collector = (
        PacedCollector(
            CollectorPolicy(
                full_after=gc.get_threshold()[2],
                full_interval_s=gc_settings.gc_full_interval_s,
                middle_after=gc_settings.gc_middle_after,
            ),
            observe=observe_gc,
        )
        if gc_settings.gc_paced
        else None
    )
    parts = WorkerParts(
        signalling=signalling,
        transport=transport,
        sip_tls=tls,
        plant=plant,
        legs=legs,
        sip_calls=sip_calls,
        webrtc=webrtc,
        drain=drain,
        registration=registration,
        collector=collector,
    )
    return parts
