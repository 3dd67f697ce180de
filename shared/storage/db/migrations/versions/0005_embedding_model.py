"""embed: which model made each entry's vector

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01

``embedding_model`` and ``embedding_dimension`` say which embedder made an indexed entry's
vector. Vectors of different models never share a collection (it is named after the model), so
after the deployment's embedder changes, entries whose vector another model made are missing
from the new collection: the embed service and recall detect them with these columns, and
``engram reindex`` re-embeds them. Rows indexed before this revision have NULL: unknown, so they
count as made by another model. The partial index serves that check.
"""
from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "memory_entries",
        sa.Column("embedding_model", sqlmodel.sql.sqltypes.AutoString(length=200), nullable=True),
    )
    op.add_column("memory_entries", sa.Column("embedding_dimension", sa.Integer(), nullable=True))
    op.create_index(
        "ix_memory_entries_embedded_with",
        "memory_entries",
        ["embedding_model", "embedding_dimension"],
        postgresql_where=sa.text("embedding_status = 'indexed'"),
    )


def downgrade() -> None:
    op.drop_index("ix_memory_entries_embedded_with", table_name="memory_entries")
    op.drop_column("memory_entries", "embedding_dimension")
    op.drop_column("memory_entries", "embedding_model")
