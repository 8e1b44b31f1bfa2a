"""Starting a real ``gateway`` process for end-to-end tests, on free loopback ports, bounded in time."""

from __future__ import annotations

import itertools
import sys
from dataclasses import dataclass, field
from typing import Any

import httpx

from tests.support.procs import ManagedProcess, ProcessGroup, free_ports

_RTP_BLOCKS = itertools.count(0)


@dataclass
class GatewayProcess:
    process: ManagedProcess
    sip_port: int
    http_port: int
    token: str
    rtp_range: tuple[int, int]
    env: dict[str, str] = field(default_factory=dict)
    tls_port: int = 0  # GATEWAY_SIP_TLS_PORT (listening when GATEWAY_SIP_TRANSPORTS names tls)

    @property
    def sip_uri(self) -> str:
        return f"sip:agent@127.0.0.1:{self.sip_port}"

    @property
    def tls_uri(self) -> str:
        return f"sip:agent@127.0.0.1:{self.tls_port};transport=tls"

    @property
    def sips_uri(self) -> str:
        return f"sips:agent@127.0.0.1:{self.tls_port}"

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.http, headers={"Authorization": f"Bearer {self.token}"}, timeout=10.0)

    async def api(self, method: str, path: str, **kwargs: Any) -> Any:
        async with self.client() as client:
            response = await client.request(method, path, **kwargs)
            response.raise_for_status()
            return response.json() if response.content else None


async def start_gateway(
    procs: ProcessGroup,
    *,
    command: str = "run",
    env: dict[str, str] | None = None,
    args: list[str] | None = None,
    lifetime: float = 240.0,
    name: str = "gateway",
) -> GatewayProcess:
    sip_port, http_port, tls_port = free_ports(3)
    # RTP from a range above the harness's allocator (12000-31000) and the kernel's ephemeral ports.
    block = next(_RTP_BLOCKS) % 40
    rtp_low = 32000 + block * 200
    token = "test-token-0123456789"
    full_env = {
        "GATEWAY_SIP_PORT": str(sip_port),
        "GATEWAY_SIP_TLS_PORT": str(tls_port),
        "GATEWAY_HTTP_PORT": str(http_port),
        "GATEWAY_RTP_PORTS": f"{rtp_low}-{rtp_low + 199}",
        "GATEWAY_API_TOKEN": token,
        "GATEWAY_PROVIDER": "echo",
        # Each process its own database of calls: a test's history holds its own calls only.
        "GATEWAY_STATE_DIR": str(procs.log_dir / f"{name}-state-{http_port}"),
        "PYTHONUNBUFFERED": "1",
        **(env or {}),
    }
    process = await procs.start(
        name,
        [sys.executable, "-m", "gateway", command, *(args or [])],
        env=full_env,
        lifetime=lifetime,
    )
    await process.wait_for_output(r"gateway: SIP", within=30)
    await process.wait_for_port(http_port, within=30)
    return GatewayProcess(
        process=process,
        sip_port=sip_port,
        http_port=http_port,
        token=token,
        rtp_range=(rtp_low, rtp_low + 199),
        env=full_env,
        tls_port=tls_port,
    )
