"""Administration of tenants (SPEC 11, ``engram.admin.*``): organizations, agent configs, platform
clients (a NATS identity and a token) and tokens. Every operation needs ``tenant.admin``, the
deployment operator's permission that no organization holds over another
(docs/adr/0104-admin-api.md). Secrets — a client's nkey seed, a token — are in a reply once and
never stored by Engram nor written to an audit record."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal
from uuid import UUID

from pydantic import Field, WithJsonSchema

from engram_client.contracts.common import JSON_INTEGER, Inbound, Outbound, Principal
from engram_client.contracts.config import config_patch_schema

__all__ = [
    "MAX_TOKEN_TTL_SECONDS",
    "AgentConfigCreate",
    "AgentConfigInfo",
    "AgentConfigList",
    "AgentConfigListReply",
    "ClientCredentials",
    "ClientList",
    "ClientListReply",
    "ClientMint",
    "ClientName",
    "ClientRevoke",
    "ClientRotate",
    "MintedToken",
    "OrgCreate",
    "OrgDisable",
    "OrgList",
    "OrgListReply",
    "Organization",
    "PlatformClient",
    "TenantPermission",
    "TokenMint",
    "TokenRevoke",
    "TokenRevoked",
]

#: What a token minted through the admin API may hold: an organization's own permissions only.
#: The deployment's (``deployment.operator``, ``tenant.admin``) come from whoever holds its signing
#: key (``engram token mint`` on the server), never from the API.
TenantPermission = Literal["memory.read", "memory.write", "memory.admin", "memory.purge"]
#: The longest life of a token minted here (a year): a client rotates before then.
MAX_TOKEN_TTL_SECONDS = 365 * 86_400
#: A platform client's name: its NATS inbox is ``_INBOX_<name>``.
ClientName = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,62}$")]
_Ttl = Annotated[int, Field(ge=60, le=MAX_TOKEN_TTL_SECONDS), JSON_INTEGER]
_Permissions = Annotated[list[TenantPermission], Field(min_length=1, max_length=4)]
_DEFAULT_PERMS: list[TenantPermission] = ["memory.read", "memory.write"]


class OrgCreate(Inbound):
    """A new organization; ``org_id`` adopts an id tokens already name (default: a new one)."""

    name: str = Field(min_length=1, max_length=200)
    org_id: UUID | None = None


class Organization(Outbound):
    org_id: UUID
    name: str
    created_at: datetime
    #: Set once disabled: its tokens and clients are refused from then on.
    disabled_at: datetime | None = None


class OrgList(Inbound):
    include_disabled: bool = False


class OrgListReply(Outbound):
    organizations: list[Organization]


class OrgDisable(Inbound):
    org_id: UUID


class AgentConfigCreate(Inbound):
    """An agent config of ``org_id`` (default: a new id), with memory config keys to set."""

    org_id: UUID
    agent_config_id: UUID | None = None
    config: Annotated[dict[str, Any], WithJsonSchema(config_patch_schema())] = Field(default_factory=dict)


class AgentConfigInfo(Outbound):
    org_id: UUID
    agent_config_id: UUID
    #: The memory config's version (1: defaults as created).
    version: int
    updated_at: datetime


class AgentConfigList(Inbound):
    org_id: UUID


class AgentConfigListReply(Outbound):
    agent_configs: list[AgentConfigInfo]


class ClientMint(Inbound):
    """A platform client of ``org_id``: its own NATS identity and a service token named after it."""

    org_id: UUID
    name: ClientName
    permissions: _Permissions = Field(default_factory=lambda: list(_DEFAULT_PERMS))
    token_ttl_seconds: _Ttl = 30 * 86_400
    #: Restrict the client's token to one agent config.
    agent_config_id: UUID | None = None


class ClientRotate(Inbound):
    """A new key and token for a client (same organization and inbox); the old ones are refused."""

    name: ClientName
    #: Default: the permissions it had.
    permissions: _Permissions | None = None
    token_ttl_seconds: _Ttl = 30 * 86_400


class ClientRevoke(Inbound):
    name: ClientName


class ClientList(Inbound):
    #: Only this organization's clients (default: every organization's).
    org_id: UUID | None = None
    include_revoked: bool = False


class PlatformClient(Outbound):
    """A platform client as the registry keeps it: public facts only."""

    name: str
    org_id: UUID
    nats_public_key: str
    nats_inbox_prefix: str
    #: The ``jti`` of its current token (refused once the client is revoked or rotated).
    token_id: str | None = None
    permissions: list[str] = Field(default_factory=list)
    agent_config_id: UUID | None = None
    created_at: datetime
    rotated_at: datetime | None = None
    revoked_at: datetime | None = None


class ClientListReply(Outbound):
    clients: list[PlatformClient]


class ClientCredentials(Outbound):
    """What a minted or rotated client connects with — in this reply only: Engram keeps the public
    key, never the seed nor the token. The fields of ``connection.json`` where they apply."""

    name: str
    org_id: UUID
    nats_nkey_seed: str
    nats_public_key: str
    nats_inbox_prefix: str
    token: str
    token_id: str
    expires_at: datetime
    agent_config_id: UUID | None = None


class TokenMint(Inbound):
    """A signed token for a principal of ``org_id``."""

    org_id: UUID
    principal: Principal
    permissions: _Permissions = Field(default_factory=lambda: list(_DEFAULT_PERMS))
    ttl_seconds: _Ttl = 3600
    agent_config_id: UUID | None = None
    session_id: str | None = Field(default=None, min_length=1, max_length=200)


class MintedToken(Outbound):
    token: str
    #: Its ``jti``: what ``admin.token.revoke`` names.
    token_id: str
    org_id: UUID
    expires_at: datetime


class TokenRevoke(Inbound):
    org_id: UUID
    token_id: str = Field(pattern=r"^[A-Za-z0-9._-]{1,128}$")


class TokenRevoked(Outbound):
    org_id: UUID
    token_id: str
    revoked_at: datetime
