"""entries: validity of knowledge that changed (valid_from, valid_until)

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03

A new entry that updates or contradicts an older one of the same owner supersedes it
(docs/adr/0103-knowledge-updates.md): the old one gets ``valid_until`` (when the new one was
saved) and the new one ``valid_from``. Both are nullable and stay NULL for the rows already there:
nothing is known about when their knowledge started or stopped being true, and nothing is made up
(docs/adr/0086-upgrades-forward-only.md). ``valid_until`` also tells a knowledge update from an
``edit`` version (both are ``superseded``): erasing an entry takes its edit versions with it, not
the knowledge it replaced. Partial indexes on the two links: an erasure clears the links that
pointed at what it erased, and looks up lineage by them.
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("memory_entries", sa.Column("valid_from", sa.DateTime(timezone=True), nullable=True))
    op.add_column("memory_entries", sa.Column("valid_until", sa.DateTime(timezone=True), nullable=True))
    for column in ("supersedes", "superseded_by"):
        op.create_index(
            f"ix_memory_entries_{column}",
            "memory_entries",
            [column],
            postgresql_where=sa.text(f"{column} IS NOT NULL"),
        )


def downgrade() -> None:
    op.drop_index("ix_memory_entries_superseded_by", table_name="memory_entries")
    op.drop_index("ix_memory_entries_supersedes", table_name="memory_entries")
    op.drop_column("memory_entries", "valid_until")
    op.drop_column("memory_entries", "valid_from")
