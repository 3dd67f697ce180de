"""governance: erasure tombstones, merge lineage, expiry index

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30

``erasures`` lets the save path refuse anything derived from input older than a purge or
delete (a replayed session must not bring erased memories back); ``derived_from`` records what
a merge folded together, so erasing a source erases the merge; the partial expiry index serves
the retention sweeper without touching the recall indexes.
"""
from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "erasures",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("org_id", sa.Uuid(), nullable=False),
        sa.Column("agent_config_id", sa.Uuid(), nullable=True),
        sa.Column("owner_key", sqlmodel.sql.sqltypes.AutoString(length=256), nullable=False),
        sa.Column("session_id", sqlmodel.sql.sqltypes.AutoString(length=200), nullable=True),
        sa.Column("fingerprints", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("erased_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("reason", sqlmodel.sql.sqltypes.AutoString(length=32), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_erasures_scope", "erasures", ["org_id", "agent_config_id", "owner_key"])
    op.add_column(
        "memory_entries",
        sa.Column(
            "derived_from",
            postgresql.JSONB(astext_type=sa.Text()),
            nullable=False,
            server_default=sa.text("'[]'::jsonb"),
        ),
    )
    op.create_index(
        "ix_memory_entries_expiry",
        "memory_entries",
        ["expires_at"],
        postgresql_where=sa.text("expires_at IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_memory_entries_expiry", table_name="memory_entries")
    op.drop_column("memory_entries", "derived_from")
    op.drop_index("ix_erasures_scope", table_name="erasures")
    op.drop_table("erasures")
