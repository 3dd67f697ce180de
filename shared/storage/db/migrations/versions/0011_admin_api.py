"""administration of tenants: registered organizations and revoked tokens

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-03

``organizations`` holds what the admin API registers (``engram.admin.org.*``): a name, and when
the organization was disabled — its tokens and platform clients are refused from then on.
``revoked_tokens`` holds the ids (``jti``) of tokens refused before they expire, with that expiry
so a row can be dropped once it no longer matters. Every service reads both at start and follows
``engram.admin.revoked`` after (docs/adr/0104-admin-api.md).
"""
from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "organizations",
        sa.Column("org_id", sa.Uuid(), nullable=False),
        sa.Column("name", sqlmodel.sql.sqltypes.AutoString(length=200), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_by", sqlmodel.sql.sqltypes.AutoString(length=256), nullable=True),
        sa.Column("disabled_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("org_id"),
    )
    op.create_table(
        "revoked_tokens",
        sa.Column("token_id", sqlmodel.sql.sqltypes.AutoString(length=128), nullable=False),
        sa.Column("org_id", sa.Uuid(), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("token_id"),
    )


def downgrade() -> None:
    op.drop_table("revoked_tokens")
    op.drop_table("organizations")
