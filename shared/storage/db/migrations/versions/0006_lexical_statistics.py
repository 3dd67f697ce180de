"""recall: per-owner term statistics for hybrid's lexical leg in the vector store

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01

hybrid's lexical leg is a sparse-vector search in the vector store (shared/text/lexical.py): each
entry's vector carries its BM25 term-frequency part, the cue's carries each term's IDF. IDF needs
document frequencies within what the caller may see, so Postgres keeps them per owner scope:

- ``lexical_scopes``: active entries and their summed length (distinct lexemes, as
  ``length(search)``) per (organization, agent config, owner key) — N and avgdl;
- ``lexical_terms``: active entries containing each lexeme, per the same scope — n(t).

Statement-level triggers with transition tables keep both in step with ``memory_entries`` in the
writer's own transaction (insert, delete — every erasure path —, and updates that change an
entry's lexemes, owner or whether it is active). Rows whose count reaches zero are deleted, so an
erased entry's words do not linger here. Lock order is sorted by key, so concurrent single-statement
writers wait for each other instead of deadlocking.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: One statement per blank-line-separated block (asyncpg prepares each statement on its own).
_DELTA = """
CREATE TYPE lexical_delta AS (org_id uuid, agent_config_id uuid, owner_key varchar, search tsvector, sign int);

CREATE FUNCTION lexical_apply(deltas lexical_delta[]) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF deltas IS NULL OR cardinality(deltas) = 0 THEN
        RETURN;
    END IF;
    INSERT INTO lexical_scopes AS s (org_id, agent_config_id, owner_key, docs, lexemes)
    SELECT d.org_id, d.agent_config_id, d.owner_key, sum(d.sign), sum(d.sign * length(d.search))
    FROM unnest(deltas) d
    GROUP BY 1, 2, 3
    ORDER BY 1, 2, 3
    ON CONFLICT (org_id, agent_config_id, owner_key)
    DO UPDATE SET docs = s.docs + excluded.docs, lexemes = s.lexemes + excluded.lexemes;
    INSERT INTO lexical_terms AS t (org_id, agent_config_id, lexeme, owner_key, docs)
    SELECT d.org_id, d.agent_config_id, u.lexeme, d.owner_key, sum(d.sign)
    FROM unnest(deltas) d, unnest(d.search) u
    GROUP BY 1, 2, 3, 4
    ORDER BY 1, 2, 3, 4
    ON CONFLICT (org_id, agent_config_id, lexeme, owner_key)
    DO UPDATE SET docs = t.docs + excluded.docs;
    IF EXISTS (SELECT 1 FROM unnest(deltas) d WHERE d.sign < 0) THEN
        DELETE FROM lexical_terms t
        USING (SELECT DISTINCT d.org_id, d.agent_config_id, u.lexeme, d.owner_key
               FROM unnest(deltas) d, unnest(d.search) u WHERE d.sign < 0) g
        WHERE t.org_id = g.org_id AND t.agent_config_id = g.agent_config_id
          AND t.lexeme = g.lexeme AND t.owner_key = g.owner_key AND t.docs <= 0;
        DELETE FROM lexical_scopes s
        USING (SELECT DISTINCT d.org_id, d.agent_config_id, d.owner_key
               FROM unnest(deltas) d WHERE d.sign < 0) g
        WHERE s.org_id = g.org_id AND s.agent_config_id = g.agent_config_id
          AND s.owner_key = g.owner_key AND s.docs <= 0;
    END IF;
END $$;

CREATE FUNCTION lexical_on_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM lexical_apply(ARRAY(
        SELECT ROW(n.org_id, n.agent_config_id, n.owner_key, n.search, 1)::lexical_delta
        FROM new_rows n WHERE n.lifecycle = 'active'));
    RETURN NULL;
END $$;

CREATE FUNCTION lexical_on_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM lexical_apply(ARRAY(
        SELECT ROW(o.org_id, o.agent_config_id, o.owner_key, o.search, -1)::lexical_delta
        FROM old_rows o WHERE o.lifecycle = 'active'));
    RETURN NULL;
END $$;

-- Most updates (access counts, embedding status) change nothing counted: the join finds no row.
CREATE FUNCTION lexical_on_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM lexical_apply(ARRAY(
        SELECT ROW(x.org_id, x.agent_config_id, x.owner_key, x.search, x.sign)::lexical_delta
        FROM (
            SELECT o.org_id, o.agent_config_id, o.owner_key, o.search, -1 AS sign
            FROM old_rows o JOIN new_rows n ON n.id = o.id
            WHERE o.lifecycle = 'active' AND (
                n.lifecycle <> 'active' OR n.owner_key <> o.owner_key OR n.org_id <> o.org_id
                OR n.agent_config_id <> o.agent_config_id OR n.search IS DISTINCT FROM o.search)
            UNION ALL
            SELECT n.org_id, n.agent_config_id, n.owner_key, n.search, 1 AS sign
            FROM new_rows n JOIN old_rows o ON o.id = n.id
            WHERE n.lifecycle = 'active' AND (
                o.lifecycle <> 'active' OR n.owner_key <> o.owner_key OR n.org_id <> o.org_id
                OR n.agent_config_id <> o.agent_config_id OR n.search IS DISTINCT FROM o.search)
        ) x));
    RETURN NULL;
END $$;

CREATE TRIGGER memory_entries_lexical_insert AFTER INSERT ON memory_entries
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION lexical_on_insert();

CREATE TRIGGER memory_entries_lexical_delete AFTER DELETE ON memory_entries
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION lexical_on_delete();

CREATE TRIGGER memory_entries_lexical_update AFTER UPDATE ON memory_entries
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT
    EXECUTE FUNCTION lexical_on_update();
"""


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE lexical_scopes (
            org_id uuid NOT NULL,
            agent_config_id uuid NOT NULL,
            owner_key varchar(256) NOT NULL,
            docs bigint NOT NULL,
            lexemes bigint NOT NULL,
            PRIMARY KEY (org_id, agent_config_id, owner_key)
        )
        """
    )
    op.execute(
        """
        CREATE TABLE lexical_terms (
            org_id uuid NOT NULL,
            agent_config_id uuid NOT NULL,
            lexeme text NOT NULL,
            owner_key varchar(256) NOT NULL,
            docs bigint NOT NULL,
            PRIMARY KEY (org_id, agent_config_id, lexeme, owner_key)
        )
        """
    )
    for statement in _DELTA.split("\n\n"):
        if statement.strip():
            op.execute(statement)
    # What is there already.
    op.execute(
        """
        INSERT INTO lexical_scopes (org_id, agent_config_id, owner_key, docs, lexemes)
        SELECT org_id, agent_config_id, owner_key, count(*), sum(length(search))
        FROM memory_entries WHERE lifecycle = 'active' GROUP BY 1, 2, 3
        """
    )
    op.execute(
        """
        INSERT INTO lexical_terms (org_id, agent_config_id, lexeme, owner_key, docs)
        SELECT e.org_id, e.agent_config_id, u.lexeme, e.owner_key, count(*)
        FROM memory_entries e, unnest(e.search) u WHERE e.lifecycle = 'active' GROUP BY 1, 2, 3, 4
        """
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER memory_entries_lexical_update ON memory_entries")
    op.execute("DROP TRIGGER memory_entries_lexical_delete ON memory_entries")
    op.execute("DROP TRIGGER memory_entries_lexical_insert ON memory_entries")
    op.execute("DROP FUNCTION lexical_on_update, lexical_on_delete, lexical_on_insert")
    op.execute("DROP FUNCTION lexical_apply")
    op.execute("DROP TYPE lexical_delta")
    op.execute("DROP TABLE lexical_terms")
    op.execute("DROP TABLE lexical_scopes")
