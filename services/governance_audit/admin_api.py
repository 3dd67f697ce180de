"""``engram.admin.*`` (SPEC 11): organizations, agent configs, platform clients and tokens, for the
deployment's operator (``tenant.admin``; the edge has checked it). docs/adr/0104-admin-api.md.

- Organizations, revoked tokens: Postgres (``shared.storage.db.models``). A disabled organization's
  tokens and a revoked token are refused by every service at once (``shared.service.revocations``).
- Platform clients: the NATS identities of the data dir's registry (``shared.security.nats_auth.store``)
  that ``engram up``'s nats-server admits — reloaded before the reply, so a revoked or rotated key
  is disconnected by then. Where Engram does not run the NATS server's users (a production
  deployment's are ``infra/nats/engram-auth.conf``) minting and rotating answer ``UNAVAILABLE``.
- Every action is an audit record of the organization it concerns: ids, names, public keys and
  permissions — never a seed or a token.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any
from uuid import UUID, uuid4

from sqlalchemy import select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncSession
from sqlmodel import col

from contracts.admin import (
    AgentConfigCreate,
    AgentConfigInfo,
    AgentConfigList,
    AgentConfigListReply,
    ClientCredentials,
    ClientList,
    ClientListReply,
    ClientMint,
    ClientRevoke,
    ClientRotate,
    MintedToken,
    OrgCreate,
    OrgDisable,
    OrgList,
    OrgListReply,
    PlatformClient,
    TokenMint,
    TokenRevoke,
    TokenRevoked,
)
from contracts.admin import Organization as OrganizationReply
from contracts.common import Principal
from contracts.errors import Forbidden, InvalidRequest, NotFound, Unavailable
from shared.runtime.time import utcnow
from shared.security.access import Caller
from shared.security.auth import TokenService
from shared.security.nats_auth.store import ClientRecord, Identity, NatsIdentities
from shared.service import revocations
from shared.service.infra import Infra
from shared.storage import audit
from shared.storage.config_store import claim_agent_config, put_config
from shared.storage.db.models import MemoryConfigRow, Organization, RevokedToken

__all__ = ["Admin"]


class Admin:
    """The handlers of ``engram.admin.*`` for one process."""

    def __init__(self, infra: Infra) -> None:
        self._infra = infra
        self._db = infra.db
        self._tokens = TokenService(infra.settings.signing_keys(), infra.settings.token_issuer)
        self._registry = NatsIdentities(infra.settings.data_dir.resolve())

    # -- organizations -----------------------------------------------------------------------

    async def create_org(self, caller: Caller, request: OrgCreate) -> OrganizationReply:
        org_id = request.org_id or uuid4()
        row = Organization(org_id=org_id, name=request.name, created_at=utcnow(), created_by=caller.ref)
        async with self._db.transaction() as session:
            inserted = await session.execute(
                pg_insert(Organization)
                .values(**row.model_dump())
                .on_conflict_do_nothing()
                .returning(col(Organization.org_id))
            )
            if inserted.first() is None:
                # Registered already: answered as it is (a retried create changes nothing).
                return _org(await _org_row(session, org_id))
            await self._audit(session, caller, org_id, "admin.org_created", {"name": request.name})
        return _org(row)

    async def list_orgs(self, caller: Caller, request: OrgList) -> OrgListReply:
        query = select(Organization).order_by(col(Organization.created_at))
        if not request.include_disabled:
            query = query.where(col(Organization.disabled_at).is_(None))
        async with self._db.read() as session:
            rows = (await session.execute(query)).scalars().all()
        return OrgListReply(organizations=[_org(r) for r in rows])

    async def disable_org(self, caller: Caller, request: OrgDisable) -> OrganizationReply:
        """Refused at once by every service (its tokens), and its platform clients revoked."""
        async with self._db.transaction() as session:
            row = await _org_row(session, request.org_id)
            if row.disabled_at is None:
                row.disabled_at = utcnow()
                await session.execute(
                    update(Organization)
                    .where(col(Organization.org_id) == row.org_id)
                    .values(disabled_at=row.disabled_at)
                )
            clients = [c.name for c in self._registry.clients() if c.org_id == str(row.org_id)]
            await self._audit(session, caller, row.org_id, "admin.org_disabled", {"clients_revoked": clients})
        await revocations.announce(self._infra.nc, self._infra.tokens.revocations, org_disabled=row.org_id)
        for name in clients:
            self._registry.revoke(name)
        if clients:
            await self._reload_nats()
        return _org(row)

    # -- agent configs -----------------------------------------------------------------------

    async def create_agent_config(self, caller: Caller, request: AgentConfigCreate) -> AgentConfigInfo:
        agent_config_id = request.agent_config_id or uuid4()
        async with self._db.transaction() as session:
            await _active_org(session, request.org_id)
            # FORBIDDEN when the id is another organization's; an existing one of this
            # organization is answered as it is (with the keys given set).
            _, created = await claim_agent_config(session, request.org_id, agent_config_id, by=caller.ref)
            if request.config:
                await put_config(session, request.org_id, agent_config_id, request.config, by=caller.ref)
            await self._audit(
                session,
                caller,
                request.org_id,
                "admin.agent_config_created",
                {"created": created, "keys": sorted(request.config)},
                agent_config_id=agent_config_id,
            )
            row = await session.get(MemoryConfigRow, agent_config_id, populate_existing=True)
            assert row is not None
            return _agent_config(row)

    async def list_agent_configs(self, caller: Caller, request: AgentConfigList) -> AgentConfigListReply:
        async with self._db.read() as session:
            await _org_row(session, request.org_id)
            rows = (
                (
                    await session.execute(
                        select(MemoryConfigRow)
                        .where(col(MemoryConfigRow.org_id) == request.org_id)
                        .order_by(col(MemoryConfigRow.updated_at))
                    )
                )
                .scalars()
                .all()
            )
        return AgentConfigListReply(agent_configs=[_agent_config(r) for r in rows])

    # -- platform clients --------------------------------------------------------------------

    async def mint_client(self, caller: Caller, request: ClientMint) -> ClientCredentials:
        async with self._db.read() as session:
            await _active_org(session, request.org_id)
        self._require_registry()
        token, token_id, expires = self._mint(
            request.org_id,
            Principal(kind="service", id=request.name),
            request.permissions,
            request.token_ttl_seconds,
            request.agent_config_id,
        )
        try:
            identity = self._registry.mint(
                request.name,
                request.org_id,
                token_id=token_id,
                permissions=request.permissions,
                agent_config_id=request.agent_config_id,
            )
        except ValueError as exc:  # a name in use or reserved
            raise InvalidRequest(str(exc), {"name": request.name}) from exc
        await self._reload_nats()
        await self._audit_alone(
            caller,
            request.org_id,
            "admin.client_minted",
            _client_facts(identity, token_id, request.permissions),
            agent_config_id=request.agent_config_id,
        )
        return _credentials(identity, request.org_id, token, token_id, expires, request.agent_config_id)

    async def rotate_client(self, caller: Caller, request: ClientRotate) -> ClientCredentials:
        old = self._active_client(request.name)
        self._require_registry()
        org_id = UUID(old.org_id)
        async with self._db.read() as session:
            await _active_org(session, org_id)
        # A client minted by `engram credentials mint` on the data dir has none on record.
        permissions: list[str] = list(
            request.permissions or old.permissions or ("memory.read", "memory.write")
        )
        agent_config_id = UUID(old.agent_config_id) if old.agent_config_id else None
        token, token_id, expires = self._mint(
            org_id,
            Principal(kind="service", id=old.name),
            permissions,
            request.token_ttl_seconds,
            agent_config_id,
        )
        identity, _ = self._registry.rotate(request.name, token_id=token_id, permissions=permissions)
        await self._reload_nats()
        facts = {**_client_facts(identity, token_id, permissions), "previous_token_id": old.token_id}
        await self._revoke_token(caller, org_id, old.token_id, "admin.client_rotated", facts)
        return _credentials(identity, org_id, token, token_id, expires, agent_config_id)

    async def revoke_client(self, caller: Caller, request: ClientRevoke) -> PlatformClient:
        self._active_client(request.name)
        record = self._registry.revoke(request.name)
        await self._reload_nats()
        facts = {"name": record.name, "nats_public_key": record.public_key, "token_id": record.token_id}
        await self._revoke_token(caller, UUID(record.org_id), record.token_id, "admin.client_revoked", facts)
        return _client(record)

    async def list_clients(self, caller: Caller, request: ClientList) -> ClientListReply:
        records = self._registry.clients(include_revoked=request.include_revoked)
        if request.org_id is not None:
            records = [r for r in records if r.org_id == str(request.org_id)]
        return ClientListReply(clients=[_client(r) for r in records])

    # -- tokens ------------------------------------------------------------------------------

    async def mint_token(self, caller: Caller, request: TokenMint) -> MintedToken:
        async with self._db.read() as session:
            await _active_org(session, request.org_id)
        token, token_id, expires = self._mint(
            request.org_id,
            request.principal,
            request.permissions,
            request.ttl_seconds,
            request.agent_config_id,
            request.session_id,
        )
        await self._audit_alone(
            caller,
            request.org_id,
            "admin.token_minted",
            {
                "token_id": token_id,
                "principal": request.principal.ref,
                "permissions": sorted(request.permissions),
                "expires_at": expires.isoformat(),
            },
            agent_config_id=request.agent_config_id,
        )
        return MintedToken(token=token, token_id=token_id, org_id=request.org_id, expires_at=expires)

    async def revoke_token(self, caller: Caller, request: TokenRevoke) -> TokenRevoked:
        await self._revoke_token(
            caller, request.org_id, request.token_id, "admin.token_revoked", {"token_id": request.token_id}
        )
        return TokenRevoked(org_id=request.org_id, token_id=request.token_id, revoked_at=utcnow())

    # -- helpers -----------------------------------------------------------------------------

    def _mint(
        self,
        org_id: UUID,
        principal: Principal,
        permissions: Sequence[str],
        ttl_seconds: int,
        agent_config_id: UUID | None = None,
        session_id: str | None = None,
    ) -> tuple[str, str, datetime]:
        """A token, its id and its expiry."""
        token = self._tokens.mint(
            org_id=org_id,
            principal=principal,
            permissions=set(permissions),
            ttl_seconds=ttl_seconds,
            agent_config_id=agent_config_id,
            session_id=session_id,
        )
        credential, expires = self._tokens.check(token)
        return token, credential.token_id, datetime.fromtimestamp(expires, UTC)

    async def _revoke_token(
        self, caller: Caller, org_id: UUID, token_id: str | None, kind: str, facts: dict[str, Any]
    ) -> None:
        """Record the revocation and the audit record together, then refuse it everywhere."""
        async with self._db.transaction() as session:
            if token_id:
                await session.execute(
                    pg_insert(RevokedToken)
                    .values(token_id=token_id, org_id=org_id, revoked_at=utcnow())
                    .on_conflict_do_nothing()
                )
            await self._audit(session, caller, org_id, kind, facts)
        if token_id:
            await revocations.announce(self._infra.nc, self._infra.tokens.revocations, token_id=token_id)

    def _require_registry(self) -> None:
        if not self._registry.running():
            raise Unavailable(
                "this deployment's NATS users are not Engram's to issue (see infra/nats/engram-auth.conf); "
                "mint a token with engram.admin.token.mint instead"
            )

    def _active_client(self, name: str) -> ClientRecord:
        record = self._registry.client(name)
        if record is None or record.revoked_at is not None:
            raise NotFound("no active platform client of that name", {"name": name})
        return record

    async def _reload_nats(self) -> None:
        """Make the running nats-server apply the registry before the reply: a minted client is
        admitted, a removed key disconnected and refused. (The reply itself survives the reload:
        the services may publish to the registry's clients' inboxes outright,
        ``shared.security.nats_auth.store``.)"""
        from shared.embedded.nats_server import reload_nats_server

        await reload_nats_server(self._registry.data_dir / "nats")

    async def _audit(
        self,
        session: AsyncSession,
        caller: Caller,
        org_id: UUID,
        kind: str,
        details: dict[str, Any],
        *,
        agent_config_id: UUID | None = None,
    ) -> None:
        """An audit record in ``org_id``'s chain: who did it (and from which organization's token)."""
        entry = audit.AuditEntry(
            kind=kind,
            actor_ref=caller.ref,
            agent_config_id=agent_config_id,
            details={**details, "by_org": str(caller.org_id)},
        )
        await audit.append(session, org_id, [entry])

    async def _audit_alone(
        self,
        caller: Caller,
        org_id: UUID,
        kind: str,
        details: dict[str, Any],
        *,
        agent_config_id: UUID | None,
    ) -> None:
        """:meth:`_audit` in a transaction of its own."""
        async with self._db.transaction() as session:
            await self._audit(session, caller, org_id, kind, details, agent_config_id=agent_config_id)


async def _org_row(session: AsyncSession, org_id: UUID) -> Organization:
    row = await session.get(Organization, org_id)
    if row is None:
        raise NotFound(
            "no such organization: register it first (engram.admin.org.create)", {"org_id": str(org_id)}
        )
    return row


async def _active_org(session: AsyncSession, org_id: UUID) -> Organization:
    row = await _org_row(session, org_id)
    if row.disabled_at is not None:
        raise Forbidden("this organization is disabled", {"org_id": str(org_id)})
    return row


def _org(row: Organization) -> OrganizationReply:
    return OrganizationReply(
        org_id=row.org_id, name=row.name, created_at=row.created_at, disabled_at=row.disabled_at
    )


def _agent_config(row: MemoryConfigRow) -> AgentConfigInfo:
    return AgentConfigInfo(
        org_id=row.org_id, agent_config_id=row.agent_config_id, version=row.version, updated_at=row.updated_at
    )


def _client_facts(identity: Identity, token_id: str, permissions: Sequence[str]) -> dict[str, Any]:
    """What an audit record says of a client: public facts only."""
    return {
        "name": identity.name,
        "nats_public_key": identity.public_key,
        "token_id": token_id,
        "permissions": sorted(permissions),
    }


def _credentials(
    identity: Identity,
    org_id: UUID,
    token: str,
    token_id: str,
    expires: datetime,
    agent_config_id: UUID | None,
) -> ClientCredentials:
    return ClientCredentials(
        name=identity.name,
        org_id=org_id,
        nats_nkey_seed=identity.seed,
        nats_public_key=identity.public_key,
        nats_inbox_prefix=identity.inbox_prefix,
        token=token,
        token_id=token_id,
        expires_at=expires,
        agent_config_id=agent_config_id,
    )


def _client(record: ClientRecord) -> PlatformClient:
    return PlatformClient(
        name=record.name,
        org_id=UUID(record.org_id),
        nats_public_key=record.public_key,
        nats_inbox_prefix=record.inbox_prefix,
        token_id=record.token_id,
        permissions=list(record.permissions),
        agent_config_id=UUID(record.agent_config_id) if record.agent_config_id else None,
        created_at=datetime.fromisoformat(record.created_at),
        rotated_at=datetime.fromisoformat(record.rotated_at) if record.rotated_at else None,
        revoked_at=datetime.fromisoformat(record.revoked_at) if record.revoked_at else None,
    )
