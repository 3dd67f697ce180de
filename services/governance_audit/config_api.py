"""``engram.config.get`` / ``engram.config.put`` (SPEC 7.1). The edge has authorized the caller
for the operation and the agent config (``shared.security.access``)."""

from __future__ import annotations

from contracts.requests import ConfigGet, ConfigPut, ConfigReply
from shared.security.access import Caller
from shared.service.infra import Infra
from shared.storage import audit
from shared.storage.config_store import load_config, put_config

__all__ = ["get_config", "set_config"]


async def get_config(infra: Infra, caller: Caller, request: ConfigGet) -> ConfigReply:
    async with infra.db.read() as db:
        config, version = await load_config(db, caller.org_id, request.agent_config_id)
    return ConfigReply(agent_config_id=request.agent_config_id, version=version, config=config)


async def set_config(infra: Infra, caller: Caller, request: ConfigPut) -> ConfigReply:
    """``caller`` holds ``memory.admin`` on an operator token (``shared.security.access``)."""
    credential = caller.credential
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
