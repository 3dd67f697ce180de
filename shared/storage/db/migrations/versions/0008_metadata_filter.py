"""governance: a GIN index for memory.list's metadata filter

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03

``memory.list`` takes ``metadata``: only entries whose metadata contains that object
(``metadata @> :filter``). LangGraph's ``EngramStore`` reads an item by its namespace and key that
way, so a get costs the same in a store of 100 items or 5,000. ``jsonb_path_ops`` serves exactly
``@>`` and is a fraction of the default operator class's size; entries without metadata (``{}``)
add nothing to it. Postgres combines it with the scope indexes (org, agent config, owner) or
walks those alone, whichever its statistics say is cheaper.
"""
from collections.abc import Sequence

from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_memory_entries_metadata",
        "memory_entries",
        ["metadata"],
        postgresql_using="gin",
        postgresql_ops={"metadata": "jsonb_path_ops"},
    )


def downgrade() -> None:
    op.drop_index("ix_memory_entries_metadata", table_name="memory_entries")
