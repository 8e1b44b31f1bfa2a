"""Tools: webhook calls, error containment, grace-period promotion and idle delivery, queued long requests,
the built-ins (hang_up, transfer, send_dtmf), DTMF from the caller."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from gateway.providers.base import (
    AgentProfile,
    AudioReceived,
    ResponseDone,
    ResponseStarted,
    SpeechStarted,
    SpeechStopped,
    ToolCallRequested,
    ToolCallsCancelled,
    ToolSpec,
)
from gateway.session import CallState, ToolRegistry, TransferOutcome, WebhookToolConfig
from gateway.session.control import WarmTransferStart
from gateway.session.events import (
    DtmfReceived,
    ToolCallFinished,
    ToolCallPromoted,
    ToolCallStarted,
    ToolResultDelivered,
    ToolResultUndelivered,
)
from gateway.session.tools import ToolInvocation
from tests.gateway.session.fakes import (
    DEADLINE,
    FakeCallControl,
    FakeClock,
    FakeModel,
    FakeRealtimeSession,
    call_tasks,
    drained,
    fast_config,
    make_session,
    of_type,
    pcm_ms,
    wait_event,
)


class SlowTool:
    def __init__(self, name: str, *, background_ok: bool = True) -> None:
        self.spec = ToolSpec(name=name, description=f"{name} (slow)")
        self.background_ok = background_ok
        self.runs = 0
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def run(self, invocation: ToolInvocation) -> str:
        self.runs += 1
        self.started.set()
        await self.release.wait()
        return json.dumps({"tool": self.spec.name, "args": dict(invocation.arguments)})


def _outputs(fake: FakeRealtimeSession) -> dict[str, Any]:
    return {entry[1]: json.loads(entry[2]) for entry in fake.of("tool_result")}


async def _output(fake: FakeRealtimeSession, call_id: str) -> Any:
    await fake.wait_sent(lambda s: any(e[0] == "tool_result" and e[1] == call_id for e in s))
    return _outputs(fake)[call_id]


# ------------------------------------------------------------------------------------------ webhooks


def _webhook_session(handler: Any, **webhook: Any) -> tuple[Any, FakeModel, ToolRegistry]:
    fields = {"name": "weather", "url": "https://hooks.test/weather", "description": "Weather by city"}
    fields.update(webhook)
    config = fast_config(webhook_tools=(WebhookToolConfig(**fields),))
    registry = ToolRegistry.from_config(config, http_transport=httpx.MockTransport(handler))
    model = FakeModel()
    session, _ = make_session(model, config=config, tools=registry)
    return session, model, registry


async def test_webhook_tool_success() -> None:
    requests: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        return httpx.Response(200, json={"temperature_c": 21, "sky": "clear"})

    session, model, registry = _webhook_session(
        handler,
        auth_header=("Authorization", "Bearer s3cret"),
        parameters={"type": "object", "properties": {"city": {"type": "string"}}},
    )
    await session.start()
    fake = model.last
    offered = {spec.name: spec for spec in fake.profile.tools}
    assert set(offered) == {"hang_up", "transfer", "send_dtmf", "weather"}
    assert offered["weather"].parameters["properties"] == {"city": {"type": "string"}}
    fake.emit(ToolCallRequested(call_id="w1", name="weather", arguments='{"city": "Oslo"}'))
    assert await _output(fake, "w1") == {"temperature_c": 21, "sky": "clear"}
    await fake.wait_sent(lambda s: [e for e in s if e[0] == "create_response"])
    assert fake.sent.index(("create_response", None)) > [e[0] for e in fake.sent].index("tool_result")
    (request,) = requests
    assert request.method == "POST" and str(request.url) == "https://hooks.test/weather"
    assert request.headers["Authorization"] == "Bearer s3cret"
    assert request.headers["Idempotency-Key"] == "w1"
    assert json.loads(request.content) == {
        "call_id": "c1",
        "tool_call_id": "w1",
        "name": "weather",
        "arguments": {"city": "Oslo"},
    }
    outputs = [(e.call_id, json.loads(e.output)) for e in session.transcript if e.kind == "function_call_output"]
    assert outputs == [("w1", {"temperature_c": 21, "sky": "clear"})]
    await session.aclose()
    await registry.aclose()


async def test_webhook_requests_carry_the_callers_context() -> None:
    requests: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        return httpx.Response(200, json={"ok": True})

    context = {"caller_number": "+15550100", "headers": {"X-Account": "A-42"}}
    session, model, registry = _webhook_session(handler, context=context)
    await session.start()
    model.last.emit(ToolCallRequested(call_id="w2", name="weather", arguments="{}"))
    assert await _output(model.last, "w2") == {"ok": True}
    (request,) = requests
    assert json.loads(request.content)["context"] == context
    await session.aclose()
    await registry.aclose()


async def test_webhook_tool_raising_or_failing_returns_an_error_output() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if json.loads(request.content)["arguments"].get("city") == "Nowhere":
            return httpx.Response(500, text="boom")
        raise httpx.ConnectError("connection refused", request=request)

    session, model, registry = _webhook_session(handler)
    await session.start()
    fake = model.last
    fake.emit(ToolCallRequested(call_id="w1", name="weather", arguments='{"city": "Oslo"}'))
    assert await _output(fake, "w1") == {"error": "weather could not be reached: ConnectError"}
    fake.emit(ToolCallRequested(call_id="w2", name="weather", arguments='{"city": "Nowhere"}'))
    assert await _output(fake, "w2") == {"error": "weather answered HTTP 500"}
    fake.emit(ToolCallRequested(call_id="w3", name="weather", arguments="not json"))
    assert await _output(fake, "w3") == {"error": "arguments are not valid JSON"}
    fake.emit(ToolCallRequested(call_id="w4", name="nope", arguments="{}"))
    assert await _output(fake, "w4") == {"error": "unknown tool 'nope'"}
    assert session.state is CallState.ACTIVE
    assert session.stats().tool_calls == 4 and session.stats().tool_errors == 4
    await session.aclose()
    await registry.aclose()


async def test_webhook_tool_timeout_returns_an_error_output() -> None:
    never = asyncio.Event()

    async def handler(request: httpx.Request) -> httpx.Response:
        await never.wait()
        return httpx.Response(200, json={})

    session, model, registry = _webhook_session(handler, timeout_s=0.05, background=False)
    await session.start()
    fake = model.last
    fake.emit(ToolCallRequested(call_id="w1", name="weather", arguments="{}"))
    assert await _output(fake, "w1") == {"error": "weather timed out after 0.05 s"}
    finished = await wait_event(session, of_type(ToolCallFinished, call_id="w1"))
    assert not finished.ok and not finished.background
    await session.aclose()
    await registry.aclose()
    assert call_tasks() == []


async def test_webhook_against_a_loopback_server() -> None:
    """The real network path once: an HTTP server on 127.0.0.1 answering one POST."""
    received: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(next(h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")).split(b":")[1])
        received.append(await reader.readexactly(length))
        body = b'{"ok": true}'
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 12\r\n\r\n" + body)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        config = fast_config(
            webhook_tools=(
                WebhookToolConfig(name="ping", url=f"http://127.0.0.1:{port}/ping", timeout_s=2.0, background=False),
            )
        )
        model = FakeModel()
        session, _ = make_session(model, config=config)  # the session owns (and closes) its registry
        await session.start()
        model.last.emit(ToolCallRequested(call_id="p1", name="ping", arguments='{"n": 1}'))
        assert await _output(model.last, "p1") == {"ok": True}
        assert json.loads(received[0])["arguments"] == {"n": 1}
        await session.aclose()
    finally:
        server.close()
        await server.wait_closed()


# ---------------------------------------------------------------------------------- background tools


async def test_long_tool_is_promoted_and_delivered_when_idle_not_over_caller_speech() -> None:
    clock = FakeClock()
    slow = SlowTool("order_status")
    model = FakeModel()
    config = fast_config(tool_grace_s=0.05, reply_wait_s=0.5)
    session, _ = make_session(model, config=config, tools=ToolRegistry([slow]), clock=clock)
    await session.start()
    fake = model.last
    fake.emit(ToolCallRequested(call_id="b1", name="order_status", arguments='{"order": 7}'))
    await wait_event(session, of_type(ToolCallPromoted, call_id="b1"))
    interim = await _output(fake, "b1")
    assert interim["status"] == "pending"
    await fake.wait_sent(lambda s: [e for e in s if e[0] == "create_response"])
    fake.emit(ResponseStarted(response_id="r1"), ResponseDone(response_id="r1", status="completed"))

    fake.emit(SpeechStarted(item_id="u1"))  # the caller talks while the result arrives
    await drained(session, fake)
    slow.release.set()
    finished = await wait_event(session, of_type(ToolCallFinished, call_id="b1"))
    assert finished.ok and finished.background
    for _ in range(5):
        session.pull_outbound()
    await drained(session, fake)
    assert fake.of("text") == [], "nothing is delivered over the caller's speech"

    fake.emit(SpeechStopped(item_id="u1"))
    await drained(session, fake)
    session.pull_outbound()
    await drained(session, fake)
    assert fake.of("text") == [], "a reply to the caller may be about to start"
    clock.advance(0.6)
    session.pull_outbound()
    await fake.wait_sent(lambda s: [e for e in s if e[0] == "text"])
    ((_, text, role),) = fake.of("text")
    assert role == "system" and "order_status" in text and '"order": 7' in text
    await fake.wait_sent(lambda s: s[-1][0] == "create_response")
    delivered = await wait_event(session, of_type(ToolResultDelivered, call_id="b1", kind="background"))
    assert delivered.epoch == 1
    assert slow.runs == 1 and session.stats().tools_promoted == 1
    await session.aclose()


async def test_second_long_request_is_queued_not_lost() -> None:
    clock = FakeClock()
    first, second = SlowTool("slow_a"), SlowTool("slow_b")
    model = FakeModel()
    config = fast_config(tool_grace_s=0.05, background_slots=1, reply_wait_s=0.1)
    session, _ = make_session(model, config=config, tools=ToolRegistry([first, second]), clock=clock)
    await session.start()
    fake = model.last
    fake.emit(ToolCallRequested(call_id="a", name="slow_a", arguments="{}"))
    await wait_event(session, of_type(ToolCallPromoted, call_id="a"))
    fake.emit(ToolCallRequested(call_id="b", name="slow_b", arguments="{}"))
    queued = await wait_event(session, of_type(ToolCallStarted, call_id="b"))
    assert queued.queued
    assert (await _output(fake, "b"))["status"] == "queued"
    assert second.runs == 0, "the queued request waits for the running one"
    first.release.set()
    await asyncio.wait_for(second.started.wait(), DEADLINE)
    second.release.set()
    await wait_event(session, of_type(ToolCallFinished, call_id="b"))

    for count in (1, 2):  # one result per idle moment: the agent's reply in between
        clock.advance(1.0)
        session.pull_outbound()
        await fake.wait_sent(lambda s, count=count: len([e for e in s if e[0] == "text"]) == count)
        fake.emit(ResponseStarted(response_id=f"r{count}"), ResponseDone(response_id=f"r{count}", status="completed"))
        await drained(session, fake)
    delivered = [e[1] for e in fake.of("text")]
    assert "slow_a" in delivered[0] and "slow_b" in delivered[1]
    assert first.runs == 1 and second.runs == 1
    await session.aclose()


async def test_undelivered_background_result_is_reported_at_call_end() -> None:
    slow = SlowTool("report")
    model = FakeModel()
    session, _ = make_session(model, config=fast_config(tool_grace_s=0.05), tools=ToolRegistry([slow]))
    await session.start()
    model.last.emit(ToolCallRequested(call_id="x1", name="report", arguments="{}"))
    await wait_event(session, of_type(ToolCallPromoted, call_id="x1"))
    await session.aclose("caller_hung_up")
    lost = [r.event for r in session.events.events_since(0)[0] if isinstance(r.event, ToolResultUndelivered)]
    assert [(e.call_id, e.reason) for e in lost] == [("x1", "call ended while the tool was running")]
    assert call_tasks() == []


async def test_cancelled_tool_calls_are_not_delivered() -> None:
    slow = SlowTool("lookup", background_ok=False)
    model = FakeModel()
    session, _ = make_session(model, tools=ToolRegistry([slow]))
    await session.start()
    fake = model.last
    fake.emit(ToolCallRequested(call_id="g1", name="lookup", arguments="{}"))
    await asyncio.wait_for(slow.started.wait(), DEADLINE)
    fake.emit(ToolCallsCancelled(call_ids=("g1",)))
    await wait_event(session, of_type(ToolResultUndelivered, call_id="g1"))
    slow.release.set()
    await wait_event(session, of_type(ToolCallFinished, call_id="g1"))
    await drained(session, fake)
    assert fake.of("tool_result") == [] and fake.of("create_response") == []
    await session.aclose()


# ------------------------------------------------------------------------------------------ built-ins


async def test_send_dtmf_tool() -> None:
    model = FakeModel()
    session, control = make_session(model)
    await session.start()
    fake = model.last
    fake.emit(ToolCallRequested(call_id="d1", name="send_dtmf", arguments='{"digits": "12#"}'))
    assert await _output(fake, "d1") == {"ok": True, "status": "sent", "digits": "12#"}
    fake.emit(ToolCallRequested(call_id="d2", name="send_dtmf", arguments='{"digits": "12x"}'))
    assert "error" in await _output(fake, "d2")
    assert control.dtmf == ["12#"]
    await session.aclose()


@pytest.mark.parametrize(
    ("outcome", "reason"),
    [
        (TransferOutcome(status="accepted", sip_status=200), "transferred"),
        (TransferOutcome(status="refused", sip_status=403), "transfer_refused"),
        (TransferOutcome(status="failed", sip_status=486), "transfer_failed"),
    ],
)
async def test_transfer_tool_ends_the_call_with_the_outcome(outcome: TransferOutcome, reason: str) -> None:
    model = FakeModel()
    session, control = make_session(model, control=FakeCallControl(transfer_outcome=outcome))
    await session.start()
    model.last.emit(ToolCallRequested(call_id="x1", name="transfer", arguments='{"target": "sip:sales@pbx"}'))
    assert await asyncio.wait_for(session.wait_ended(), DEADLINE) == reason
    await session.aclose()
    assert control.transfers == ["sip:sales@pbx"]
    assert control.hang_ups == [reason]


async def test_transfer_to_a_target_outside_the_allow_list_is_refused_and_the_call_goes_on() -> None:
    model = FakeModel()
    config = fast_config(transfer_targets=("sip:sales@pbx",))
    session, control = make_session(model, config=config)
    await session.start()
    fake = model.last
    assert fake.profile.tools[1].parameters["properties"]["target"]["enum"] == ["sip:sales@pbx"]
    fake.emit(ToolCallRequested(call_id="x1", name="transfer", arguments='{"target": "+19005551234"}'))
    output = await _output(fake, "x1")
    assert "not allowed" in output["error"]
    assert control.transfers == [] and session.state is CallState.ACTIVE
    await session.aclose()


async def test_hang_up_waits_for_the_agents_audio_to_finish() -> None:
    model = FakeModel()
    session, control = make_session(model)
    await session.start()
    fake = model.last
    fake.emit(ResponseStarted(response_id="r1"), AudioReceived(response_id="r1", item_id="i1", pcm=pcm_ms(100)))
    fake.emit(ToolCallRequested(call_id="h1", name="hang_up", arguments="{}"))
    await wait_event(session, of_type(ToolCallStarted, call_id="h1"))
    await drained(session, fake)
    for _ in range(5):
        assert session.pull_outbound() is not None
    await drained(session, fake)
    assert control.hang_ups == [] and session.state is CallState.ACTIVE, "the response is still running"
    fake.emit(ResponseDone(response_id="r1", status="completed"))
    await drained(session, fake)
    assert session.pull_outbound() is None
    assert await asyncio.wait_for(session.wait_ended(), DEADLINE) == "agent_hang_up"
    await session.aclose()
    assert control.hang_ups == ["agent_hang_up"]
    assert call_tasks() == []


# ----------------------------------------------------------------------------------------------- DTMF


async def test_caller_dtmf_is_recorded_and_forwarded_as_text() -> None:
    model = FakeModel()
    session, _ = make_session(model)
    await session.start()
    fake = model.last
    session.dtmf_received("5", duration_ms=120)
    session.dtmf_received("x")
    event = await wait_event(session, of_type(DtmfReceived))
    assert (event.digit, event.duration_ms, event.forwarded) == ("5", 120, True)
    await fake.wait_sent(lambda s: [e for e in s if e[0] == "create_response"])
    assert fake.of("text") == [("text", "The caller pressed 5 on the keypad.", "user")]
    assert session.transcript[-1].text == "The caller pressed 5 on the keypad."
    assert session.stats().dtmf_digits == 1
    await session.aclose()


async def test_dtmf_forwarding_can_be_turned_off() -> None:
    model = FakeModel()
    session, _ = make_session(model, config=fast_config(forward_dtmf=False))
    await session.start()
    session.dtmf_received("#")
    event = await wait_event(session, of_type(DtmfReceived))
    assert not event.forwarded
    await drained(session, model.last)
    assert model.last.of("text") == [] and session.transcript == ()
    await session.aclose()


async def test_warm_transfer_is_opt_in_and_starts_through_the_call_control() -> None:
    model = FakeModel()
    session, control = make_session(model)
    await session.start()
    assert "warm_transfer" not in {spec.name for spec in model.last.profile.tools}, "a profile must name it"
    await session.aclose()

    model = FakeModel()
    profile = AgentProfile(name="agent", tools=(ToolSpec(name="warm_transfer", description=""),))
    session, control = make_session(model, profile=profile)
    await session.start()
    fake = model.last
    arguments = '{"target": "sales", "summary": "Wants the annual plan."}'
    fake.emit(ToolCallRequested(call_id="w1", name="warm_transfer", arguments=arguments))
    assert await _output(fake, "w1") == {"ok": True, "status": "dialling", "transfer_id": "wt-1", "target": "sales"}
    assert control.warm_transfers == [("sales", "Wants the annual plan.")]
    control.warm_start = WarmTransferStart(status="refused", detail="call c1 is on hold (by the caller)")
    fake.emit(ToolCallRequested(call_id="w2", name="warm_transfer", arguments=arguments))
    assert "on hold" in (await _output(fake, "w2"))["error"]
    fake.emit(ToolCallRequested(call_id="w3", name="warm_transfer", arguments='{"summary": "x"}'))
    assert "needs a target" in (await _output(fake, "w3"))["error"]
    assert session.state is CallState.ACTIVE, "the call goes on: the transfer's outcome comes as a note"
    control.warm_start = WarmTransferStart(status="dialling", transfer_id="wt-2")
    conversation = '{"target": "sales", "summary": "x", "briefing": "conversation"}'
    fake.emit(ToolCallRequested(call_id="w4", name="warm_transfer", arguments=conversation))
    assert (await _output(fake, "w4"))["status"] == "dialling" and control.warm_briefings[-2:] == [None, "conversation"]
    fake.emit(ToolCallRequested(call_id="w5", name="warm_transfer", arguments='{"target": "s", "briefing": "sung"}'))
    assert "spoken or conversation" in (await _output(fake, "w5"))["error"]
    await session.aclose()


async def test_the_briefing_tools_are_opt_in_and_need_a_briefing_call() -> None:
    model = FakeModel()
    session, _ = make_session(model)
    await session.start()
    offered = {spec.name for spec in model.last.profile.tools}
    assert not offered & {"connect_caller", "decline_transfer"}, "only a briefing's profile names them"
    await session.aclose()

    model = FakeModel()
    names = ("connect_caller", "decline_transfer")
    profile = AgentProfile(name="briefing", tools=tuple(ToolSpec(name=name, description="") for name in names))
    session, _ = make_session(model, profile=profile)  # the fake control is no BriefingControl (a caller's call)
    await session.start()
    fake = model.last
    assert [spec.name for spec in fake.profile.tools] == list(names)
    assert fake.profile.tools[1].parameters["required"] == ["reason"]
    fake.emit(ToolCallRequested(call_id="b1", name="connect_caller", arguments="{}"))
    assert "not a warm transfer's briefing" in (await _output(fake, "b1"))["error"]
    await session.aclose()
