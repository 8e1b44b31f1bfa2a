"""Trunks: the ``[trunks.<name>]`` tables of the routes file (``GATEWAY_CONFIG``), as data both planes read.

The control plane checks ``routes[].trunk`` and an originate's ``trunk`` against these names
(gateway/control/config.py); each worker reads the same tables at start-up and resolves them into what its SIP
endpoint uses (gateway/worker/trunk_config.py): where calls to numbers go, the credentials answering the
trunk's challenges, one registration per trunk with ``register = true``, and which callers belong to the trunk
(``sources``) and what they must answer our challenge with (``inbound_credentials``).

The single-trunk settings (``GATEWAY_TRUNK``, ``GATEWAY_TRUNK_USER``, ...) are the trunk named ``default``
(:data:`DEFAULT_TRUNK`); docs/operations.md, "Trunks". Passwords are ``SecretStr``: never logged, never shown.
"""

from __future__ import annotations

import ipaddress
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

DEFAULT_TRUNK = "default"
TRUNK_NAME = r"^[A-Za-z0-9._-]{1,64}$"
TrunkTransport = Literal["udp", "tcp", "tls"]
_CODECS = {"pcmu": "PCMU", "pcma": "PCMA", "opus": "opus", "g722": "G722"}


class InboundCredential(BaseModel):
    """``{ user = "...", password = "..." }``: a digest user callers from the trunk may answer with."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    user: str = Field(min_length=1, max_length=128, pattern=r"^[^\s\"\\:]+$")
    password: SecretStr = Field(min_length=1, repr=False)


class TrunkConfig(BaseModel):
    """One ``[trunks.<name>]`` table. Every key is optional; what a trunk is used for decides which it needs."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    address: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="host or host:port: a number called through the trunk goes to sip:<number>@<address>",
    )
    transport: TrunkTransport | None = Field(
        default=None, description="udp, tcp or tls for the calls and REGISTERs to the trunk (unset: as the URI says)"
    )
    outbound_proxy: str | None = Field(
        default=None, max_length=512, description="SBC the trunk's calls and REGISTERs go through (SIP URI or host)"
    )
    user: str | None = Field(default=None, min_length=1, max_length=128, description="Digest user for its 401/407")
    password: SecretStr | None = Field(default=None, repr=False, description="Digest password of user")
    registers: bool = Field(
        default=False, alias="register", description="Register the worker's contact at the trunk's registrar"
    )
    registrar: str | None = Field(default=None, max_length=512, description="Registrar URI; unset: sip:<address>")
    aor: str | None = Field(default=None, max_length=512, description="AOR; unset: sip:<user>@<registrar host>")
    expires_s: int = Field(default=3600, ge=1, le=2**31 - 1, description="Registration lifetime asked for")
    sources: list[str] = Field(
        default_factory=list, max_length=256, description="CIDRs the trunk's calls come from (a call is its trunk's)"
    )
    codecs: list[str] = Field(
        default_factory=list, max_length=8, description="Codecs of its calls, in our order; empty: GATEWAY_CODECS"
    )
    inbound_credentials: list[InboundCredential] = Field(
        default_factory=list,
        max_length=256,
        description="Users callers from sources must authenticate as (digest); empty: its sources are trusted",
    )

    @field_validator("outbound_proxy", "registrar", "aor", "address")
    @classmethod
    def _stripped(cls, value: str | None) -> str | None:
        return value.strip() or None if value is not None else None

    @field_validator("sources")
    @classmethod
    def _networks(cls, value: list[str]) -> list[str]:
        for cidr in value:
            try:
                ipaddress.ip_network(cidr, strict=False)
            except ValueError as exc:
                raise ValueError(f"{cidr!r} is not a network (CIDR): {exc}") from None
        return value

    @field_validator("codecs")
    @classmethod
    def _known_codecs(cls, value: list[str]) -> list[str]:
        unknown = [v for v in value if v.lower() not in _CODECS]
        if unknown:
            raise ValueError(f"unknown codec {unknown[0]!r}; choose from G722, PCMU, PCMA, opus")
        return list(dict.fromkeys(_CODECS[v.lower()] for v in value))

    @model_validator(mode="after")
    def _consistent(self) -> TrunkConfig:
        users = [credential.user for credential in self.inbound_credentials]
        duplicates = sorted({user for user in users if users.count(user) > 1})
        if duplicates:
            raise ValueError(f"inbound_credentials: duplicate user {duplicates[0]!r}")
        if self.inbound_credentials and not self.sources:
            raise ValueError("inbound_credentials need sources (the CIDRs that pick this trunk for a call)")
        return self


class TrunksSection(BaseModel):
    """The ``trunks`` table alone of a routes file (a worker reads nothing else of it)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    trunks: dict[str, TrunkConfig] = Field(default_factory=dict)

    @field_validator("trunks")
    @classmethod
    def _names(cls, value: dict[str, TrunkConfig]) -> dict[str, TrunkConfig]:
        import re

        bad = [name for name in value if not re.fullmatch(TRUNK_NAME, name)]
        if bad:
            raise ValueError(f"trunk name {bad[0]!r} must be 1-64 of letters, digits, '._-'")
        return value
