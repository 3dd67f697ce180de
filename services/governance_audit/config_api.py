"""``engram.config.get`` / ``engram.config.put`` (SPEC 7.1)."""

from __future__ import annotations

from contracts.requests import ConfigGet, ConfigPut, ConfigReply
from shared import audit
from shared.auth import READ, Credential
from shared.config_store import load_config, put_config
from shared.infra import Infra

__all__ = ["get_config", "set_config"]


async def get_config(infra: Infra, credential: Credential, request: ConfigGet) -> ConfigReply:
    credential.require(READ)
    credential.require_agent_config(request.agent_config_id)
    async with infra.db.read() as db:
        config, version = await load_config(db, credential.org_id, request.agent_config_id)
    return ConfigReply(agent_config_id=request.agent_config_id, version=version, config=config)


async def set_config(infra: Infra, credential: Credential, request: ConfigPut) -> ConfigReply:
    credential.require_operator()
    credential.require_agent_config(request.agent_config_id)
    async with infra.db.transaction() as db:
        config, version = await put_config(
            db, credential.org_id, request.agent_config_id, request.config, by=credential.principal.ref
        )
        await audit.append(
            db,
            credential.org_id,
            [
                audit.AuditEntry(
                    kind="config.changed",
                    actor_ref=credential.principal.ref,
                    agent_config_id=request.agent_config_id,
                    # Which keys changed, not their values: configs are not secret, but keep records small.
                    details={"version": version, "keys": sorted(request.config)},
                )
            ],
        )
    return ConfigReply(agent_config_id=request.agent_config_id, version=version, config=config)
