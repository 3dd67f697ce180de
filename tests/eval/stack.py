"""What every eval script (tests/eval) sets up and hands back: a throwaway NATS and Postgres with
settings for them and a connection to each, a service token, and the JSON-plus-table report."""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, NamedTuple
from uuid import UUID

import asyncpg
import nats
from nats.aio.client import Client
from pydantic import SecretStr

from contracts.common import Principal
from shared.runtime.settings import EngramSettings
from shared.security.auth import ALL_PERMISSIONS, TokenService
from tests.support.servers import nats_server, throwaway_database

__all__ = ["KID", "SECRET", "EvalStack", "eval_stack", "script_parser", "service_token", "write_report"]

KID, SECRET = "eval", "e" * 48


class EvalStack(NamedTuple):
    settings: EngramSettings
    nc: Client
    pg: asyncpg.Connection


@asynccontextmanager
async def eval_stack(prefix: str, embedder: str, **settings: Any) -> AsyncIterator[EvalStack]:
    """A throwaway NATS and Postgres (``ENGRAM_TEST_DATABASE_URL``'s server when set) in a
    temporary folder named ``prefix…``, settings for them (``settings`` override more), and a NATS
    and a Postgres connection, closed on the way out. The caller starts the services
    (``running_services(stack.settings)``) where it needs them."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        async with (
            nats_server(Path(tmp) / "nats") as server,
            throwaway_database(os.environ.get("ENGRAM_TEST_DATABASE_URL"), Path(tmp)) as db_url,
        ):
            engram = EngramSettings(
                nats_url=server.url,
                database_url=db_url,
                data_dir=Path(tmp) / "data",
                token_keys=SecretStr(f"{KID}={SECRET}"),
                embedder=embedder,
                _env_file=None,
                **settings,
            )
            nc = await nats.connect(server.url)
            pg = await asyncpg.connect(db_url.replace("postgresql+asyncpg://", "postgresql://", 1))
            try:
                yield EvalStack(engram, nc, pg)
            finally:
                await pg.close()
                await nc.drain()


def service_token(org: UUID, name: str, ttl_seconds: int) -> str:
    """A token for ``org`` with every permission, as the service ``name`` (signed with KID)."""
    return TokenService({KID: SECRET}).mint(
        org_id=org,
        principal=Principal(kind="service", id=name),
        permissions=ALL_PERMISSIONS,
        ttl_seconds=ttl_seconds,
    )


def write_report(out: Path, result: dict[str, Any], table: str) -> None:
    """The whole result as JSON at ``out``; the table (and where the rest is) on stdout."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(table)
    print(f"\n(full results: {out})")


def script_parser(doc: str | None) -> argparse.ArgumentParser:
    """An eval script's command line, with its module docstring (``doc``) as the help."""
    return argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
