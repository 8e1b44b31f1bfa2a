"""A private redis-server answers on loopback and keeps nothing on disk."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis.asyncio as aioredis

from tests.support.peers import require_binary
from tests.support.procs import ProcessGroup
from tests.support.redis import RedisServer

pytestmark = [pytest.mark.peer, pytest.mark.timeout(30)]


async def test_redis_server_answers_ping_and_stores_values(peer_procs: ProcessGroup, tmp_path: Path) -> None:
    require_binary("redis-server")
    async with RedisServer(peer_procs, tmp_path) as server:
        client = aioredis.Redis.from_url(server.url)
        try:
            assert await client.ping() is True
            await client.set("calls:active", 3)
            assert await client.get("calls:active") == b"3"
            config = await client.config_get("save")
            assert config["save"] == ""
        finally:
            await client.aclose()
        assert server.process is not None
        pid = server.process.pid
    assert server.process.returncode is not None, f"redis-server pid {pid} still running"
    assert list(server.dir.iterdir()) == []
