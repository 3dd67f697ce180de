"""memory entries: when they happened and where in their session they stand

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02

- ``occurred_at``: when what the entry records happened, as its writer said (a session's time,
  a conversation turn's date); NULL when the writer did not say (``created_at`` is when Engram
  stored it).
- ``session_position``: the entry's place in its session: entries saved with a ``session_id``
  take numbers from one sequence in the order they were saved (within a request, the order of
  its entries), so within one session a smaller number was saved earlier. Gaps mean nothing;
  only the order does. NULL for entries saved without a session (and those stored before this
  revision). Recall's neighbourhood reads the entries next to a hit in its session through the
  partial index.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("memory_entries", sa.Column("occurred_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("memory_entries", sa.Column("session_position", sa.BigInteger(), nullable=True))
    op.execute("CREATE SEQUENCE memory_entry_session_position AS bigint")
    op.create_index(
        "ix_memory_entries_session_position",
        "memory_entries",
        ["org_id", "agent_config_id", "owner_key", "session_id", "session_position"],
        postgresql_where=sa.text("session_position IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_memory_entries_session_position", table_name="memory_entries")
    op.execute("DROP SEQUENCE memory_entry_session_position")
    op.drop_column("memory_entries", "session_position")
    op.drop_column("memory_entries", "occurred_at")
