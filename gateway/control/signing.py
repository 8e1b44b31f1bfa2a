"""Standard Webhooks signatures on the requests the control plane sends: the call-time application hook
and the event webhooks. The `standardwebhooks` package (the scheme's reference library) does the HMAC; this
module only picks the id and the time and shapes the headers, so that both senders sign alike and a receiver
verifies with the same library (docs/operations.md, "Verifying a webhook").
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

__all__ = ["WebhookSigner", "WebhookVerificationError", "new_message_id"]


def new_message_id() -> str:
    """A `webhook-id`: unique per message, kept across retries so a receiver can de-duplicate."""
    return f"msg_{uuid.uuid4().hex}"


@dataclass(frozen=True, slots=True)
class WebhookSigner:
    """Signs bodies with one secret: ``whsec_`` + base64 (the scheme's form) or any other string, used as raw
    bytes so that an operator's `openssl rand -hex 32` works as it is."""

    secret: str

    def __post_init__(self) -> None:
        if not self.secret:
            raise ValueError("a webhook secret may not be empty")

    @property
    def _webhook(self) -> Webhook:
        if self.secret.startswith("whsec_"):
            return Webhook(self.secret)
        return Webhook(self.secret.encode())

    def headers(self, body: bytes, *, msg_id: str | None = None, at: float | None = None) -> dict[str, str]:
        """The three headers for ``body`` sent now (or at ``at``, seconds since the epoch)."""
        msg_id = msg_id or new_message_id()
        stamp = int(time.time() if at is None else at)
        signature = self._webhook.sign(msg_id, datetime.fromtimestamp(stamp, tz=UTC), body)
        return {"webhook-id": msg_id, "webhook-timestamp": str(stamp), "webhook-signature": signature}

    def verify(self, body: bytes, headers: dict[str, str]) -> None:
        """Raise WebhookVerificationError unless ``headers`` sign ``body`` with this secret (tests, receivers)."""
        self._webhook.verify(body, headers, json_parse=False)
