"""A call's handoffs between agent profiles, as JSON on its row.

Revision ID: 0004_handoff_handoffs
Revises: 0003_outbox_webhook_outbox
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004_handoff_handoffs"
down_revision = "0003_outbox_webhook_outbox"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("calls") as batch:
        batch.add_column(sa.Column("handoffs", sa.JSON, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("calls") as batch:
        batch.drop_column("handoffs")
