"""Process settings of the control plane, read from the environment (pydantic-settings); each field's
description is its documentation (the table in docs/operations.md is generated from it).

Routes, profiles and limits live in the TOML file (:mod:`gateway.control.config`), not here: settings say
how this process runs, the config says what the gateway does.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class InsecureBindError(Exception):
    """A non-loopback bind was requested without GATEWAY_API_TOKEN."""


class ControlSettings(BaseSettings):
    """How the control plane's process runs (the worker reads the token and `GATEWAY_METRICS_PUBLIC` too)."""

    model_config = SettingsConfigDict(env_prefix="GATEWAY_", frozen=True, extra="ignore")

    api_token: SecretStr | None = Field(
        default=None,
        description="Bearer token for `/v1`, `/internal/v1` and `/metrics`, the same on every process of a fleet; "
        "unset: no authentication, and only a loopback bind is allowed.",
    )
    http_host: str = Field(default="127.0.0.1", description="Bind address of the HTTP API, dashboard and phone page.")
    http_port: int = Field(default=8080, ge=0, le=65535, description="Port of the HTTP API.")
    redis_url: str | None = Field(
        default=None, description="`redis://…`: shared state for several control-plane processes; unset: in memory."
    )
    config: str | None = Field(
        default=None,
        description="Routes and profiles TOML file; unset: every number goes to the built-in `echo` profile.",
    )
    metrics_public: bool = Field(
        default=False, description="Serve `/metrics` without the token (control plane and workers)."
    )
    state_dir: Path = Field(
        default=Path("~/.local/state/voice-gateway"),
        description="Where the control plane keeps files it makes: the SQLite database of calls (`calls.db`).",
    )
    database_url: str | None = Field(
        default=None,
        description="The database of calls: `postgresql://USER:PASSWORD@HOST/DB` for a fleet (asyncpg) or "
        "`sqlite:///PATH`; unset: SQLite in `GATEWAY_STATE_DIR`/calls.db. Migrated at start-up.",
    )
    retention_days: float = Field(
        default=90.0,
        ge=0.0,
        description="Records of calls that ended longer ago are deleted (checked hourly); 0 keeps them forever.",
    )
    recordings_dir: Path | None = Field(
        default=None,
        description="Where the workers write call recordings, served by `GET /v1/calls/{id}/recording` and deleted "
        "with their records; the same directory as the workers' (one host, or a volume they share). Unset: "
        "`GATEWAY_STATE_DIR`/recordings.",
    )
    db_write_backlog: int = Field(
        default=10_000,
        ge=1,
        le=1_000_000,
        description="Ended calls held for the database while it is slow or down (retried with backoff); past this "
        "the oldest is dropped, counted in `gateway_db_records_dropped_total`.",
    )

    webhook_secret: SecretStr | None = Field(
        default=None,
        description="Signs the call-time application hook and the event webhooks (Standard Webhooks: "
        "`webhook-signature` is HMAC-SHA256 over id.timestamp.body); `whsec_` + base64 or any string. Unset: "
        "requests go unsigned and a warning is logged once.",
    )
    call_hook_timeout_s: float = Field(
        default=2.0,
        gt=0.0,
        le=4.0,
        description="How long a new call waits for its route's call-time application (the caller hears ringing "
        "meanwhile) before the route's fallback is taken; a route's `application.timeout_s` overrides it. At most "
        "4 s, below the 5 s a worker waits for its admission.",
    )

    @property
    def records_url(self) -> str:
        """The database of calls' URL: ``database_url``, or the SQLite file in the state directory."""
        if self.database_url:
            return self.database_url
        return f"sqlite:///{self.state_dir.expanduser() / 'calls.db'}"

    @property
    def recordings_path(self) -> Path:
        """The recordings directory: ``recordings_dir``, or ``recordings`` in the state directory."""
        given = self.recordings_dir
        return (given if given is not None else self.state_dir / "recordings").expanduser()

    @property
    def token(self) -> str | None:
        value = self.api_token.get_secret_value() if self.api_token is not None else ""
        return value or None


def is_loopback(host: str) -> bool:
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(settings: ControlSettings) -> str:
    """A log line describing the security mode; raises InsecureBindError for a tokenless public bind."""
    if settings.token:
        if settings.metrics_public:
            return "API token required on /v1 and /internal/v1; /metrics is public (GATEWAY_METRICS_PUBLIC)"
        return "API token required on /v1, /internal/v1 and /metrics"
    if not is_loopback(settings.http_host):
        raise InsecureBindError(
            f"refusing to listen on {settings.http_host}:{settings.http_port} without GATEWAY_API_TOKEN: "
            "set a token (e.g. GATEWAY_API_TOKEN=$(openssl rand -hex 32)) or bind 127.0.0.1"
        )
    return (
        f"no GATEWAY_API_TOKEN: authentication is OFF; listening on loopback {settings.http_host} only "
        "(set a token to bind another address)"
    )
