"""The event webhooks' outbox: one row per event and endpoint, with its delivery state.

Revision ID: 0003_outbox_webhook_outbox
Revises: 0002_transcripts
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003_outbox_webhook_outbox"
down_revision = "0002_transcripts"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "webhook_outbox",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("msg_id", sa.String(64), nullable=False, unique=True),
        sa.Column("endpoint", sa.String(64), nullable=False),
        sa.Column("call_id", sa.String(128), nullable=False),
        sa.Column("event_type", sa.String(64), nullable=False),
        sa.Column("dedupe_key", sa.String(192), nullable=False),
        sa.Column("body", sa.Text, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("created_at", sa.Double, nullable=False),
        sa.Column("next_attempt_at", sa.Double, nullable=True),
        sa.Column("last_attempt_at", sa.Double, nullable=True),
        sa.Column("delivered_at", sa.Double, nullable=True),
        sa.Column("last_status_code", sa.Integer, nullable=True),
        sa.Column("last_error", sa.String(512), nullable=False),
        sa.UniqueConstraint("endpoint", "call_id", "dedupe_key", name="uq_webhook_outbox_event"),
    )
    op.create_index("ix_webhook_outbox_due", "webhook_outbox", ["status", "next_attempt_at"])
    op.create_index("ix_webhook_outbox_stream", "webhook_outbox", ["endpoint", "call_id", "status", "id"])


def downgrade() -> None:
    op.drop_table("webhook_outbox")
