"""The ``engram`` command: run the stack, run one service, the demo, tokens, audit and config."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any
from uuid import UUID

import typer

from services.cli import tenants as _tenants  # noqa: F401 (registers its commands on credentials_app)
from services.cli.backup import apply_ledger, backup, restore
from services.cli.credentials import credentials_app
from services.cli.errors import DEBUG_HELP, ErrorReportingGroup
from services.cli.output import console
from services.cli.remote import CONNECTION, TOKEN, URL, Remote

if TYPE_CHECKING:
    from collections.abc import Callable

    from engram_client import EngramClient

# Each command imports what it needs when it runs: `engram --help` and the commands that only
# talk to a running deployment start in a fraction of a second, instead of loading the whole
# server (Postgres, the embedder, the MCP SDK) first (docs/adr/0092-commands-that-start-fast.md).

app = typer.Typer(
    cls=ErrorReportingGroup,
    help="Engram: long-term memory for AI agents, on NATS.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
token_app = typer.Typer(help="Issue tokens.", no_args_is_help=True)
audit_app = typer.Typer(help="Read and check the audit log.", no_args_is_help=True)
config_app = typer.Typer(help="Read and change an agent config's memory config.", no_args_is_help=True)
app.add_typer(token_app, name="token")
app.add_typer(audit_app, name="audit")
app.add_typer(config_app, name="config")
app.add_typer(credentials_app, name="credentials")
app.command()(backup)
app.command()(restore)
app.command("apply-ledger")(apply_ledger)

DATA_DIR = typer.Option(Path(".engram"), "--data-dir", help="Where the embedded stack keeps its data.")


@app.callback()
def _root(debug: bool = typer.Option(False, "--debug", help=DEBUG_HELP)) -> None:
    """Engram: long-term memory for AI agents, on NATS."""
    # ErrorReportingGroup reads --debug from the root context's params.


#: ``engram up``'s metrics and health port (the OpenTelemetry Prometheus exporter's default).
METRICS_PORT = 9464


async def _true(value: bool) -> bool:
    return value


@app.command()
def up(
    data_dir: Path = DATA_DIR,
    nats_port: int = typer.Option(4223, help="Port for the embedded nats-server (0 = any free port)."),
    nats_url: str = typer.Option("", help="Use this NATS instead of starting one."),
    database_url: str = typer.Option("", help="Use this Postgres instead of starting one."),
    demo: bool = typer.Option(False, "--demo", help="Publish the demo sessions once ready."),
    http_port: int = typer.Option(
        None,
        "--http-port",
        help="Port of the HTTP API (default ENGRAM_HTTP_PORT or 8080; a free port when taken; 0 = any).",
    ),
    metrics_port: int = typer.Option(
        METRICS_PORT, help="Port for /metrics, /healthz and /readyz on 127.0.0.1 (taken: any free port)."
    ),
) -> None:
    """Start NATS, Postgres, every service and the HTTP gateway in one process, until Ctrl-C."""
    import asyncio
    import signal

    from engram_client.contracts.connection import ConnectionInfo

    from services.cli.streams import wait_for_signal
    from shared.embedded.postgres import PostgresWontStart
    from shared.embedded.stack import (
        connection_info,
        embedded_stack,
        load_dev_identity,
        write_connection_file,
    )
    from shared.observability.logging import setup_logging
    from shared.runtime.process_memory import limit_malloc_arenas, settle_heap
    from shared.runtime.settings import EngramSettings

    limit_malloc_arenas()  # first, before any thread allocates (shared/runtime/process_memory.py says why)
    from services.gateway.server import running_gateway
    from services.runtime import running_services
    from shared.embedded.nats_server import port_in_use
    from shared.observability.health import HealthServer

    base = EngramSettings()
    if http_port is not None:
        base = base.model_copy(update={"http_port": http_port})
    setup_logging(base.log_level, json=base.log_json)
    if not (nats_url or base.nats_url) and nats_port and port_in_use(nats_port):
        console.print(f"[yellow]port {nats_port} is taken; using a free port instead[/]")
        nats_port = 0

    async def main() -> None:
        # Until wait_for_signal takes over, SIGTERM and Ctrl-C cancel start-up (and the demo), so
        # the exits below still stop what was started, in order; by default SIGTERM would kill
        # this process at once and leave nats-server and Postgres running.
        task = asyncio.current_task()
        assert task is not None
        for sig in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(sig, task.cancel)
        # On the way out: the gateway and the services drain while NATS is still there (the
        # embedded nats-server runs in a session of its own, so a terminal's Ctrl-C does not
        # reach it), then NATS stops, then Postgres.
        async with (
            embedded_stack(
                data_dir,
                nats_port=nats_port,
                nats_url=nats_url or base.nats_url,
                database_url=database_url or base.database_url,
                base=base,
            ) as settings,
            running_services(settings) as infra,
            running_gateway(settings, settings.gateway_nkey_seed.get_secret_value(), fall_back=True) as http,
        ):
            probes = HealthServer("127.0.0.1", metrics_port)
            probes.add_check("nats", lambda: _true(infra.nc.is_connected))
            try:
                await probes.start()
            except RuntimeError:  # taken since we looked (another stack): any free port will do
                probes.port = 0
                await probes.start()
            settle_heap()  # start-up is done: what it made lives as long as the process
            metrics_url = f"http://127.0.0.1:{probes.port}/metrics"
            identity = load_dev_identity(settings.data_dir)
            info = {**connection_info(settings, http_url=http.url), "metrics_url": metrics_url}
            path = write_connection_file(settings.data_dir, info)
            console.print(
                f"[bold green]Engram is up[/] — NATS at [bold]{settings.nats_url}[/], "
                f"HTTP API at [bold]{http.url}[/]"
            )
            console.print(
                f"web console at [bold]{http.url}/console[/] (`engram console` prints a sign-in link)"
            )
            console.print(f"HTTP API docs at [bold]{http.url}/docs[/] (OpenAPI: {http.url}/openapi.json)")
            console.print(f"Prometheus metrics: {metrics_url} (health: /healthz, /readyz)")
            console.print(f"connection details (URL, NATS identity, dev token, org, agent config): {path}")
            if demo:
                from services.cli.demo import run_demo

                await run_demo(
                    settings.nats_url,
                    settings.database_url,
                    identity,
                    console,
                    nats_options=ConnectionInfo.model_validate(info).nats_options(),
                )
                console.print("[bold]Still serving.[/] Publish your own sessions (see README); Ctrl-C stops.")
            await wait_for_signal()
            console.print("stopping…")
            await probes.stop()

    try:
        asyncio.run(main())
    except asyncio.CancelledError:  # a signal while starting or during the demo: a normal stop
        pass
    except PostgresWontStart as exc:  # one line saying what is wrong and what to do, no traceback
        console.print(f"[red]engram up: {exc}[/]", soft_wrap=True)
        raise typer.Exit(1) from None
    console.print("Engram stopped.")


@app.command("console")
def console_link(data_dir: Path = DATA_DIR) -> None:
    """Print a one-time sign-in link to the web console for the development identity (valid for two
    minutes, once; the token itself never goes into the URL)."""
    # One JSON POST: the standard library's HTTP client, not httpx, which would double this
    # command's start-up (docs/adr/0092-commands-that-start-fast.md).
    import urllib.error
    import urllib.request

    info = _connection(data_dir)
    if not info.get("http_url"):
        raise typer.BadParameter("this stack serves no HTTP API; start it with `engram up`")
    if not str(info["http_url"]).startswith(("http://", "https://")):
        raise typer.BadParameter(f"the connection file's http_url {info['http_url']!r} is not an HTTP URL")
    request = urllib.request.Request(  # noqa: S310 (http or https, just checked)
        f"{info['http_url']}/console/tickets",
        data=json.dumps({"agent_config_id": info["agent_config_id"]}).encode(),
        headers={"Authorization": f"Bearer {info['token']}", "Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=10.0) as reply:  # noqa: S310
            status, text = reply.status, reply.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as refused:
        status, text = refused.code, refused.read().decode("utf-8", "replace")
    except OSError as exc:  # URLError, a timeout, a reset
        raise typer.BadParameter(
            f"the gateway at {info['http_url']} does not answer ({exc}); is `engram up` running?"
        ) from None
    if status != 200:
        raise typer.BadParameter(f"the gateway refused a sign-in code: {text[:200]}")
    typer.echo(f"{info['http_url']}{json.loads(text)['path']}")


@app.command()
def serve(
    services: list[str] = typer.Argument(
        ...,
        help="ingest | distill | embed | recall | governance-audit | gateway; several services run in "
        "one process (`engram serve embed recall`: the vector process when vectors live in Qdrant "
        "Edge); the HTTP gateway runs alone.",
    ),
) -> None:
    """Run services in this process against external NATS and Postgres (ENGRAM_NATS_URL,
    ENGRAM_DATABASE_URL), with health probes on ENGRAM_HEALTH_PORT and a graceful drain on SIGTERM."""
    import asyncio

    from services.runtime import SERVICES
    from services.serve import serve as serve_process
    from shared.observability.logging import setup_logging
    from shared.runtime.process_memory import limit_malloc_arenas
    from shared.runtime.settings import EngramSettings
    from shared.security.nats_auth.permissions import GATEWAY

    unknown = sorted(set(services) - {*SERVICES, GATEWAY})
    if unknown:
        choices = ", ".join((*SERVICES, GATEWAY))
        raise typer.BadParameter(f"unknown service {', '.join(unknown)}; choose from {choices}")
    if GATEWAY in services and len(set(services)) > 1:
        raise typer.BadParameter("the gateway runs in a process of its own: `engram serve gateway`")
    limit_malloc_arenas()  # before any thread allocates (shared/runtime/process_memory.py says why)
    settings = EngramSettings()
    setup_logging(settings.log_level, json=settings.log_json)
    if GATEWAY in services:
        from services.gateway.server import serve_gateway

        code = asyncio.run(serve_gateway(settings))
    else:
        code = asyncio.run(serve_process(settings, list(dict.fromkeys(services))))
    if code:
        raise typer.Exit(code)


@app.command()
def migrate() -> None:
    """Bring the database at ENGRAM_DATABASE_URL to the newest schema (idempotent). An upgrade runs
    this first, then restarts the services one by one."""
    import asyncio

    from shared.observability.logging import setup_logging
    from shared.runtime.settings import EngramSettings
    from shared.storage.db.engine import migrate as upgrade

    settings = EngramSettings()
    setup_logging(settings.log_level, json=settings.log_json)
    if not settings.database_url:
        raise typer.BadParameter("set ENGRAM_DATABASE_URL")
    asyncio.run(upgrade(settings.database_url))
    console.print("[green]database schema is current[/]")


@app.command()
def demo(data_dir: Path = DATA_DIR) -> None:
    """Publish the bundled demo sessions to a running `engram up` and show the outcome."""
    import asyncio

    from engram_client.contracts.connection import ConnectionInfo

    from services.cli.demo import run_demo
    from shared.embedded.stack import load_dev_identity

    info = _connection(data_dir)
    options = ConnectionInfo.model_validate(info).nats_options()
    asyncio.run(
        run_demo(
            info["nats_url"], info["database_url"], load_dev_identity(data_dir), console, nats_options=options
        )
    )


def _connection(data_dir: Path) -> dict[str, Any]:
    from engram_client.contracts.connection import connection_file

    path = connection_file(data_dir)
    if not path.exists():
        raise typer.BadParameter(f"{path} not found: start Engram with `engram up` (or `make run`) first")
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _nats_options(data_dir: Path, url: str) -> dict[str, Any]:
    """The development client's NATS identity (connection.json) when ``url`` is its NATS."""
    from engram_client.contracts.connection import ConnectionInfo, connection_file

    path = connection_file(data_dir)
    if not path.exists():
        return {}
    info = ConnectionInfo.load(path)
    return info.nats_options() if info.nats_url == url else {}


#: A command gives up on an unreachable NATS within seconds (nats-py's default retries for two
#: minutes, which reads as a hang when `engram up` simply is not running).
_CLI_RECONNECT: dict[str, Any] = {
    "max_reconnect_attempts": 3,
    "reconnect_time_wait": 0.5,
    "connect_timeout": 5,
}


async def _engram(data_dir: Path, url: str, token: str) -> EngramClient:
    from engram_client import EngramClient

    return await EngramClient.connect(url, token, **_CLI_RECONNECT, **_nats_options(data_dir, url))


def _client_args(data_dir: Path, nats_url: str, token: str) -> tuple[str, str]:
    if nats_url and token:
        return nats_url, token
    info = _connection(data_dir)
    return nats_url or info["nats_url"], token or info["token"]


@app.command()
def recall(
    cue: str = typer.Argument("", help="What the agent is about to do (strategies pack, semantic, hybrid)."),
    agent_config: UUID = typer.Option(
        None, "--agent-config", "--agent", help="Agent config id (default: the development one)."
    ),
    as_: str = typer.Option(
        None, "--as", help="Act for a principal, e.g. end_user:alice, actor:carol, none."
    ),
    strategy: str = typer.Option(None, help="last_k | importance | full | pack | semantic | hybrid"),
    top_k: int = typer.Option(None, "--top-k"),
    min_score: float = typer.Option(
        None, "--min-score", help="semantic/hybrid: only entries this similar to the cue (-1 to 1)."
    ),
    format: str = typer.Option(
        "text", "--format", help="text | full (a table) | compact | narrative (the context block)"
    ),
    token_budget: int = typer.Option(None, "--token-budget"),
    session: str = typer.Option(None, "--session"),
    data_dir: Path = DATA_DIR,
    nats_url: str = "",
    token: str = "",
) -> None:
    """Ask Engram what an agent should remember right now: a table for the text and full formats,
    the context block a prompt would get for compact and narrative."""
    import asyncio

    from engram_client.contracts.common import Principal

    from services.cli.output import print_recall

    url, tok = _client_args(data_dir, nats_url, token)
    target = agent_config or UUID(_connection(data_dir)["agent_config_id"])
    fields: dict[str, Any] = {
        "cue": cue or None,
        "strategy": strategy,
        "top_k": top_k,
        "min_score": min_score,
        "format": format,
        "token_budget": token_budget,
        "session_id": session,
    }
    if as_:
        fields["principal"] = Principal.parse_ref(as_).model_dump()

    async def main() -> None:
        async with await _engram(data_dir, url, tok) as client:
            reply = await client.recall(target, **{k: v for k, v in fields.items() if v is not None})
        print_recall(console, reply, format)

    asyncio.run(main())


@app.command()
def mcp(
    data_dir: Path = DATA_DIR,
    connection: Path = typer.Option(
        None,
        "--connection",
        envvar="ENGRAM_CONNECTION_FILE",
        help="A client file from `engram credentials mint` (default: the data dir's connection.json).",
    ),
    nats_url: str = typer.Option("", envvar="ENGRAM_NATS_URL", help="Default: the connection file's."),
    token: str = typer.Option(
        "", envvar="ENGRAM_TOKEN", help="The agent's bearer token: who it is (required)."
    ),
    agent: UUID = typer.Option(
        None,
        "--agent",
        envvar="ENGRAM_AGENT_CONFIG_ID",
        help="The agent config the tools act in (default: the connection file's).",
    ),
    session: str = typer.Option(
        None,
        "--session",
        envvar="ENGRAM_SESSION_ID",
        help="The session the agent works in, if any: saves are placed in it, and recall, expand and "
        "feedback name it.",
    ),
) -> None:
    """Serve Engram's memory tools over MCP on stdin/stdout (for desktop agents and IDEs).

    The agent is who ENGRAM_TOKEN says, and nobody else: the connection file's own token (engram
    up's, with every permission) is never used for it."""
    import asyncio

    from engram_client.contracts.connection import ConnectionInfo, connection_file

    if not token:
        raise typer.BadParameter(
            "set ENGRAM_TOKEN to the agent's own token, e.g. `engram token mint --kind end_user --id "
            "alice --perm memory.read --perm memory.write` (it expires after an hour unless given "
            "--ttl); the connection file's token is never used for an agent",
            param_hint="ENGRAM_TOKEN",
        )
    path = connection or connection_file(data_dir)
    base = ConnectionInfo.load(path) if path.exists() else None
    url = nats_url or (base.nats_url if base is not None else "")
    target = agent or (base.agent_config_id if base is not None else None)
    if not url or target is None:
        raise typer.BadParameter(
            f"set ENGRAM_NATS_URL and ENGRAM_AGENT_CONFIG_ID (or start `engram up` so {path} exists)"
        )
    # The NATS identity belongs to the connection file's server; another URL connects without it.
    info = (
        base.model_copy(update={"nats_url": url})
        if base is not None and base.nats_url == url
        else ConnectionInfo(nats_url=url)
    )
    # The MCP SDK (most of what this command imports) is loaded only once the arguments are good.
    from services.mcp.caller import Caller
    from services.mcp.stdio import serve_stdio
    from shared.observability.logging import setup_logging

    setup_logging("WARNING", json=False)
    asyncio.run(serve_stdio(info, Caller(token=token, agent_config_id=target, session_id=session)))


@app.command()
def reindex(
    data_dir: Path = DATA_DIR, batch: int = typer.Option(256, help="Entries per embedding call.")
) -> None:
    """Rebuild every vector from Postgres (after changing the embedder, or to repair the index).

    Run it with the services stopped when the vector store is Qdrant Edge (in-process)."""
    import asyncio
    import contextlib

    from engram_client.contracts.connection import connection_file
    from engram_client.contracts.errors import Unavailable
    from rich.progress import Progress

    from services.reindex import reindex_all
    from services.runtime import build_embedder, build_vector_index, edge_store_path
    from shared.adapters.vectors.edge_lock import EdgeStoreInUse, exclusive_edge_store
    from shared.runtime.settings import EngramSettings

    settings = EngramSettings()
    if not settings.database_url:
        info = _connection(data_dir) if connection_file(data_dir).exists() else {}
        settings = settings.model_copy(
            update={"database_url": info.get("database_url", ""), "data_dir": data_dir}
        )
    if not settings.database_url:
        raise typer.BadParameter("set ENGRAM_DATABASE_URL, or run `engram up` once so the data dir knows it")

    async def main() -> None:
        async with contextlib.AsyncExitStack() as held:
            embedder = build_embedder(settings)
            held.push_async_callback(embedder.aclose)
            if not settings.vector_store:  # Qdrant Edge: refused while a running service holds it
                try:
                    held.enter_context(exclusive_edge_store(edge_store_path(settings, embedder)))
                except EdgeStoreInUse as exc:
                    raise Unavailable(
                        f"the vector store is in use by {exc.holder}: stop it first (Ctrl-C), then "
                        "run `engram reindex` (Qdrant Edge opens in one process only)"
                    ) from None
            await rebuild(embedder)

    async def rebuild(embedder: Any) -> None:
        index = build_vector_index(settings, embedder)
        if index is None:
            raise typer.BadParameter("ENGRAM_VECTOR_STORE=none: there is no vector store to rebuild")
        try:
            with Progress(console=console) as progress:
                task = progress.add_task("re-embedding", total=None)
                total = await reindex_all(
                    settings.database_url,
                    embedder,
                    index,
                    batch=batch,
                    progress=lambda done, of: progress.update(task, completed=done, total=of),
                )
            console.print(f"[green]reindexed[/] {total} entries with {embedder.name}")
        finally:
            await index.close()

    asyncio.run(main())


@token_app.command("mint")
def token_mint(
    org: UUID = typer.Option(None, help="Organization id (default: the data dir's, from connection.json)."),
    kind: str = typer.Option(..., help="none | end_user | actor | service"),
    id: str = typer.Option(None, "--id", help="Principal id (not for kind none)."),
    perm: list[str] = typer.Option(["memory.read", "memory.write"], help="Repeat for each permission."),
    agent_config: UUID = typer.Option(None, help="Restrict to one agent config."),
    session: str = typer.Option(None, help="Restrict to one session."),
    ttl: int = typer.Option(3600, help="Seconds until it expires."),
    data_dir: Path = DATA_DIR,
    url: str = URL,
    connection: Path = CONNECTION,
    token: str = TOKEN,
) -> None:
    """Print a signed token (keys from ENGRAM_TOKEN_KEYS, else the data dir's development key; with
    --url or --connection, from a running deployment's admin API)."""
    from engram_client.contracts.common import Principal
    from engram_client.contracts.connection import ConnectionInfo, connection_file

    remote = Remote(url, connection, token)
    if remote.given:
        if org is None:
            raise typer.BadParameter("give --org", param_hint="--org")
        with remote.client() as client:
            minted = client.admin_mint_token(
                org,
                {"kind": kind, "id": id},
                permissions=perm,
                ttl_seconds=ttl,
                agent_config_id=agent_config,
                session_id=session,
            )
        typer.echo(minted.token)
        return

    from services.cli.credentials import signing_keys
    from shared.runtime.settings import EngramSettings
    from shared.security.auth import KNOWN_PERMISSIONS, TokenService

    settings = EngramSettings()
    keys = signing_keys(data_dir)
    if org is None:
        org_id = (
            ConnectionInfo.load(connection_file(data_dir)).org_id
            if connection_file(data_dir).exists()
            else None
        )
        if org_id is None:
            raise typer.BadParameter(
                "give --org (no connection.json in the data dir names one)", param_hint="--org"
            )
        org = org_id
    unknown = set(perm) - KNOWN_PERMISSIONS
    if unknown:
        raise typer.BadParameter(
            f"unknown permissions {sorted(unknown)}; choose from {sorted(KNOWN_PERMISSIONS)}"
        )
    token = TokenService(keys, settings.token_issuer).mint(
        org_id=org,
        principal=Principal.model_validate({"kind": kind, "id": id}),
        permissions=set(perm),
        ttl_seconds=ttl,
        agent_config_id=agent_config,
        session_id=session,
    )
    typer.echo(token)


@app.command()
def export(
    actor: str = typer.Option(..., "--actor", help="Whose memory: end_user:ID, actor:ID or none."),
    agent_config: UUID = typer.Option(
        None, "--agent-config", "--agent", help="One agent config (default: all the token may see)."
    ),
    lifecycle: list[str] = typer.Option(None, "--lifecycle", help="Repeat: active, disabled, superseded ..."),
    page_size: int = typer.Option(500, "--page-size"),
    data_dir: Path = DATA_DIR,
    nats_url: str = "",
    token: str = "",
) -> None:
    """Write an owner's memory to stdout as JSON Lines (one entry per line); progress on stderr.

    engram export --actor end_user:alice > alice.jsonl"""
    import asyncio
    import sys

    from rich.console import Console
    from rich.progress import Progress

    url, tok = _client_args(data_dir, nats_url, token)
    fields: dict[str, Any] = {"page_size": page_size}
    if agent_config is not None:
        fields["agent_config_id"] = agent_config
    if lifecycle:
        fields["lifecycle"] = lifecycle

    async def main() -> int:
        written = 0
        with Progress(console=Console(stderr=True), transient=True) as progress:
            task = progress.add_task(f"exporting {actor}", total=None)
            async with await _engram(data_dir, url, tok) as client:
                async for page in client.export(actor, **fields):
                    for entry in page.entries:
                        sys.stdout.write(entry.model_dump_json() + "\n")
                    written += len(page.entries)
                    progress.update(task, completed=written)
        sys.stdout.flush()
        return written

    count = asyncio.run(main())
    Console(stderr=True).print(f"[green]exported[/] {count} entries of {actor}")


@app.command()
def purge(
    actor: str = typer.Option(..., "--actor", help="Whose memory: end_user:ID, actor:ID or none."),
    agent_config: UUID = typer.Option(
        None, "--agent-config", "--agent", help="One agent config (default: all)."
    ),
    session: str = typer.Option(None, "--session", help="Only this session's memory."),
    yes: bool = typer.Option(False, "--yes", help="Do not ask for confirmation."),
    data_dir: Path = DATA_DIR,
    nats_url: str = "",
    token: str = "",
) -> None:
    """Erase an owner's memory everywhere (rows, vectors, caches, recall history); prints the receipt."""
    import asyncio

    if not yes:
        typer.confirm(
            f"Erase all memory of {actor}{f' in session {session}' if session else ''}?", abort=True
        )
    url, tok = _client_args(data_dir, nats_url, token)
    fields: dict[str, Any] = {"agent_config_id": agent_config, "session_id": session}

    async def main() -> None:
        async with await _engram(data_dir, url, tok) as client:
            receipt = await client.purge(actor, **{k: v for k, v in fields.items() if v is not None})
        console.print_json(receipt.model_dump_json(exclude={"entry_ids"}))

    asyncio.run(main())


@audit_app.command("tail")
def audit_tail(
    org: UUID = typer.Option(
        None, "--org", help="This organization's records (default: the data dir's), and the system chain's."
    ),
    kind: str = typer.Option("*.*", "--kind", help="Record kinds, e.g. memory.purged or memory.*"),
    from_start: bool = typer.Option(False, "--from-start", help="Replay what the stream still holds first."),
    limit: int = typer.Option(0, "--limit", help="Stop after this many records (0 = follow until Ctrl-C)."),
    data_dir: Path = DATA_DIR,
    nats_url: str = "",
) -> None:
    """Follow the audit stream (``engram.audit.<kind>`` on ENGRAM_AUDIT), one line per record, whole: one
    organization's, and the system chain's (marked ``system``: records about input that named no
    verified organization, such as a tokenless session's ``session.rejected``). Reading the stream
    takes an audit reader's NATS identity, which is the deployment operator's."""
    from engram_client.contracts.common import SYSTEM_ORG
    from engram_client.contracts.connection import connection_file
    from rich.markup import escape

    if org is None and connection_file(data_dir).exists():
        org = UUID(_connection(data_dir)["org_id"])
    shown = {str(SYSTEM_ORG)} | ({str(org)} if org is not None else set())

    def show(msg: Any) -> bool:
        record = json.loads(msg.data)
        if org is not None and record.get("org_id") not in shown:
            return False
        ids = record.get("entry_ids") or []
        when = str(record.get("occurred_at", ""))[:23]
        # The whole record on one line: its details are what says why (a rejection's reason).
        details = json.dumps(record.get("details") or {}, sort_keys=True, ensure_ascii=False)
        chain = "system " if record.get("org_id") == str(SYSTEM_ORG) else ""
        console.print(
            f"{when} {chain}#{record.get('seq')} [bold]{escape(str(record.get('kind')))}[/] "
            f"by {escape(record.get('actor_ref') or '-')} ids={len(ids)} {escape(details)}",
            highlight=False,
            soft_wrap=True,
        )
        return True

    _read_stream(
        data_dir,
        nats_url,
        "ENGRAM_AUDIT",
        f"engram.audit.{kind}",
        show,
        from_start=from_start,
        follow=True,
        limit=limit,
    )


@app.command()
def dlq(
    follow: bool = typer.Option(False, "--follow", help="Keep waiting for new rejections (Ctrl-C stops)."),
    source: str = typer.Option(">", "--source", help="Only this source, e.g. session or save."),
    limit: int = typer.Option(0, "--limit", help="Stop after this many (0 = all)."),
    data_dir: Path = DATA_DIR,
    nats_url: str = "",
) -> None:
    """What Engram could not process (``engram.dlq.<source>`` on ENGRAM_DLQ, kept 7 days), one line
    each: when, whose (``org=<id>``, or ``org=system`` when no valid token named one), the subject
    it came on, the error code and reason, and the original's sha256. Every organization's: reading
    the stream takes a dead-letter reader's NATS identity, the deployment operator's. The kept copy
    of the original (PII replaced) is never printed."""
    from engram_client.contracts.events import DeadLetter
    from rich.console import Console
    from rich.markup import escape

    def show(msg: Any) -> bool:
        letter = DeadLetter.model_validate_json(msg.data)
        console.print(
            f"{letter.occurred_at.isoformat(timespec='seconds')} {_org_label(letter.org_id)} "
            f"{letter.source_subject} "
            f"[bold]{letter.code}[/]: {escape(letter.reason)} sha256={letter.original_sha256 or '-'} "
            f"event={letter.original_event_id or '-'} deliveries={letter.deliveries}"
            + (f" redacted={','.join(letter.redactions)}" if letter.redactions else ""),
            highlight=False,
            markup=True,
            soft_wrap=True,
        )
        return True

    count = _read_stream(
        data_dir,
        nats_url,
        "ENGRAM_DLQ",
        f"engram.dlq.{source}",
        show,
        from_start=True,
        follow=follow,
        limit=limit,
    )
    if not follow:
        Console(stderr=True).print(f"{count} dead letters", highlight=False)


def _read_stream(
    data_dir: Path,
    nats_url: str,
    stream: str,
    subject: str,
    show: Callable[[Any], bool],
    *,
    from_start: bool,
    follow: bool,
    limit: int,
) -> int:
    """:func:`services.cli.streams.read_stream` for ``engram audit tail`` and ``engram dlq``: on
    --nats-url, else ENGRAM_NATS_URL, else connection.json's NATS (with the development client's
    identity when it is that one); returns how many ``show`` counted."""
    import asyncio

    from services.cli.streams import read_stream
    from shared.runtime.settings import EngramSettings

    url = nats_url or EngramSettings().nats_url or _connection(data_dir)["nats_url"]
    return asyncio.run(
        read_stream(
            url,
            _nats_options(data_dir, url),
            subject=subject,
            stream=stream,
            from_start=from_start,
            follow=follow,
            limit=limit,
            show=show,
        )
    )


def _org_label(org_id: UUID | None) -> str:
    from engram_client.contracts.common import SYSTEM_ORG

    if org_id is None:
        return "org=-"
    return "org=system" if org_id == SYSTEM_ORG else f"org={org_id}"


@audit_app.command("verify")
def audit_verify(data_dir: Path = DATA_DIR, nats_url: str = "", token: str = "") -> None:
    """Check the organization's audit chain; exits 1 and names the first broken record if any."""
    import asyncio

    url, tok = _client_args(data_dir, nats_url, token)

    async def main() -> bool:
        async with await _engram(data_dir, url, tok) as client:
            reply = await client.audit_verify()
        if reply.ok:
            console.print(f"[green]audit chain verified[/]: {reply.checked} records")
        else:
            broken = reply.first_broken
            console.print(
                f"[red]audit chain BROKEN[/] at record {broken.seq if broken else '?'}: "
                f"{broken.reason if broken else ''} (id {broken.record_id if broken else '-'})"
            )
        return reply.ok

    if not asyncio.run(main()):
        raise typer.Exit(1)


@config_app.command("get")
def config_get(
    agent_config: UUID = typer.Option(None), data_dir: Path = DATA_DIR, nats_url: str = "", token: str = ""
) -> None:
    """Print an agent config's memory config (default: the development agent config)."""
    import asyncio

    url, tok = _client_args(data_dir, nats_url, token)
    target = agent_config or UUID(_connection(data_dir)["agent_config_id"])

    async def main() -> None:
        async with await _engram(data_dir, url, tok) as client:
            reply = await client.get_config(target)
        console.print_json(reply.model_dump_json())

    asyncio.run(main())


@config_app.command("set")
def config_set(
    pairs: list[str] = typer.Argument(
        ..., help="key=value, dotted keys for nested (retention.max_entries=1000)"
    ),
    agent_config: UUID = typer.Option(None),
    data_dir: Path = DATA_DIR,
    nats_url: str = "",
    token: str = "",
) -> None:
    """Change part of an agent config's memory config; values are JSON (true, 5, "x")."""
    import asyncio

    url, tok = _client_args(data_dir, nats_url, token)
    target = agent_config or UUID(_connection(data_dir)["agent_config_id"])
    patch: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep:
            raise typer.BadParameter(f"{pair!r} is not key=value")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        node = patch
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value

    async def main() -> None:
        async with await _engram(data_dir, url, tok) as client:
            reply = await client.put_config(target, patch)
        console.print_json(reply.model_dump_json())

    asyncio.run(main())


if __name__ == "__main__":
    app()
