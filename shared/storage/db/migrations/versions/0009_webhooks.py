"""feeds: an organization's webhooks and their deliveries

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03

Two new tables (docs/adr/0102-tenant-feeds.md): ``webhooks`` (one row per registered endpoint,
with its signing secret) and ``webhook_deliveries`` (one row per event and webhook: its state,
attempts and when it is tried next; the due ones are found through a partial index). Nothing
existing changes, so the release before this one runs on a database that has them.
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "webhooks",
        sa.Column("id", sa.Uuid, primary_key=True),
        sa.Column("org_id", sa.Uuid, nullable=False),
        sa.Column("url", sa.Text, nullable=False),
        sa.Column("description", sa.Text),
        sa.Column("events", JSONB),
        sa.Column("secret", sa.Text, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_webhooks_org_id", "webhooks", ["org_id"])
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column(
            "webhook_id", sa.Uuid, sa.ForeignKey("webhooks.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("org_id", sa.Uuid, nullable=False),
        sa.Column("event_id", sa.Uuid, nullable=False),
        sa.Column("event", sa.String(128), nullable=False),
        sa.Column("subject", sa.String(256), nullable=False),
        sa.Column("payload", sa.LargeBinary, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_error", sa.String(300)),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("delivered_at", sa.DateTime(timezone=True)),
        sa.UniqueConstraint("webhook_id", "event_id", name="uq_webhook_deliveries_event"),
    )
    op.create_index(
        "ix_webhook_deliveries_due",
        "webhook_deliveries",
        ["next_attempt_at"],
        postgresql_where=sa.text("state = 'pending'"),
    )


def downgrade() -> None:
    op.drop_table("webhook_deliveries")
    op.drop_table("webhooks")
