"""A call's spans from the session (gateway/session/calltrace.py), read from the SDK's in-memory exporter: provider
connects, turns with their latency, tools with the webhook's HTTP span and its traceparent, resumes; the call id on
every span; none per frame."""

from __future__ import annotations

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from gateway.providers.base import (
    AudioReceived,
    ResponseStarted,
    SpeechStarted,
    SpeechStopped,
    ToolCallRequested,
)
from gateway.session import WebhookToolConfig
from gateway.session.events import Resumed, ToolCallFinished
from gateway.session.tools import ToolRegistry
from gateway.tracing import CALL_ID, CallTrace
from tests.gateway.session.fakes import (
    FakeClock,
    FakeModel,
    drained,
    fast_config,
    is_state,
    make_session,
    of_type,
    pcm_ms,
    tone_frame,
    wait_event,
)


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def call_trace(exporter: InMemorySpanExporter) -> CallTrace:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return CallTrace("c1", "call", tracer=provider.get_tracer("test"))


def _named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [span for span in exporter.get_finished_spans() if span.name == name]


async def test_a_call_has_one_trace_with_connect_turn_and_the_call_id_on_every_span(
    exporter: InMemorySpanExporter, call_trace: CallTrace
) -> None:
    clock = FakeClock()
    model = FakeModel(name="fake")
    session, _ = make_session(model, clock=clock, trace=call_trace)
    await session.start()
    fake = model.last
    for turn in range(2):
        fake.emit(SpeechStarted(item_id=f"u{turn}"), SpeechStopped(item_id=f"u{turn}"))
        await drained(session, fake)
        clock.advance(0.25)
        fake.emit(
            ResponseStarted(response_id=f"r{turn}"),
            AudioReceived(response_id=f"r{turn}", item_id=f"i{turn}", pcm=pcm_ms(100)),
        )
        await drained(session, fake)
        for index in range(5):  # five frames each way: one turn span, not one per frame
            session.push_inbound(tone_frame(index))
            assert session.pull_outbound() is not None
    await session.aclose()
    call_trace.close(end_reason="hangup")

    spans = exporter.get_finished_spans()
    assert {span.context.trace_id for span in spans} == {call_trace.root.get_span_context().trace_id}
    assert all(span.attributes is not None and span.attributes[CALL_ID] == "c1" for span in spans)
    names = sorted(span.name for span in spans)
    assert names == ["call", "call.turn", "call.turn", "provider.connect"]
    (connect,) = _named(exporter, "provider.connect")
    assert connect.attributes is not None and connect.attributes["gateway.provider"] == "fake"
    turns = _named(exporter, "call.turn")
    assert [t.attributes["gateway.turn.latency_ms"] for t in turns if t.attributes] == [250.0, 250.0]
    for turn_span in turns:
        assert turn_span.parent is not None and turn_span.parent.span_id == call_trace.root.get_span_context().span_id
        assert turn_span.end_time is not None and turn_span.start_time is not None
        assert turn_span.end_time - turn_span.start_time == pytest.approx(250e6, abs=1e6)
    (root,) = _named(exporter, "call")
    assert root.attributes is not None and root.attributes["gateway.call.end_reason"] == "hangup"


async def test_a_webhook_tool_is_a_span_with_its_http_child_whose_traceparent_the_webhook_receives(
    exporter: InMemorySpanExporter, call_trace: CallTrace
) -> None:
    requests: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        status = 200 if b"Oslo" in request.content else 502
        return httpx.Response(status, json={"temperature_c": 21})

    config = fast_config(
        webhook_tools=(WebhookToolConfig(name="weather", url="https://hooks.test/weather?key=s3cret", description=""),)
    )
    registry = ToolRegistry.from_config(config, http_transport=httpx.MockTransport(handler))
    model = FakeModel()
    session, _ = make_session(model, config=config, tools=registry, trace=call_trace)
    await session.start()
    fake = model.last
    fake.emit(ToolCallRequested(call_id="w1", name="weather", arguments='{"city": "Oslo"}'))
    await wait_event(session, of_type(ToolCallFinished, call_id="w1"))
    fake.emit(ToolCallRequested(call_id="w2", name="weather", arguments='{"city": "Nowhere"}'))
    await wait_event(session, of_type(ToolCallFinished, call_id="w2"))
    await session.aclose()
    await registry.aclose()

    tools = {s.attributes["gateway.tool.call_id"]: s for s in _named(exporter, "tool.call") if s.attributes}
    posts = _named(exporter, "POST")
    assert set(tools) == {"w1", "w2"} and len(posts) == 2
    assert tools["w1"].status.status_code is StatusCode.UNSET
    assert tools["w2"].status.status_code is StatusCode.ERROR
    for request, post in zip(requests, posts, strict=True):
        assert post.kind is SpanKind.CLIENT and post.attributes is not None
        assert post.attributes["url.full"] == "https://hooks.test/weather", "the query (a secret) is not kept"
        assert post.attributes[CALL_ID] == "c1"
        parent = tools["w1" if b"Oslo" in request.content else "w2"]
        assert post.parent is not None and post.parent.span_id == parent.context.span_id
        trace_id, span_id = request.headers["traceparent"].split("-")[1:3]
        assert int(trace_id, 16) == post.context.trace_id and int(span_id, 16) == post.context.span_id
    assert [p.attributes["http.response.status_code"] for p in posts if p.attributes] == [200, 502]


async def test_a_resume_is_a_span_holding_its_connect_attempts(
    exporter: InMemorySpanExporter, call_trace: CallTrace
) -> None:
    from gateway.providers.errors import ProviderConnectError
    from gateway.session import CallState

    model = FakeModel()
    session, _ = make_session(model, trace=call_trace)
    await session.start()
    model.script.append(ProviderConnectError("refused", retryable=True))
    model.last.drop()
    await wait_event(session, is_state(CallState.RESUMING))
    await wait_event(session, of_type(Resumed))
    await session.aclose()

    (resume,) = _named(exporter, "call.resume")
    assert resume.attributes is not None and resume.attributes["gateway.resume.cause"] == "dropped"
    assert resume.attributes["gateway.resume.attempts"] == 2
    connects = _named(exporter, "provider.connect")
    assert len(connects) == 3  # the first, then two attempts under the resume
    under = [c for c in connects if c.parent is not None and c.parent.span_id == resume.context.span_id]
    assert [c.status.status_code for c in under] == [StatusCode.ERROR, StatusCode.UNSET]


async def test_spans_left_open_at_the_end_of_the_call_are_ended_with_it(
    exporter: InMemorySpanExporter, call_trace: CallTrace
) -> None:
    call_trace.start("handoff", "agent.handoff")
    call_trace.close(end_reason="caller_hung_up")
    call_trace.close(end_reason="again")  # idempotent
    (handoff,) = _named(exporter, "agent.handoff")
    assert handoff.status.status_code is StatusCode.ERROR and handoff.end_time is not None
    assert len(_named(exporter, "call")) == 1


async def test_the_handoff_hook_makes_a_span_from_start_to_outcome(
    exporter: InMemorySpanExporter, call_trace: CallTrace
) -> None:
    model = FakeModel()
    session, _ = make_session(model, trace=call_trace)
    await session.start()
    session.handoff_started(target="billing", source="support")
    session.handoff_ended(ok=True)
    session.handoff_started(target="sales", source="billing")
    session.handoff_ended(ok=False, error="no such agent")
    await session.aclose()
    assert session.handoffs == 2
    done, failed = _named(exporter, "agent.handoff")
    assert done.attributes is not None and failed.attributes is not None
    assert (done.attributes["gateway.handoff.target"], done.attributes["gateway.handoff.ok"]) == ("billing", True)
    assert done.status.status_code is StatusCode.UNSET
    assert failed.status.status_code is StatusCode.ERROR and failed.status.description == "no such agent"
    assert failed.attributes[CALL_ID] == "c1"
