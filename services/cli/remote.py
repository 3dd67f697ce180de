"""``engram credentials …`` and ``engram token mint`` against a running deployment: the admin API
(``engram.admin.*``, docs/adr/0104-admin-api.md) through the thin client, over HTTP (``--url``) or
as a connection file says (``--connection``: its NATS identity, or its HTTP API with ``--http``),
with an operator credential holding ``tenant.admin`` (``--token`` / ``ENGRAM_TOKEN``, else the
connection file's own token — ``engram up``'s development token holds it)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from engram_client import SyncEngramClient

__all__ = ["CONNECTION", "TOKEN", "URL", "Remote"]

URL = typer.Option(
    "", "--url", help="The HTTP API of a running deployment: work through its admin API, not the data dir."
)
CONNECTION = typer.Option(
    None,
    "--connection",
    help="A connection file (connection.json, or a client file): work through the admin API as it says.",
)
TOKEN = typer.Option(
    "",
    "--token",
    envvar="ENGRAM_TOKEN",
    help="The bearer token to act with (with --url or --connection: the operator's, holding "
    "tenant.admin; default: the connection file's).",
)


class Remote:
    """Where the admin API is, if the command was told to use it."""

    def __init__(self, url: str, connection: Path | None, token: str) -> None:
        self.url, self.connection, self.token = url, connection, token

    @property
    def given(self) -> bool:
        return bool(self.url) or self.connection is not None

    def client(self) -> SyncEngramClient:
        from engram_client import SyncEngramClient

        if self.url:
            if not self.token:
                raise typer.BadParameter("--url needs the operator's token (--token or ENGRAM_TOKEN)")
            return SyncEngramClient.connect_http(self.url.rstrip("/"), self.token)
        assert self.connection is not None
        return SyncEngramClient.from_connection(self.connection, token=self.token or None)

    def nats_url(self) -> str | None:
        """The deployment's NATS, as the connection file says (for a client's file)."""
        from engram_client.contracts.connection import ConnectionInfo

        return ConnectionInfo.load(self.connection).nats_url if self.connection is not None else None

    def http_url(self) -> str | None:
        from engram_client.contracts.connection import ConnectionInfo

        if self.url:
            return self.url.rstrip("/")
        return ConnectionInfo.load(self.connection).http_url if self.connection is not None else None
