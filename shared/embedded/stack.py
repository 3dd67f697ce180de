"""The embedded stack: NATS and Postgres as child processes under one data dir, migrations
applied, development credentials generated once and kept. External servers can replace either
(``--nats-url`` / ``--database-url``). The services themselves are started by the caller.

Its nats-server admits only nkey users (``shared.security.nats_auth.store``): the services connect as one
least-privilege identity whose seed never leaves this process, ``connection.json`` hands the
development client its own, and platform clients get theirs from ``engram credentials mint``."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from contracts.connection import connection_file
from shared.embedded.dev_identity import DevIdentity, load_dev_identity
from shared.embedded.nats_server import NatsServerProcess, restart_after_full_disk
from shared.embedded.postgres import EmbeddedPostgres
from shared.observability.metrics import JETSTREAM_MAX_STORAGE, refreshing, set_filesystem
from shared.runtime.settings import EngramSettings
from shared.security.nats_auth.store import NatsIdentities, write_private

__all__ = [
    "DevIdentity",
    "connection_file",
    "connection_info",
    "embedded_stack",
    "load_dev_identity",
    "write_connection_file",
]


async def record_filesystems(stores: dict[str, Path]) -> None:
    """The free-space gauges of the embedded stores' filesystems (a metrics refresher)."""
    for store, path in stores.items():
        set_filesystem(store, str(path))


def write_connection_file(data_dir: Path, info: dict[str, Any]) -> Path:
    path = connection_file(data_dir)
    write_private(path, json.dumps(info, indent=2))  # 0600, atomic: a reader never sees half a file
    return path


def connection_info(settings: EngramSettings, *, http_url: str | None = None) -> dict[str, Any]:
    """What the development client needs (``connection.json``): where NATS is and who to be on it
    (this run's development nkey and inbox prefix; none on an external NATS), where the HTTP API
    is, a development token, the development organization and agent config, and the database."""
    identity = load_dev_identity(settings.data_dir)
    client = NatsIdentities(settings.data_dir).dev_client()
    return {
        "nats_url": settings.nats_url,
        "nats_nkey_seed": client.seed if client is not None else None,
        "nats_inbox_prefix": client.inbox_prefix if client is not None else "_INBOX",
        "http_url": http_url,
        "token": identity.service_token(),
        "org_id": str(identity.org_id),
        "agent_config_id": str(identity.agent_config_id),
        "database_url": settings.database_url,
    }


@asynccontextmanager
async def embedded_stack(
    data_dir: Path,
    *,
    nats_port: int = 0,
    nats_url: str = "",
    database_url: str = "",
    base: EngramSettings | None = None,
) -> AsyncIterator[EngramSettings]:
    """Start what is not given externally, migrate, and yield settings pointing at it all."""
    # Imported here: the commands that read this module's files (connection.json, the development
    # identity) never touch the database, and SQLAlchemy with Alembic is most of their start-up.
    from shared.storage.db.engine import migrate

    data_dir = data_dir.resolve()  # noqa: ASYNC240 (once, at start-up)
    data_dir.mkdir(parents=True, exist_ok=True)
    connection_file(data_dir).unlink(missing_ok=True)
    identity = load_dev_identity(data_dir)
    identities = NatsIdentities(data_dir)
    identities.end_run()  # whatever a crashed run left
    nats = None if nats_url else NatsServerProcess(data_dir / "nats", port=nats_port, auth=True)
    postgres = None if database_url else EmbeddedPostgres(data_dir)
    nkey_seed = base.nats_nkey_seed if base else SecretStr("")
    # On an external NATS the gateway is the `gateway` user of infra/nats/engram-auth.conf
    # (ENGRAM_GATEWAY_NKEY_SEED), or nobody on a server without authentication.
    gateway_seed = base.gateway_nkey_seed if base else SecretStr("")
    try:
        if nats is not None:
            # Fresh keys for this run's services and development client, before the server reads them.
            run = identities.start_run()
            nkey_seed = SecretStr(run.services.seed)
            gateway_seed = SecretStr(run.gateway.seed)
            await nats.start()
            nats_url = nats.url
        if postgres is not None:
            database_url = await postgres.start()
        await migrate(database_url)
        settings = (base or EngramSettings()).model_copy(
            update={
                "nats_url": nats_url,
                "nats_nkey_seed": nkey_seed,
                "gateway_nkey_seed": gateway_seed,
                "database_url": database_url,
                "data_dir": data_dir,
                # Configured keys keep signing; the dev key is added so dev tokens verify too.
                "token_keys": SecretStr(
                    ",".join(
                        filter(
                            None, [base.token_keys.get_secret_value() if base else "", identity.token_keys]
                        )
                    )
                ),
            }
        )
        # What fills up first on a full disk, shown before it does (docs/adr/0099-full-disks.md).
        stores = {"postgres": postgres.pgdata} if postgres is not None else {}
        watcher = None
        if nats is not None:
            stores["nats"] = nats.store_dir
            JETSTREAM_MAX_STORAGE.set(nats.max_file_store)
            watcher = asyncio.create_task(restart_after_full_disk(nats), name="nats-full-disk")
        try:
            with refreshing(partial(record_filesystems, stores)):
                yield settings
        finally:
            if watcher is not None:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
    finally:
        connection_file(data_dir).unlink(missing_ok=True)
        if nats is not None:
            await nats.stop()
            identities.end_run()
        if postgres is not None:
            await postgres.stop()
