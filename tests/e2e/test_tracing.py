"""One trace per call across processes: ``gateway control`` and ``gateway worker`` export their spans over
OTLP/HTTP to a real receiver in the test (decoding ``ExportTraceServiceRequest`` with opentelemetry-proto), while
baresip calls the echo agent. The control plane's admission span and the worker's call spans share one trace id and
carry the call id, which is also the trace id's home in the call record and the worker's log lines."""

from __future__ import annotations

import asyncio
import gzip
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from tests.e2e.test_cluster import TOKEN, Plane, start_worker
from tests.support.baresip import BaresipPhone
from tests.support.peers import require_binary
from tests.support.procs import ProcessGroup, free_ports

pytestmark = [pytest.mark.peer, pytest.mark.timeout(180)]

CONFIG = """
[[routes]]
name = "agents"
did = "*"
profile = "echo"

[profiles.echo]
provider = "echo"
"""


class Receiver:
    """An OTLP/HTTP trace receiver on 127.0.0.1: every span it was sent, as (service, name, attributes, ids)."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.bad_requests = 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = ExportTraceServiceRequest()
                try:
                    request.ParseFromString(body)
                except Exception:
                    receiver.bad_requests += 1
                    self.send_response(400)
                    self.end_headers()
                    return
                receiver.add(request)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: object) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", free_ports(1)[0]), Handler)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def add(self, request: ExportTraceServiceRequest) -> None:
        for resource_spans in request.resource_spans:
            resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    attributes = {a.key: _value(a.value) for a in span.attributes}
                    with self._lock:
                        self.spans.append(
                            {
                                "service": resource.get("service.name", ""),
                                "name": span.name,
                                "trace_id": span.trace_id.hex(),
                                "span_id": span.span_id.hex(),
                                "parent": span.parent_span_id.hex(),
                                "attributes": attributes,
                            }
                        )

    def named(self, name: str) -> list[dict[str, Any]]:
        with self._lock:
            return [span for span in self.spans if span["name"] == name]


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    receiver = Receiver()
    thread = threading.Thread(target=receiver.server.serve_forever, name="otlp-receiver", daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        receiver.server.shutdown()
        receiver.server.server_close()
        thread.join(timeout=5)


async def _until(predicate: Any, *, within: float, what: str) -> Any:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        await asyncio.sleep(0.1)
    raise AssertionError(f"no {what} within {within} s")


async def test_a_call_is_one_trace_across_control_plane_and_worker(
    peer_procs: ProcessGroup, tmp_path: Path, speech_8k: Path, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    require_binary("baresip", package="baresip baresip-core")
    # The processes inherit these (ProcessGroup starts them with the test's environment plus their own).
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    config = tmp_path / "gateway.toml"
    config.write_text(CONFIG)
    port = free_ports(1)[0]
    env = {
        "GATEWAY_API_TOKEN": TOKEN,
        "GATEWAY_HTTP_PORT": str(port),
        "GATEWAY_CONFIG": str(config),
        "GATEWAY_DATABASE_URL": f"sqlite:///{tmp_path / 'calls.db'}",
        "PYTHONUNBUFFERED": "1",
    }
    control = await peer_procs.start("control", [sys.executable, "-m", "gateway", "control"], env=env, lifetime=170)
    await control.wait_for_port(port, within=30)
    plane = Plane(process=control, port=port)
    worker = await start_worker(peer_procs, "worker-t", control=plane)

    phone = BaresipPhone(peer_procs, tmp_path, source_wav=speech_8k, codecs=("pcmu",), tail_silence=1.0)
    async with phone:
        await phone.dial(f"sip:agent@127.0.0.1:{worker.sip_port}")
        await phone.wait_established(within=15)
        await phone.send_dtmf("4")
        await phone.wait_closed(within=40)

    roots = await _until(lambda: receiver.named("call"), within=20, what="worker call span")
    (root,) = roots
    call_id = root["attributes"]["gateway.call.id"]
    trace_id = root["trace_id"]
    admits = await _until(
        lambda: [s for s in receiver.named("control.admit") if s["trace_id"] == trace_id], within=20, what="admission"
    )
    assert admits[0]["service"] == "gateway-control" and admits[0]["attributes"]["gateway.call.id"] == call_id
    assert root["service"] == "gateway-worker" and root["parent"] == ""
    assert root["attributes"]["gateway.call.end_reason"] == "caller_hangup"
    ours = [s for s in receiver.spans if s["trace_id"] == trace_id]
    assert {s["name"] for s in ours} >= {"call", "call.setup", "call.admit", "control.admit", "provider.connect"}
    assert all(s["attributes"]["gateway.call.id"] == call_id for s in ours)
    (worker_admit,) = [s for s in ours if s["name"] == "call.admit"]
    assert admits[0]["parent"] == worker_admit["span_id"], "the plane's span continues the worker's (traceparent)"
    assert receiver.bad_requests == 0

    # The trace id is in the call record and in the worker's log lines about the call.
    async with plane.client() as client:
        record = await _until_record(client, call_id)
    assert record["trace_id"] == trace_id
    assert [(d["digit"], d["direction"]) for d in record["dtmf_events"]] == [("4", "received")]
    log_text = await asyncio.to_thread(worker.process.log_path.read_text)
    assert any(f"call {call_id}" in line and f"trace_id={trace_id}" in line for line in log_text.splitlines())

    # A call the control plane places (POST /v1/calls): its trace starts on the plane, the worker's call continues it.
    bob = BaresipPhone(
        peer_procs, tmp_path, source_wav=speech_8k, name="bob", user="bob", auto_answer=True, tail_silence=20
    )
    async with plane.client() as client, bob:
        response = await client.post("/v1/calls", json={"to": bob.sip_uri, "caller_id": "+15550199"})
        assert response.status_code == 201, response.text
        placed = response.json()["id"]
        await bob.wait_established(within=15)
        assert (await client.post(f"/v1/calls/{placed}/hangup")).status_code == 204
        await bob.wait_closed(within=10)
    (outbound,) = await _until(
        lambda: [s for s in receiver.named("call") if s["attributes"]["gateway.call.id"] == placed],
        within=20,
        what="the placed call's span",
    )
    originate = [s for s in receiver.named("control.originate") if s["trace_id"] == outbound["trace_id"]]
    assert len(originate) == 1 and originate[0]["service"] == "gateway-control"
    assert outbound["parent"] == originate[0]["span_id"] and outbound["trace_id"] != trace_id
    assert originate[0]["attributes"]["gateway.call.id"] == placed


async def _until_record(client: Any, call_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        response = await client.get(f"/v1/calls/{call_id}")
        if response.status_code == 200 and response.json().get("state") == "ended":
            record: dict[str, Any] = response.json()
            return record
        await asyncio.sleep(0.2)
    raise AssertionError(f"call {call_id} has no ended record")
