"""gateway/tracing.py: off without an OTLP endpoint (the API's no-op, nothing recorded, no header added), the SDK
with the OTLP/HTTP exporter with one; traceparents carried and refused when malformed; log records carrying the
ids of the active span."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.tracing import (
    CALL_ID,
    CallTrace,
    client_span,
    install_log_ids,
    parent_context,
    traceparent_of,
    tracing_enabled,
)


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> TracerProvider:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def test_tracing_is_on_only_with_an_endpoint_and_not_disabled() -> None:
    assert not tracing_enabled({})
    assert not tracing_enabled({"OTEL_EXPORTER_OTLP_ENDPOINT": "  "})
    assert tracing_enabled({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    assert tracing_enabled({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"})
    assert not tracing_enabled({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_SDK_DISABLED": "true"})


def test_with_no_provider_installed_a_call_trace_is_the_apis_no_op() -> None:
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider), "no SDK provider in the test process"
    call = CallTrace("c1", "call")
    assert not call.recording and call.trace_id == "" and call.traceparent == ""
    call.start("setup", "call.setup", {"a": 1})
    call.event("dtmf", {"digit": "1"})
    headers: dict[str, str] = {}
    with call.active(), client_span("POST", headers) as span:
        assert span is None
    assert headers == {}, "no traceparent leaves a process that does not trace"
    call.close(end_reason="x")


def test_a_calls_trace_continues_a_traceparent_and_refuses_a_malformed_one(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    tracer = provider.get_tracer("test")
    first = CallTrace("c1", "call", tracer=tracer)
    remote = CallTrace("c1", "control.admit", parent=first.traceparent, tracer=tracer)
    assert remote.trace_id == first.trace_id and len(first.trace_id) == 32
    for bad in ("", "00-zz-zz-01", "00-" + "0" * 32 + "-" + "0" * 16 + "-01", "garbage"):
        assert parent_context(bad) is None
        assert CallTrace("c2", "call", parent=bad, tracer=tracer).trace_id != first.trace_id
    remote.close()
    first.close()
    spans = {span.name: span for span in exporter.get_finished_spans()}
    admit = spans["control.admit"]
    assert admit.parent is not None and admit.parent.span_id == first.root.get_span_context().span_id
    assert admit.attributes is not None and admit.attributes[CALL_ID] == "c1"
    assert traceparent_of(first.root).split("-")[1] == first.trace_id


def test_log_records_carry_the_active_spans_ids(provider: TracerProvider, caplog: pytest.LogCaptureFixture) -> None:
    install_log_ids()
    install_log_ids()  # idempotent
    call = CallTrace("c1", "call", tracer=provider.get_tracer("test"))
    log = logging.getLogger("tests.tracing")
    with caplog.at_level(logging.INFO, logger="tests.tracing"):
        log.info("outside")
        with call.active():
            log.info("inside")
    outside, inside = caplog.records
    assert outside.__dict__["trace_id"] == "" and outside.__dict__["trace"] == ""
    span_id = format(call.root.get_span_context().span_id, "016x")
    assert inside.__dict__["trace_id"] == call.trace_id and inside.__dict__["span_id"] == span_id
    assert inside.__dict__["trace"] == f" trace_id={call.trace_id} span_id={span_id}"


def test_configure_installs_the_sdk_with_the_otlp_http_exporter_only_when_an_endpoint_is_set() -> None:
    script = (
        "import json, logging\n"
        "from opentelemetry import trace\n"
        "from gateway.tracing import configure_tracing\n"
        "on = configure_tracing('gateway-test')\n"
        "provider = trace.get_tracer_provider()\n"
        "processors = getattr(getattr(provider, '_active_span_processor', None), '_span_processors', ())\n"
        "exporters = [type(getattr(p, 'span_exporter', None) or p._batch_processor._exporter).__name__"
        " for p in processors]\n"
        "name = provider.resource.attributes.get('service.name') if on else None\n"
        "print(json.dumps({'on': on, 'provider': type(provider).__name__, 'exporters': exporters, 'name': name}))\n"
    )
    base = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}

    def run(env: dict[str, str]) -> dict[str, object]:
        done = subprocess.run(
            [sys.executable, "-c", script], env={**base, **env}, capture_output=True, text=True, timeout=60, check=True
        )
        result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
        return result

    assert run({}) == {"on": False, "provider": "ProxyTracerProvider", "exporters": [], "name": None}
    on = run({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"})
    assert on == {"on": True, "provider": "TracerProvider", "exporters": ["OTLPSpanExporter"], "name": "gateway-test"}
    named = run({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_SERVICE_NAME": "edge-1"})
    assert named["name"] == "edge-1"
