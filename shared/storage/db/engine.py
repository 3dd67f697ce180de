"""The async engine, transactions, and migrations."""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

import asyncpg
from alembic import command
from alembic.config import Config
from sqlalchemy import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine

from shared.storage.db.compiled import Compiled

__all__ = ["CommitHook", "Database", "async_url", "known_revision", "migrate"]

#: Called with a committed session's ``info`` (what its writers noted there, e.g. that it wrote
#: outbox rows): side effects of a commit that no writer should have to remember.
CommitHook = Callable[[Mapping[str, object]], None]

_MIGRATIONS = Path(__file__).parent / "migrations"


def async_url(url: str) -> str:
    """Accept ``postgresql://`` (what people paste) and use the asyncpg driver."""
    for prefix in ("postgresql+asyncpg://", "postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+asyncpg://" + url[len(prefix) :]
    raise ValueError(f"ENGRAM_DATABASE_URL must be a postgresql:// URL, got {url.split(':', 1)[0]}://…")


class Database:
    """One engine per process; ``transaction()`` is the only way code writes."""

    def __init__(
        self, url: str, *, pool_size: int = 20, tls: ssl.SSLContext | None = None, hot_pool_size: int = 8
    ) -> None:
        self.url = async_url(url)
        # asyncpg prepares statements, and after five runs Postgres may switch a prepared
        # statement to a generic plan that ignores the values: measured at 100k entries, a
        # 20-id lookup went from 2 ms to 130 ms. Recall's queries are value-sensitive, so
        # plan each execution for its values.
        connect_args: dict[str, object] = {"server_settings": {"plan_cache_mode": "force_custom_plan"}}
        if tls is not None:  # asyncpg takes the context as is (shared.security.tls.client_tls_context)
            connect_args["ssl"] = tls
        # A fixed pool, no overflow: under load, handlers wait for a connection instead of
        # opening and closing extra ones per message. No pre-ping either (a round trip on every
        # checkout); a dead connection fails its statement, the message is redelivered, and the
        # pool replaces the connection.
        self.engine: AsyncEngine = create_async_engine(
            self.url,
            pool_size=pool_size,
            max_overflow=0,
            pool_recycle=1800,
            pool_timeout=60,
            connect_args=connect_args,
        )
        self._sessions = async_sessionmaker(self.engine, expire_on_commit=False)
        self._reads = async_sessionmaker(
            self.engine.execution_options(isolation_level="AUTOCOMMIT"), expire_on_commit=False
        )
        self._commit_hooks: list[CommitHook] = []
        self._connect_args = connect_args
        self._hot_pool_size = hot_pool_size
        self._hot: asyncpg.Pool | None = None
        self._hot_lock = asyncio.Lock()

    def on_commit(self, hook: CommitHook) -> None:
        """Run ``hook`` after every :meth:`transaction` that commits (never after a rollback).
        The outbox relay wakes itself this way (``shared.storage.outbox``), instead of each writer waking
        it by hand after its commit. Hooks run on the event loop and must not block or raise."""
        self._commit_hooks.append(hook)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncSession]:
        """A session inside one transaction: committed on success, rolled back on any error;
        the commit hooks run after the commit."""
        async with self._sessions() as session:
            async with session.begin():
                yield session
            for hook in self._commit_hooks:
                hook(session.info)

    @asynccontextmanager
    async def read(self) -> AsyncIterator[AsyncSession]:
        """A session for reading only, outside a transaction: each statement runs on its own,
        without the ``BEGIN`` and ``ROLLBACK`` round trips a transaction costs around it. Under
        Postgres' READ COMMITTED each statement takes its own snapshot either way, so statements
        read together see nothing less consistent than they did inside a transaction."""
        async with self._reads() as session:
            yield session

    async def fetch(self, statement: Compiled, values: Mapping[str, object]) -> list[asyncpg.Record]:
        """The rows of a compiled read (``shared.storage.db.compiled``), outside a transaction like
        :meth:`read`, on a small asyncpg pool of its own: checking a connection out of
        SQLAlchemy's pool costs more than the hot queries themselves. Its connections keep no
        session state (one statement, no transaction), so they are handed back without a reset."""
        pool = self._hot or await self._hot_pool()
        async with pool.acquire() as conn:
            try:
                return list(await conn.fetch(statement.sql, *statement.args(values)))
            except _BROKEN as exc:
                # Postgres cut it (a restart, an administrator): asyncpg may leave it mid-protocol
                # ("another operation is in progress"). Closed, the pool connects anew next time;
                # this call is an outage (UNAVAILABLE, retryable), not a bug.
                conn.terminate()
                raise ConnectionError(f"the Postgres connection broke: {type(exc).__name__}") from exc

    async def _hot_pool(self) -> asyncpg.Pool:
        async with self._hot_lock:
            if self._hot is None:
                args, kwargs = self.engine.dialect.create_connect_args(make_url(self.url))
                self._hot = await asyncpg.create_pool(
                    *args,
                    **{**kwargs, **self._connect_args},
                    min_size=1,
                    max_size=self._hot_pool_size,
                    init=_json_codecs,
                    reset=_no_reset,
                )
            return self._hot

    async def ping(self) -> None:
        async with self.engine.connect() as conn:
            await conn.exec_driver_sql("SELECT 1")

    async def close(self) -> None:
        if self._hot is not None:
            await self._hot.close()
            self._hot = None
        await self.engine.dispose()


#: What a connection Postgres dropped raises on its next use.
_BROKEN = (
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.exceptions.InternalClientError,
    OSError,
)


async def _json_codecs(conn: asyncpg.Connection) -> None:
    """JSON columns read as Python values, as SQLAlchemy's JSON type gives them."""
    for name in ("json", "jsonb"):
        await conn.set_type_codec(name, encoder=json.dumps, decoder=json.loads, schema="pg_catalog")


async def _no_reset(conn: asyncpg.Connection) -> None:
    """Nothing to undo (see :meth:`Database.fetch`); asyncpg's default reset is a round trip."""


def _alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(_MIGRATIONS))
    # ConfigParser interpolation would eat a literal '%' in passwords.
    cfg.set_main_option("sqlalchemy.url", async_url(url).replace("%", "%%"))
    return cfg


async def migrate(url: str, revision: str = "head") -> None:
    """Bring the schema forward to ``revision``, the newest by default (Alembic runs its own loop,
    so in a thread). Forward only: an older schema is reached by restoring an older backup."""
    await asyncio.to_thread(command.upgrade, _alembic_config(url), revision)


def known_revision(revision: str | None) -> bool:
    """Whether ``revision`` is one of this code's migrations (a database from a newer release is
    not: migrations only go forward, so this code cannot bring it to its schema)."""
    from alembic.script import ScriptDirectory

    if revision is None:
        return True  # an empty database: every migration applies
    script = ScriptDirectory(str(_MIGRATIONS))
    return revision in {rev.revision for rev in script.walk_revisions()}
