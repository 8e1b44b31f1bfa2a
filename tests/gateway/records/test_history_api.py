"""``GET /v1/calls`` as the history (filters, cursor pagination, sort), ``GET /v1/calls/{id}`` with the transcript,
``GET /v1/calls/export`` as CSV and JSON lines, and 422s with reasons — over a real database on each engine."""

from __future__ import annotations

import csv
import io
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import pytest
from fastapi import FastAPI

from gateway.control.app import create_app
from gateway.control.plane import ControlPlane
from gateway.control.settings import ControlSettings
from gateway.fleet.models import CallSnapshot, WorkerEvent
from gateway.records.history import write_records
from tests.gateway.control.conftest import AUTH, TOKEN, make_config
from tests.gateway.records.conftest import ended_call

T0 = 1_767_225_600.0


@dataclass
class History:
    app: FastAPI
    plane: ControlPlane
    client: httpx.AsyncClient

    async def get(self, path: str, **params: Any) -> Any:
        response = await self.client.get(path, params=params)
        assert response.status_code == 200, response.text
        return response.json()

    async def ids(self, **params: Any) -> list[str]:
        return [item["id"] for item in (await self.get("/v1/calls", **params))["items"]]


def _calls() -> list[tuple[CallSnapshot, str]]:
    """Twelve ended calls a minute apart; every third outbound, every fourth to sales, varied lengths and ends;
    the outbound through carrier_b, the odd inbound from carrier_a, the rest from no trunk."""
    calls = []
    for n in range(12):
        sales = n % 4 == 0
        trunk = "carrier_b" if n % 3 == 0 else ("carrier_a" if n % 2 else None)
        calls.append(
            (
                ended_call(
                    f"c-{n:02d}",
                    started=T0 + 60 * n,
                    duration_s=10.0 + (n * 7) % 12,
                    caller=f"+1555010{n % 10}",
                    called="+15550201" if sales else "+15550199",
                    route="sales" if sales else "support",
                    worker="worker-b" if n % 2 else "worker-a",
                    direction="outbound" if n % 3 == 0 else "inbound",
                    end_reason="agent_hangup" if n % 5 == 0 else "caller_hangup",
                    said=f"My parcel number {n} never came" if n in (3, 7) else "Just checking my balance",
                    trunk=trunk,
                ),
                "sales" if sales else "support",
            )
        )
    return calls


@pytest.fixture
async def history(database_url: str) -> AsyncIterator[History]:
    settings = ControlSettings(api_token=TOKEN, database_url=database_url, retention_days=0)
    app = create_app(settings, config=make_config(), sweeper=False)
    async with app.router.lifespan_context(app):
        plane: ControlPlane = app.state.plane
        await write_records(app.state.history.database, _calls(), now=T0 + 3600)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://control.test", headers=AUTH) as client:
            yield History(app=app, plane=plane, client=client)


async def test_filters_pick_the_calls_they_name(history: History) -> None:
    assert await history.ids(limit=500) == [f"c-{n:02d}" for n in reversed(range(12))]
    assert await history.ids(since=T0 + 600, until=T0 + 721) == ["c-11", "c-10"]
    assert await history.ids(number="0201", sort="started") == ["c-00", "c-04", "c-08"]
    assert await history.ids(number="+15550107") == ["c-07"]
    assert await history.ids(direction="outbound", sort="started") == ["c-00", "c-03", "c-06", "c-09"]
    assert await history.ids(end_reason="agent_hangup", sort="started") == ["c-00", "c-05", "c-10"]
    assert await history.ids(profile="sales", sort="started") == ["c-00", "c-04", "c-08"]
    assert await history.ids(worker="worker-b", direction="inbound", sort="started") == ["c-01", "c-05", "c-07", "c-11"]
    assert await history.ids(text="PARCEL NUMBER", sort="started") == ["c-03", "c-07"]
    assert await history.ids(text="100%") == []  # LIKE's wildcards are matched as text
    assert await history.ids(trunk="carrier_b", sort="started") == ["c-00", "c-03", "c-06", "c-09"]
    assert await history.ids(trunk="carrier_a", direction="inbound", sort="started") == ["c-01", "c-05", "c-07", "c-11"]
    assert await history.ids(trunk="carrier_c") == []
    assert (await history.get("/v1/calls/c-02"))["trunk"] is None
    page = await history.get("/v1/calls", profile="support", state="ended")
    assert page["total"] == 9 and all(item["transcript"] == [] for item in page["items"])


async def test_pages_follow_the_cursor_in_each_sort(history: History) -> None:
    for sort in ("-started", "started", "duration", "-duration"):
        seen: list[str] = []
        cursor = None
        pages = 0
        while True:
            params: dict[str, Any] = {"limit": 5, "sort": sort}
            if cursor:
                params["cursor"] = cursor
            page = await history.get("/v1/calls", **params)
            assert page["total"] == 12
            seen += [item["id"] for item in page["items"]]
            pages += 1
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert pages == 3 and sorted(seen) == [f"c-{n:02d}" for n in range(12)]
        whole = await history.get("/v1/calls", sort=sort, limit=500)
        assert seen == [item["id"] for item in whole["items"]]
        key = "duration_s" if "duration" in sort else "started"
        values = [(item[key], item["id"]) for item in whole["items"]]
        assert values == sorted(values, reverse=sort.startswith("-"))


async def test_a_live_call_and_the_history_share_one_list(history: History) -> None:
    live = CallSnapshot.model_validate(
        {"id": "c-live", "from": "+15550142", "to": "+15550199", "route": "support", "state": "active",
         "started": T0 + 7200, "worker": "worker-a", "trunk": "carrier_a"}
    )  # fmt: skip
    await history.plane.report([WorkerEvent(type="call.started", worker="worker-a", time=T0 + 7200, call=live)])
    assert (await history.ids(limit=2)) == ["c-live", "c-11"]
    assert await history.ids(live=True) == ["c-live"]
    assert "c-live" not in await history.ids(live=False, limit=500)
    assert await history.ids(trunk="carrier_a", limit=2) == ["c-live", "c-11"]
    assert await history.ids(trunk="carrier_b", live=True) == []
    one = await history.get("/v1/calls/c-live")
    assert one["state"] == "active" and one["profile"] == "support" and one["trunk"] == "carrier_a"
    ended = live.model_copy(update={"state": "ended", "ended": T0 + 7260, "end_reason": "caller_hangup"})
    await history.plane.report([WorkerEvent(type="call.ended", worker="worker-a", time=T0 + 7260, call=ended)])
    assert await history.app.state.history.writer.flush(10)
    page = await history.get("/v1/calls", number="0142")
    assert [item["id"] for item in page["items"]] == ["c-live"] and page["total"] == 1
    assert page["items"][0]["state"] == "ended"
    assert await history.ids(trunk="carrier_a", limit=2) == ["c-live", "c-11"]  # now a record: the SQL filter


async def test_one_call_comes_whole_with_its_transcript(history: History) -> None:
    call = await history.get("/v1/calls/c-07")
    assert call["state"] == "ended" and call["profile"] == "support" and call["from"] == "+15550107"
    assert [line["role"] for line in call["transcript"]] == ["assistant", "user", "assistant"]
    assert call["transcript"][1] == {
        "role": "user", "text": "My parcel number 7 never came", "start_s": 2.4, "end_s": 4.8, "truncated": False
    }  # fmt: skip
    assert call["tools"][0]["name"] == "order_status" and call["tools"][0]["result"] == '{"status": "shipped"}'
    missing = await history.client.get("/v1/calls/c-nope")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "call_not_found"


async def test_exports_stream_every_matching_call(history: History) -> None:
    response = await history.client.get("/v1/calls/export", params={"format": "csv", "sort": "started"})
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(response.text)))
    assert [row["id"] for row in rows] == [f"c-{n:02d}" for n in range(12)]
    assert rows[7]["from"] == "+15550107" and rows[7]["mos"] == "4.31" and rows[7]["dtmf"] == "12#"
    assert [row["trunk"] for row in rows[:3]] == ["carrier_b", "carrier_a", ""]
    response = await history.client.get("/v1/calls/export", params={"format": "jsonl", "text": "parcel"})
    assert response.headers["content-type"] == "application/x-ndjson"
    lines = [orjson.loads(line) for line in response.content.splitlines()]
    assert [line["id"] for line in lines] == ["c-07", "c-03"] and lines[0]["stats"]["barge_ins"] == 2


@pytest.mark.parametrize(
    ("params", "code", "reason"),
    [
        ({"sort": "loudness"}, "validation_error", "sort"),
        ({"direction": "sideways"}, "validation_error", "direction"),
        ({"since": "yesterday"}, "validation_error", "since"),
        ({"since": T0 + 10, "until": T0}, "invalid_time_range", "must be after since"),
        ({"cursor": "not-a-cursor"}, "invalid_cursor", "not one this API returned"),
        ({"limit": 0}, "validation_error", "limit"),
        ({"text": ""}, "validation_error", "text"),
        ({"trunk": ""}, "validation_error", "trunk"),
    ],
)
async def test_bad_query_parameters_get_a_422_with_a_reason(
    history: History, params: dict[str, Any], code: str, reason: str
) -> None:
    for path in ("/v1/calls", "/v1/calls/export"):
        if path.endswith("export") and "cursor" in params:
            continue
        if path.endswith("export") and "limit" in params:
            continue
        response = await history.client.get(path, params=params)
        assert response.status_code == 422, (path, response.text)
        error = response.json()["error"]
        assert error["code"] == code and reason in error["message"], error


async def test_a_cursor_of_another_sort_is_refused(history: History) -> None:
    page = await history.get("/v1/calls", limit=2, sort="duration")
    response = await history.client.get("/v1/calls", params={"cursor": page["next_cursor"], "sort": "-started"})
    assert response.status_code == 422 and "sort=duration" in response.json()["error"]["message"]
    bad = await history.client.get("/v1/calls/export", params={"format": "xml"})
    assert bad.status_code == 422 and "format" in bad.json()["error"]["message"]
