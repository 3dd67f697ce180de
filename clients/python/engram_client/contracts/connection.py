"""How a client reaches Engram: the file ``engram up`` writes (``connection.json``) and the one
``engram credentials mint`` issues to a platform client have this shape.

    info = ConnectionInfo.load(".engram/connection.json")
    nc = await nats.connect(info.nats_url, **info.nats_options())
    engram = await EngramClient.from_connection(info)  # or EngramClient.connect(url, token, ...)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["CONNECTION_FILE", "ConnectionInfo", "connection_file"]

#: The file ``engram up`` writes in its data dir.
CONNECTION_FILE = "connection.json"


class ConnectionInfo(BaseModel):
    """Where NATS (and the HTTP API) is, which NATS identity to connect as, and the bearer token
    to send."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    nats_url: str
    #: The client's NATS identity: a user nkey seed (``SU…``). None on a NATS without
    #: authentication (``engram up --nats-url`` against a server someone else configures).
    nats_nkey_seed: str | None = Field(default=None, repr=False)
    #: Where the client's replies arrive; its NATS identity may subscribe nowhere else.
    nats_inbox_prefix: str = "_INBOX"
    #: The HTTP API (``engram up``'s gateway), e.g. ``http://127.0.0.1:8080``; None without one.
    http_url: str | None = None
    token: str = Field(default="", repr=False)
    org_id: UUID | None = None
    agent_config_id: UUID | None = None

    @classmethod
    def load(cls, path: str | Path) -> ConnectionInfo:
        return cls.model_validate_json(Path(path).read_text())

    def nats_options(self) -> dict[str, Any]:
        """Keyword arguments for ``nats.connect`` (and ``EngramClient.connect``) besides the URL."""
        options: dict[str, Any] = {"inbox_prefix": self.nats_inbox_prefix}
        if self.nats_nkey_seed:
            options["nkeys_seed_str"] = self.nats_nkey_seed
        return options


def connection_file(data_dir: str | Path) -> Path:
    """Where ``engram up`` of ``data_dir`` writes its connection file."""
    return Path(data_dir) / CONNECTION_FILE
