"""``engram credentials``: NATS identities for platform clients of an ``engram up`` data dir.

Each platform client gets its own nkey and inbox prefix (so it can read no other client's
replies) and a token for its organization, in one file (mode 0600) that
``contracts.connection.ConnectionInfo`` reads. The server only ever learns public keys; a running
``engram up`` is reloaded at once, so a revoked client is disconnected before this returns.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING
from uuid import UUID

import typer

from services.cli.remote import CONNECTION, TOKEN, URL, Remote

if TYPE_CHECKING:
    from engram_client.contracts.admin import ClientCredentials
    from engram_client.contracts.connection import ConnectionInfo

    from shared.security.nats_auth.store import Identity

# Each command imports what it needs when it runs (services/cli/main.py says why).

__all__ = ["credentials_app", "signing_keys"]

credentials_app = typer.Typer(
    help="Issue, rotate and revoke NATS identities of platform clients; with --url or --connection, "
    "administer a running deployment's organizations, agent configs, clients and tokens.",
    no_args_is_help=True,
)
DATA_DIR = typer.Option(Path(".engram"), "--data-dir", help="The `engram up` data dir.")
DEFAULT_NATS_URL = "nats://127.0.0.1:4223"
CLIENT_TOKEN_TTL_S = 30 * 24 * 3600
NATS_URL = typer.Option("", help="The NATS URL to write (default: the running engram up's).")
HTTP_URL = typer.Option("", help="The HTTP API to write (default: the running engram up's).")
AGENT_CONFIG = typer.Option(
    None,
    "--agent-config",
    help="The agent config to write (default: the running engram up's development one, for its "
    "development organization only).",
)


def signing_keys(data_dir: Path) -> dict[str, str]:
    """``ENGRAM_TOKEN_KEYS``, else the data dir's development key."""
    from shared.embedded.dev_identity import load_dev_identity
    from shared.runtime.settings import EngramSettings

    keys = EngramSettings().signing_keys()
    if not keys:
        identity = load_dev_identity(data_dir)
        keys = {identity.kid: identity.secret}
    return keys


def _apply(data_dir: Path) -> None:
    """Make a running ``engram up`` of ``data_dir`` take the registry's users now."""
    import asyncio

    from shared.embedded.nats_server import reload_nats_server
    from shared.security.nats_auth.store import NatsIdentities

    if NatsIdentities(data_dir).running() and asyncio.run(reload_nats_server(data_dir / "nats")):
        typer.echo("applied: the running nats-server reloaded its users", err=True)
    else:
        typer.echo("takes effect at the next `engram up` of this data dir", err=True)


def _write_client_file(
    out: Path, identity: Identity, org_id: UUID, token: str, where: ConnectionInfo, *, replace: bool
) -> None:
    """The client's file: every field of ``ConnectionInfo`` (what ``connection.json`` gives the
    development client), those the deployment does not tell null, plus the client's name."""
    from engram_client.contracts.connection import ConnectionInfo

    from shared.security.nats_auth.store import write_private

    if out.exists() and not replace:
        raise typer.BadParameter(f"{out} exists; choose another --out")
    info = ConnectionInfo(
        nats_url=where.nats_url,
        nats_nkey_seed=identity.seed,
        nats_inbox_prefix=identity.inbox_prefix,
        http_url=where.http_url,
        token=token,
        org_id=org_id,
        agent_config_id=where.agent_config_id,
    )
    data = {"name": identity.name, **info.model_dump(mode="json")}
    write_private(out, json.dumps(data, indent=2) + "\n")
    typer.echo(f"wrote {out} (mode 0600): NATS identity {identity.public_key}, inbox {identity.inbox_prefix}")


def _write_remote_client_file(
    out: Path, creds: ClientCredentials, remote: Remote, nats_url: str, http_url: str, *, replace: bool
) -> None:
    """The client's file from the admin API's reply: where it is to work is the deployment's."""
    from engram_client.contracts.connection import ConnectionInfo

    from shared.security.nats_auth.store import Identity

    identity = Identity(creds.name, creds.nats_nkey_seed, creds.nats_public_key, creds.nats_inbox_prefix)
    where = ConnectionInfo(
        nats_url=nats_url or remote.nats_url() or DEFAULT_NATS_URL,
        http_url=http_url or remote.http_url(),
        agent_config_id=creds.agent_config_id,
    )
    _write_client_file(out, identity, creds.org_id, creds.token, where, replace=replace)


def _where(
    data_dir: Path, org: UUID, nats_url: str, http_url: str, agent_config: UUID | None
) -> ConnectionInfo:
    """Where the client is to work: the URLs and agent config given, else the running ``engram
    up``'s (its HTTP API only when the NATS URL is its own; its development agent config only for
    its development organization)."""
    from engram_client.contracts.connection import ConnectionInfo, connection_file

    path = connection_file(data_dir)
    running = ConnectionInfo.load(path) if path.exists() else None
    same_stack = running is not None and nats_url in ("", running.nats_url)
    return ConnectionInfo(
        nats_url=nats_url or (running.nats_url if running else DEFAULT_NATS_URL),
        http_url=http_url or (running.http_url if running and same_stack else None),
        agent_config_id=agent_config
        or (running.agent_config_id if running and same_stack and running.org_id == org else None),
    )


def _client_token(data_dir: Path, org: UUID, name: str, perms: list[str], ttl: int) -> str:
    from engram_client.contracts.common import Principal

    from shared.runtime.settings import EngramSettings
    from shared.security.auth import ALL_PERMISSIONS, OPERATOR, TokenService

    if OPERATOR in perms:
        raise typer.BadParameter(
            f"a platform client works for one organization and never holds {OPERATOR}; "
            f"the deployment's operator gets theirs from `engram token mint --perm {OPERATOR}`"
        )
    unknown = set(perms) - ALL_PERMISSIONS
    if unknown:
        raise typer.BadParameter(
            f"unknown permissions {sorted(unknown)}; choose from {sorted(ALL_PERMISSIONS)}"
        )
    return TokenService(signing_keys(data_dir), EngramSettings().token_issuer).mint(
        org_id=org,
        principal=Principal(kind="service", id=name),
        permissions=set(perms),
        ttl_seconds=ttl,
    )


@credentials_app.command("mint")
def mint(
    org: UUID = typer.Option(..., help="The organization the client works for."),
    name: str = typer.Option(
        ..., help="A name for the client: a-z, 0-9, '-', '_' (its inbox is _INBOX_<name>)."
    ),
    out: Path = typer.Option(None, help="Where to write the client's file (default: ./<name>.json)."),
    perm: list[str] = typer.Option(["memory.read", "memory.write"], help="Token permissions; repeat."),
    token_ttl: int = typer.Option(CLIENT_TOKEN_TTL_S, help="Seconds until the token expires."),
    nats_url: str = NATS_URL,
    http_url: str = HTTP_URL,
    agent_config: UUID = AGENT_CONFIG,
    data_dir: Path = DATA_DIR,
    url: str = URL,
    connection: Path = CONNECTION,
    token: str = TOKEN,
) -> None:
    """Issue a platform client: its own NATS identity and a service token for ORG, in one file
    with the fields of connection.json."""
    from shared.security.nats_auth.store import NatsIdentities

    target = out or Path(f"{name}.json")
    if target.exists():
        raise typer.BadParameter(f"{target} exists; choose another --out")
    remote = Remote(url, connection, token)
    if remote.given:
        with remote.client() as client:
            creds = client.admin_mint_client(
                org, name, permissions=perm, token_ttl_seconds=token_ttl, agent_config_id=agent_config
            )
        _write_remote_client_file(target, creds, remote, nats_url, http_url, replace=False)
        return
    token = _client_token(data_dir, org, name, perm, token_ttl)
    try:
        identity = NatsIdentities(data_dir).mint(name, org)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    where = _where(data_dir, org, nats_url, http_url, agent_config)
    _write_client_file(target, identity, org, token, where, replace=False)
    _apply(data_dir)


@credentials_app.command("rotate")
def rotate(
    name: str = typer.Option(..., help="The client to give a new key."),
    out: Path = typer.Option(None, help="Where to write its new file (default: ./<name>.json)."),
    perm: list[str] = typer.Option(["memory.read", "memory.write"], help="Token permissions; repeat."),
    token_ttl: int = typer.Option(CLIENT_TOKEN_TTL_S, help="Seconds until the new token expires."),
    nats_url: str = NATS_URL,
    http_url: str = HTTP_URL,
    agent_config: UUID = AGENT_CONFIG,
    data_dir: Path = DATA_DIR,
    url: str = URL,
    connection: Path = CONNECTION,
    token: str = TOKEN,
) -> None:
    """A new key (and token) for a client, same organization and inbox; the old key stops working."""
    from shared.security.nats_auth.store import NatsIdentities

    remote = Remote(url, connection, token)
    if remote.given:
        with remote.client() as client:
            creds = client.admin_rotate_client(name, permissions=perm, token_ttl_seconds=token_ttl)
        _write_remote_client_file(
            out or Path(f"{name}.json"), creds, remote, nats_url, http_url, replace=True
        )
        return
    try:
        identity, record = NatsIdentities(data_dir).rotate(name)
    except KeyError as exc:
        raise typer.BadParameter(str(exc.args[0])) from exc
    org = UUID(record.org_id)
    token = _client_token(data_dir, org, name, perm, token_ttl)
    where = _where(data_dir, org, nats_url, http_url, agent_config)
    _write_client_file(out or Path(f"{name}.json"), identity, org, token, where, replace=True)
    _apply(data_dir)


@credentials_app.command("revoke")
def revoke(
    name: str = typer.Option(..., help="The client to refuse."),
    data_dir: Path = DATA_DIR,
    url: str = URL,
    connection: Path = CONNECTION,
    token: str = TOKEN,
) -> None:
    """Refuse a client from now on; its open connections are closed (and, through the admin API,
    its token refused)."""
    from shared.security.nats_auth.store import NatsIdentities

    remote = Remote(url, connection, token)
    if remote.given:
        with remote.client() as client:
            revoked = client.admin_revoke_client(name)
        typer.echo(f"revoked {revoked.name} ({revoked.nats_public_key}; token {revoked.token_id})")
        return
    try:
        record = NatsIdentities(data_dir).revoke(name)
    except KeyError as exc:
        raise typer.BadParameter(str(exc.args[0])) from exc
    typer.echo(f"revoked {record.name} ({record.public_key})")
    _apply(data_dir)


@credentials_app.command("list")
def list_clients(
    all_: bool = typer.Option(False, "--all", help="Revoked clients too."),
    data_dir: Path = DATA_DIR,
    url: str = URL,
    connection: Path = CONNECTION,
    token: str = TOKEN,
) -> None:
    """The platform clients of this data dir (public keys only), one JSON object per line."""
    from shared.security.nats_auth.store import NatsIdentities

    remote = Remote(url, connection, token)
    if remote.given:
        with remote.client() as client:
            for found in client.admin_list_clients(include_revoked=all_).clients:
                typer.echo(found.model_dump_json())
        return

    for record in NatsIdentities(data_dir).clients(include_revoked=all_):
        typer.echo(json.dumps(record.__dict__, sort_keys=True))


@credentials_app.command("keygen")
def keygen(out: Path = typer.Option(..., help="Where to write the seed (mode 0600).")) -> None:
    """A new NATS user nkey for a production server (infra/nats/engram-auth.conf): the seed goes
    to OUT, the public key (for ENGRAM_NATS_NKEY_<USER> on the server) is printed."""
    from shared.security.nats_auth.keys import new_user_seed, public_key_of
    from shared.security.nats_auth.store import write_private

    if out.exists():
        raise typer.BadParameter(f"{out} exists; choose another --out")
    seed = new_user_seed()
    write_private(out, seed + "\n")
    typer.echo(public_key_of(seed))


@credentials_app.command("deployment-env")
def deployment_env(
    out: Path = typer.Option(..., help="The .env file to write (mode 0600), e.g. infra/compose/.env."),
) -> None:
    """Fresh secrets for a production deployment (infra/compose, infra/helm): a key pair per NATS
    user of infra/nats/engram-auth.conf (ENGRAM_NATS_NKEY_<USER> public keys for the servers,
    ENGRAM_NATS_SEED_<USER> seeds for the services and clients), a token signing key and a
    Postgres password."""
    import secrets
    from datetime import UTC, datetime

    from shared.security.nats_auth.infra import INFRA_USERS, nkey_variable, seed_variable
    from shared.security.nats_auth.keys import new_user_seed, public_key_of
    from shared.security.nats_auth.store import write_private

    if out.exists():
        raise typer.BadParameter(f"{out} exists; move it away first (it holds the running deployment's keys)")
    lines = [
        "# Generated by `engram credentials deployment-env`. Secret: seeds, signing keys, a password.",
        "# Public keys (ENGRAM_NATS_NKEY_*) go to the NATS servers, seeds to each service's process.",
    ]
    for user in INFRA_USERS:
        seed = new_user_seed()
        lines += [f"{nkey_variable(user)}={public_key_of(seed)}", f"{seed_variable(user)}={seed}"]
    kid = datetime.now(UTC).strftime("k%Y%m%d")
    lines += [
        f"ENGRAM_TOKEN_KEYS={kid}={secrets.token_urlsafe(48)}",
        f"POSTGRES_PASSWORD={secrets.token_urlsafe(24)}",
    ]
    write_private(out, "\n".join(lines) + "\n")
    typer.echo(f"wrote {out} ({len(INFRA_USERS)} NATS identities, a token signing key, a Postgres password)")
