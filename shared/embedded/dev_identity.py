"""The development identity of a data dir: its organization, agent config and token signing key,
generated once (``dev-identity.json``, mode 0600) and kept. Apart from the embedded stack, so that
``engram token mint`` signs with it without loading the stack (Postgres, nats-server): it starts
fast (docs/adr/0092-commands-that-start-fast.md)."""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from uuid import UUID, uuid4

from contracts.common import Principal
from shared.security.auth import ALL_PERMISSIONS, DEPLOYMENT_PERMISSIONS, TokenService

__all__ = ["DEV_TOKEN_TTL_S", "DevIdentity", "load_dev_identity"]

DEV_TOKEN_TTL_S = 30 * 24 * 3600


@dataclass(frozen=True)
class DevIdentity:
    """The development organization, agent config and signing key of one data dir."""

    org_id: UUID
    agent_config_id: UUID
    kid: str
    secret: str

    @property
    def token_keys(self) -> str:
        return f"{self.kid}={self.secret}"

    def tokens(self) -> TokenService:
        return TokenService({self.kid: self.secret})

    def service_token(self, ttl_seconds: int = DEV_TOKEN_TTL_S) -> str:
        return self.tokens().mint(
            org_id=self.org_id,
            principal=Principal(kind="service", id="engram-dev"),
            # Whoever runs `engram up` runs the deployment: its operator and tenants' admin, too.
            permissions=ALL_PERMISSIONS | DEPLOYMENT_PERMISSIONS,
            ttl_seconds=ttl_seconds,
        )


def load_dev_identity(data_dir: Path) -> DevIdentity:
    """Read the data dir's development identity, generating it (mode 0600) on first use."""
    path = data_dir / "dev-identity.json"
    if not path.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        fresh = {
            "org_id": str(uuid4()),
            "agent_config_id": str(uuid4()),
            "kid": f"dev-{secrets.token_hex(4)}",
            "secret": secrets.token_urlsafe(48),
        }
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump(fresh, handle, indent=2)
    raw = json.loads(path.read_text())
    return DevIdentity(UUID(raw["org_id"]), UUID(raw["agent_config_id"]), raw["kid"], raw["secret"])
