"""OpenTelemetry traces of calls: one trace per call across the control plane and the worker.

Off unless ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) is set: then
:func:`configure_tracing` installs the SDK's provider with a batching OTLP/HTTP exporter, configured by the
standard ``OTEL_*`` variables. Otherwise no provider is installed and every span is the API's no-op
:class:`~opentelemetry.trace.NonRecordingSpan`. Spans are made and ended from call events (admission, answer,
provider connects, turns, tools, resumes, handoffs), never per media frame, so tracing costs the media tick
nothing either way (docs/performance/2026-12-07-tracing.md).

A :class:`CallTrace` holds one call's root span in one process; its context travels between processes as a
W3C ``traceparent`` (the admission messages of gateway/fleet carry it) and to tool webhooks as a header.
While a call's code runs under :meth:`CallTrace.active`, log records carry its ``trace_id`` and ``span_id``
(:func:`install_log_ids`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import Attributes

__all__ = [
    "CALL_ID",
    "CallTrace",
    "client_span",
    "configure_tracing",
    "install_log_ids",
    "tracing_enabled",
]

log = logging.getLogger(__name__)

CALL_ID = "gateway.call.id"  # the attribute every span of a call carries
TRACER_NAME = "gateway"
ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")

_PROPAGATOR = TraceContextTextMapPropagator()
_current: ContextVar[CallTrace | None] = ContextVar("gateway_call_trace", default=None)


def tracing_enabled(environ: Mapping[str, str] = os.environ) -> bool:
    return any(environ.get(name, "").strip() for name in ENDPOINT_VARIABLES) and environ.get(
        "OTEL_SDK_DISABLED", ""
    ).strip().lower() not in ("true", "1")


def configure_tracing(service_name: str, environ: Mapping[str, str] = os.environ) -> bool:
    """Install the SDK's tracer provider exporting over OTLP/HTTP when an endpoint is set; True if it did.

    ``OTEL_SERVICE_NAME`` (and ``OTEL_RESOURCE_ATTRIBUTES``) win over ``service_name``, as the SDK reads them.
    """
    if not tracing_enabled(environ):
        return False
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create({"service.name": environ.get("OTEL_SERVICE_NAME", "").strip() or service_name})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    install_log_ids()
    log.info("tracing on: spans exported over OTLP/HTTP to %s", _endpoint(environ))
    return True


def shutdown_tracing() -> None:
    """Export the spans still buffered (at process exit); nothing when tracing is off."""
    provider = trace.get_tracer_provider()
    shutdown = getattr(provider, "shutdown", None)
    if callable(shutdown):
        shutdown()


def _endpoint(environ: Mapping[str, str]) -> str:
    return next(environ[name] for name in reversed(ENDPOINT_VARIABLES) if environ.get(name, "").strip())


def gateway_tracer() -> Tracer:
    """The gateway's tracer: the installed provider's, or the API's proxy (no-op until one is installed)."""
    return trace.get_tracer(TRACER_NAME)


# ---------------------------------------------------------------------------------------------- logs

_LOG_IDS_INSTALLED = False


def install_log_ids() -> None:
    """Give every log record ``trace_id``, ``span_id`` (hex, empty outside a span) and ``trace`` (a
    `` trace_id=... span_id=...`` suffix for formats, empty outside a span). Idempotent."""
    global _LOG_IDS_INSTALLED
    if _LOG_IDS_INSTALLED:
        return
    _LOG_IDS_INSTALLED = True
    previous = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        span_context = trace.get_current_span().get_span_context()
        ids = ("", "")
        if span_context.is_valid:
            ids = (format(span_context.trace_id, "032x"), format(span_context.span_id, "016x"))
        record.__dict__.update(
            trace_id=ids[0], span_id=ids[1], trace=f" trace_id={ids[0]} span_id={ids[1]}" if ids[0] else ""
        )
        return record

    logging.setLogRecordFactory(factory)


#: The log format of gateway processes: the message, then the call's trace ids when a span is active.
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s%(trace)s"


def log_format(traced: bool) -> str:
    return LOG_FORMAT if traced else "%(asctime)s %(levelname)s %(name)s: %(message)s"


# --------------------------------------------------------------------------------------------- calls


def parent_context(traceparent: str) -> otel_context.Context | None:
    """The context a W3C ``traceparent`` names (None when empty or malformed: a new trace starts)."""
    if not traceparent:
        return None
    extracted = _PROPAGATOR.extract({"traceparent": traceparent})
    return extracted if trace.get_current_span(extracted).get_span_context().is_valid else None


def traceparent_of(span: Span) -> str:
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
    return carrier.get("traceparent", "")


class CallTrace:
    """The spans of one call in one process, under one root span; ended from the call's events.

    ``parent``: the ``traceparent`` of the call's span in the process that saw it first (empty: this root
    starts the trace). ``tracer``: tests pass an SDK tracer with an in-memory exporter.
    """

    def __init__(
        self,
        call_id: str,
        name: str,
        *,
        parent: str = "",
        kind: SpanKind = SpanKind.SERVER,
        attributes: Mapping[str, Any] | None = None,
        tracer: Tracer | None = None,
    ) -> None:
        self.call_id = call_id
        self.tracer = tracer or gateway_tracer()
        self.root = self.tracer.start_span(
            name, context=parent_context(parent), kind=kind, attributes={CALL_ID: call_id, **(attributes or {})}
        )
        self.recording = self.root.is_recording()
        self._open: dict[str, Span] = {}
        self._closed = False

    @property
    def trace_id(self) -> str:
        """The call's trace id (32 hex digits), empty when tracing is off."""
        span_context = self.root.get_span_context()
        return format(span_context.trace_id, "032x") if span_context.is_valid else ""

    @property
    def traceparent(self) -> str:
        return traceparent_of(self.root) if self.recording else ""

    def start(
        self,
        key: str,
        name: str,
        attributes: Attributes = None,
        *,
        parent: str | None = None,
        start_time_s: float | None = None,
    ) -> Span:
        """Open a span named ``name`` under the root (or under the open span ``parent``), kept under ``key``
        until :meth:`end`. A span already open under ``key`` is ended first (an event seen twice)."""
        if not self.recording:  # tracing off: the root is the API's no-op, and so would this be
            return self.root
        self.end(key)
        under = self._open.get(parent, self.root) if parent is not None else self.root
        span = self.tracer.start_span(
            name,
            context=trace.set_span_in_context(under),
            attributes={CALL_ID: self.call_id, **(attributes or {})},
            start_time=_ns(start_time_s),
        )
        if not self._closed:
            self._open[key] = span
        else:
            span.end()
        return span

    def end(self, key: str, attributes: Attributes = None, *, error: str = "", end_time_s: float | None = None) -> None:
        """End the span open under ``key`` (nothing if none is), with more attributes, an error status."""
        span = self._open.pop(key, None)
        if span is None:
            return
        if attributes:
            span.set_attributes(attributes)
        if error:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end(end_time=_ns(end_time_s))

    def is_open(self, key: str) -> bool:
        return key in self._open

    def span(
        self, name: str, attributes: Attributes = None, *, start_time_s: float, end_time_s: float | None = None
    ) -> None:
        """A whole span at once, for an interval known when it is over (a turn's wait for the agent)."""
        if not self.recording:
            return
        span = self.tracer.start_span(
            name,
            context=trace.set_span_in_context(self.root),
            attributes={CALL_ID: self.call_id, **(attributes or {})},
            start_time=_ns(start_time_s),
        )
        span.end(end_time=_ns(end_time_s))

    def event(self, name: str, attributes: Attributes = None) -> None:
        """A point in the call (a barge-in, a DTMF digit): an event on the root span."""
        if self.recording:
            self.root.add_event(name, attributes=attributes)

    @contextlib.contextmanager
    def active(self, key: str | None = None) -> Iterator[Span]:
        """Run under the root (or the open span ``key``): log records carry its ids, :func:`client_span` and
        spans made meanwhile hang under it, and tasks created meanwhile inherit it."""
        span = self._open.get(key, self.root) if key is not None else self.root
        token = _current.set(self)
        try:
            with trace.use_span(span, end_on_exit=False):
                yield span
        finally:
            _current.reset(token)

    def close(self, attributes: Attributes = None, *, end_reason: str = "") -> None:
        """End every span still open, then the root. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for key in list(self._open):
            self.end(key, error=f"call ended ({end_reason})" if end_reason else "")
        if end_reason:
            self.root.set_attribute("gateway.call.end_reason", end_reason)
        if attributes:
            self.root.set_attributes(attributes)
        self.root.end()


def _ns(seconds: float | None) -> int | None:
    return round(seconds * 1e9) if seconds is not None else None


def wall_time_s(monotonic_s: float, *, now_monotonic_s: float | None = None) -> float:
    """The epoch time of a ``time.monotonic()`` reading (spans are stamped in epoch time)."""
    now = time.monotonic() if now_monotonic_s is None else now_monotonic_s
    return time.time() - (now - monotonic_s)


@contextlib.contextmanager
def plane_span(name: str, traceparent: str, *, call_id: str) -> Iterator[Span]:
    """A control-plane span of a call (admission, originate), under ``traceparent`` when given, else under the
    current span; current while it runs, ended on exit (an exception sets its error status)."""
    with gateway_tracer().start_as_current_span(
        name, context=parent_context(traceparent), kind=SpanKind.SERVER, attributes={CALL_ID: call_id}
    ) as span:
        yield span


@contextlib.contextmanager
def client_span(name: str, headers: dict[str, str], attributes: Attributes = None) -> Iterator[Span | None]:
    """A CLIENT span for an outgoing request made under a call's :meth:`CallTrace.active` (a tool webhook),
    with its ``traceparent`` put into ``headers``; outside a call, or with tracing off, nothing (None)."""
    call = _current.get()
    if call is None or not call.recording:
        yield None
        return
    with call.tracer.start_as_current_span(
        name, kind=SpanKind.CLIENT, attributes={CALL_ID: call.call_id, **(attributes or {})}
    ) as span:
        _PROPAGATOR.inject(headers)
        yield span
