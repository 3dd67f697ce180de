"""recall: indexes in the order last_k and importance read

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30

The recall benchmark at 100k entries showed last_k and importance sorting every visible row
(≈110k) per call: ``(org, agent config, owner_key, created_at)`` cannot serve
``ORDER BY pinned DESC, created_at DESC`` across several owner keys. These indexes can: Postgres
walks them in order and stops after top_k rows that pass the owner and lifecycle filters.
"""
from collections.abc import Sequence

from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_memory_entries_newest",
        "memory_entries",
        ["org_id", "agent_config_id", "pinned", "created_at"],
    )
    op.create_index(
        "ix_memory_entries_important",
        "memory_entries",
        ["org_id", "agent_config_id", "pinned", "importance", "created_at"],
    )


def downgrade() -> None:
    op.drop_index("ix_memory_entries_important", table_name="memory_entries")
    op.drop_index("ix_memory_entries_newest", table_name="memory_entries")
