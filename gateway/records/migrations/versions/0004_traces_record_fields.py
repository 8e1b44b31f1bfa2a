"""A call's trace id, its handoff count and its DTMF (each digit received or sent, with when).

Revision ID: 0004_traces_record_fields
Revises: 0003_outbox_webhook_outbox
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004_traces_record_fields"
down_revision = "0003_outbox_webhook_outbox"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("calls") as batch:
        batch.add_column(sa.Column("trace_id", sa.String(32), nullable=False, server_default=""))
        batch.add_column(sa.Column("handoffs", sa.Integer, nullable=False, server_default="0"))
        batch.add_column(sa.Column("dtmf_events", sa.JSON, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("calls") as batch:
        batch.drop_column("dtmf_events")
        batch.drop_column("handoffs")
        batch.drop_column("trace_id")
