"""redis-server for tests: 127.0.0.1 on a free port, no persistence, in its own temp dir, stopped by PID."""

from __future__ import annotations

from pathlib import Path

from tests.support.procs import ManagedProcess, ProcessGroup, free_ports

__all__ = ["RedisServer"]


class RedisServer:
    """`async with RedisServer(procs, tmp_path) as redis: redis.url` -> redis://127.0.0.1:PORT/0."""

    def __init__(self, procs: ProcessGroup, workdir: Path, *, name: str = "redis", lifetime: float = 120.0) -> None:
        self.name = name
        self.port = free_ports(1)[0]
        self.dir = Path(workdir) / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.lifetime = lifetime
        self.process: ManagedProcess | None = None
        self._procs = procs

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def start(self, *, within: float = 10.0) -> RedisServer:
        argv = [
            "redis-server",
            "--bind",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--dir",
            str(self.dir),
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--protected-mode",
            "yes",
            "--logfile",
            "",
        ]
        self.process = await self._procs.start(self.name, argv, lifetime=self.lifetime)
        await self.process.wait_for_output(r"Ready to accept connections", within=within)
        return self

    async def __aenter__(self) -> RedisServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self.process is not None:
            await self.process.terminate()
