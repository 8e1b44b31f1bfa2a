"""A call's warm transfer to a human (both legs, how it went) as JSON.

Revision ID: 0008_warm_call_transfer
Revises: 0007_amd_call_amd
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008_warm_call_transfer"
down_revision = "0007_amd_call_amd"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("calls") as batch:
        batch.add_column(sa.Column("transfer", sa.JSON, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("calls") as batch:
        batch.drop_column("transfer")
