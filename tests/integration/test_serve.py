"""`engram serve` as an orchestrator runs it: its own least-privilege identity, health probes, a
graceful drain on SIGTERM (exit 0), a refusal when another process holds the Qdrant Edge store;
streams replicated on a real 3-node cluster; TLS to NATS passed through to nats-py."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from uuid import UUID

import httpx
import nats
import pytest
from pydantic import SecretStr

from services.runtime import running_services
from shared.adapters.vectors.edge_lock import exclusive_edge_store
from shared.embedded.nats_server import NatsServerProcess, free_port, port_in_use
from shared.runtime.settings import EngramSettings
from shared.security.nats_auth.keys import new_user_seed, public_key_of
from shared.security.nats_auth.permissions import Grant, Permissions
from shared.security.nats_auth.render import NatsUser, render_authorization
from shared.service.infra import Infra
from tests.platform import eventually, publish_session, session_payload
from tests.support.nats_cluster import NatsCluster
from tests.support.servers import SecuredNatsServer

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def _serve_env(settings: EngramSettings, seed: str, health_port: int, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_")}
    env.update(
        ENGRAM_NATS_URL=settings.nats_url,
        ENGRAM_NATS_NKEY_SEED=seed,
        ENGRAM_DATABASE_URL=settings.database_url,
        ENGRAM_TOKEN_KEYS=settings.token_keys.get_secret_value(),
        ENGRAM_HEALTH_PORT=str(health_port),
        ENGRAM_HEALTH_HOST="127.0.0.1",
        ENGRAM_OTEL_EXPORTER="none",
        ENGRAM_EMBEDDER="hashing-384",
        **extra,
    )
    return env


def _spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "services.cli.main", "serve", *args],
        cwd=REPO,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )


def _readyz(port: int) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())
    except OSError:
        return 0, {}


async def test_serve_answers_probes_and_drains_on_sigterm(
    nats_proc: SecuredNatsServer,
    settings: EngramSettings,
    nc: nats.aio.client.Client,
    org: UUID,
    agent: UUID,
    service_token: str,
    tmp_path: Path,
) -> None:
    """`engram serve ingest` under its own identity: ready on /readyz with every check, handles a
    session, and on SIGTERM finishes and exits 0."""
    port = free_port()
    proc = _spawn(
        ["ingest"], _serve_env(settings, nats_proc.service_seeds["ingest"], port), tmp_path / "ingest.log"
    )
    try:

        async def ready() -> bool:
            assert proc.poll() is None, (tmp_path / "ingest.log").read_text()
            return port_in_use(port) and (await asyncio.to_thread(_readyz, port))[0] == 200

        await eventually(ready, timeout=60, what="engram serve ingest ready")
        _, body = _readyz(port)
        assert body["checks"] == {"not_draining": True, "started": True, "nats": True, "postgres": True}
        await publish_session(nc, session_payload(org, agent), service_token)
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(proc.wait, 60)
    finally:
        if proc.poll() is None:
            proc.kill()
    log = (tmp_path / "ingest.log").read_text()
    assert code == 0, log
    assert "draining" in log
    assert "drained; exiting" in log
    assert not nats_proc.log_lines("Violation"), "the ingest identity overstepped its permissions"


async def test_serve_gateway_under_its_own_identity_answers_and_stops_on_sigterm(
    engram: object,
    nats_proc: SecuredNatsServer,
    settings: EngramSettings,
    agent: UUID,
    service_token: str,
    tmp_path: Path,
) -> None:
    """`engram serve gateway` with the production `gateway` user, the token keys and nothing else
    (no database): ready once the services answer, serves a recall and a session, exits 0 on
    SIGTERM, and never oversteps its NATS permissions."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_")}
    env.update(
        ENGRAM_NATS_URL=settings.nats_url,
        ENGRAM_NATS_NKEY_SEED=nats_proc.service_seeds["gateway"],
        ENGRAM_TOKEN_KEYS=settings.token_keys.get_secret_value(),
        ENGRAM_HTTP_HOST="127.0.0.1",
        ENGRAM_HTTP_PORT=str(port),
    )
    log = tmp_path / "gateway.log"
    proc = _spawn(["gateway"], env, log)
    try:

        async def ready() -> bool:
            assert proc.poll() is None, log.read_text()
            return port_in_use(port) and (await asyncio.to_thread(_readyz, port))[0] == 200

        await eventually(ready, timeout=60, what="engram serve gateway ready")
        # Async: the services answering it run on this test's event loop.
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            reply = await http.post(
                "/v1/recall",
                json={"agent_config_id": str(agent), "strategy": "last_k"},
                headers={"Authorization": f"Bearer {service_token}"},
            )
        assert reply.status_code == 200, reply.text
        assert reply.json()["results"] == []
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(proc.wait, 60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0, log.read_text()
    assert not nats_proc.log_lines("Violation"), "the gateway identity overstepped its permissions"


async def test_serve_gateway_without_token_keys_refuses_to_start(
    nats_proc: SecuredNatsServer, settings: EngramSettings, tmp_path: Path
) -> None:
    """`engram serve gateway` without ENGRAM_TOKEN_KEYS exits non-zero at once, naming it, rather
    than serve MCP clients whose tokens it cannot verify."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_")}
    env.update(
        ENGRAM_NATS_URL=settings.nats_url,
        ENGRAM_NATS_NKEY_SEED=nats_proc.service_seeds["gateway"],
        ENGRAM_HTTP_HOST="127.0.0.1",
        ENGRAM_HTTP_PORT=str(free_port()),
    )
    proc = _spawn(["gateway"], env, tmp_path / "gateway.log")
    try:
        code = await asyncio.to_thread(proc.wait, 60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = (tmp_path / "gateway.log").read_text()
    assert code != 0, log
    assert "ENGRAM_TOKEN_KEYS" in log


async def test_serve_recall_refuses_an_edge_store_another_process_holds(
    nats_proc: SecuredNatsServer, settings: EngramSettings, tmp_path: Path
) -> None:
    """`engram serve recall` on Qdrant Edge while another process holds the store exits 2 and
    says what to do instead."""
    data_dir = tmp_path / "data"
    store = data_dir.resolve() / "vectors" / "engram_hashing_384"
    env = _serve_env(settings, nats_proc.service_seeds["recall"], free_port(), ENGRAM_DATA_DIR=str(data_dir))
    with exclusive_edge_store(store):  # what `engram up` or `engram serve embed recall` holds
        proc = _spawn(["recall"], env, tmp_path / "recall.log")
        code = await asyncio.to_thread(proc.wait, 60)
    log = (tmp_path / "recall.log").read_text()
    assert code == 2, log
    assert "refused to start" in log
    assert "held by another process" in log
    assert "ENGRAM_VECTOR_STORE" in log


async def test_streams_are_replicated_three_times_on_a_cluster(
    database_url: str, org: UUID, agent: UUID, service_token: str, tmp_path: Path
) -> None:
    """With ENGRAM_STREAM_REPLICAS=3 and a seed list of three nodes, every stream is R3 and a
    session flows through."""
    seed = new_user_seed()
    everything = Permissions(publish=(Grant("test", (">",)),), subscribe=(Grant("test", (">",)),))
    cluster = NatsCluster(
        tmp_path / "nats", render_authorization([NatsUser(public_key_of(seed), everything)])
    )
    await cluster.start()
    try:
        settings = EngramSettings(
            nats_url=cluster.urls,
            nats_nkey_seed=SecretStr(seed),
            database_url=database_url,
            token_keys=SecretStr(f"test-key={'t' * 40}"),
            stream_replicas=3,
            vector_store="none",
            _env_file=None,  # type: ignore[call-arg]
        )
        async with running_services(settings, ["ingest", "governance-audit"]) as infra:
            for stream in ("ENGRAM_SESSIONS", "ENGRAM_MEMORY", "ENGRAM_AUDIT", "ENGRAM_DLQ", "ENGRAM_FEED"):
                info = await infra.js.stream_info(stream)
                assert info.config.num_replicas == 3
                assert info.cluster is not None
                assert len(info.cluster.replicas or []) == 2
            client = await nats.connect(cluster.urls.split(","), nkeys_seed_str=seed)
            try:
                payload = session_payload(org, agent)
                # An R3 publish waits for a quorum's fsync (sync_interval: always), and on a busy
                # machine the stream's leader may still be settling (no responders): retry as a
                # platform's publisher does, the same session until the ack arrives (ingest takes
                # its event_id once).
                headers = {"Authorization": f"Bearer {service_token}"}
                # nats-py reports a stream without a leader as NoStreamResponseError (its no responders).
                settling = (nats.errors.NoRespondersError, nats.js.errors.NoStreamResponseError, TimeoutError)
                failures: list[str] = []

                async def published() -> bool:
                    try:
                        await client.jetstream().publish(
                            "engram.session.ended", json.dumps(payload).encode(), headers=headers, timeout=15
                        )
                    except settling as exc:
                        failures.append(type(exc).__name__)
                        return False
                    return True

                await eventually(
                    published,
                    timeout=180,
                    what=lambda: f"a session acknowledged by the R3 stream (failed: {failures[-5:]})",
                )
                consumer = await client.jetstream().consumer_info("ENGRAM_SESSIONS", "ingest")
                assert consumer.config.num_replicas in (0, 3)
            finally:
                await client.close()
    finally:
        await cluster.stop()


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


async def test_tls_to_nats_is_verified_with_the_configured_ca(database_url: str, tmp_path: Path) -> None:
    """ENGRAM_NATS_TLS_CA_FILE reaches nats-py: the services connect to a TLS-only nats-server
    whose certificate that CA signed, and a process without the CA cannot connect."""
    ca_key, ca, key, csr, cert = (tmp_path / n for n in ("ca.key", "ca.crt", "srv.key", "srv.csr", "srv.crt"))
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key), "-out", str(ca),
             "-days", "1", "-subj", "/CN=engram-test-ca")  # fmt: skip
    _openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        str(key),
        "-out",
        str(csr),
        "-subj",
        "/CN=127.0.0.1",
    )
    ext = tmp_path / "san.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1\n")
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
             "-out", str(cert), "-days", "1", "-extfile", str(ext))  # fmt: skip

    class TlsNats(NatsServerProcess):
        def _write_config(self) -> Path:
            conf = super()._write_config()
            with conf.open("a") as f:
                f.write(f'tls {{\n  cert_file: "{cert}"\n  key_file: "{key}"\n}}\n')
            return conf

    server = TlsNats(tmp_path / "nats")
    await server.start()
    try:
        base = {
            "nats_url": server.url,
            "database_url": database_url,
            "token_keys": SecretStr(f"test-key={'t' * 40}"),
            "vector_store": "none",
            "_env_file": None,
        }
        settings = EngramSettings(**base, nats_tls_ca_file=str(ca))  # type: ignore[arg-type]
        async with running_services(settings, ["governance-audit"]) as infra:
            assert infra.nc.is_connected
            assert infra.nc.connected_url is not None
        without_ca = EngramSettings(**base)  # type: ignore[arg-type]
        with pytest.raises(Exception):  # noqa: B017, PT011 (nats-py raises what the TLS layer raised)
            async with asyncio.timeout(20), running_services(without_ca, ["governance-audit"]):
                pass
    finally:
        await server.stop()


async def test_liveness_answers_while_starting_and_sigterm_stops_a_start_that_waits(
    settings: EngramSettings, tmp_path: Path
) -> None:
    """With NATS unreachable, /healthz is 200 and /readyz 503 (not started); SIGTERM ends the
    waiting start-up with exit 0 instead of hanging until a SIGKILL."""
    port = free_port()
    unreachable = EngramSettings(
        nats_url=f"nats://127.0.0.1:{free_port()}",
        database_url=settings.database_url,
        token_keys=settings.token_keys,
        _env_file=None,  # type: ignore[call-arg]
    )
    proc = _spawn(["governance-audit"], _serve_env(unreachable, "", port), tmp_path / "gov.log")
    try:

        async def probing() -> bool:
            assert proc.poll() is None, (tmp_path / "gov.log").read_text()
            return port_in_use(port)

        await eventually(probing, timeout=60, what="the health port open")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as reply:
            assert reply.status == 200
        status, body = _readyz(port)
        assert status == 503
        assert body["checks"] == {"not_draining": True, "started": False}
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(proc.wait, 60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0, (tmp_path / "gov.log").read_text()
    assert "stopped before start-up finished" in (tmp_path / "gov.log").read_text()


async def test_the_asyncapi_document_names_every_subject_a_running_service_serves(engram: Infra) -> None:
    """What the five services subscribe to when they run (not what the generator builds) is all in
    contracts/asyncapi.json, which the README calls the full wire contract."""
    from services.asyncapi import ASYNCAPI_FILE

    documented = {ch["address"] for ch in json.loads(ASYNCAPI_FILE.read_text())["channels"].values()}
    served = {sub.subject.broker_address for sub in engram.broker.subscribers}  # type: ignore[attr-defined]
    served |= {r.op.subject for r in engram.edge.routes}
    assert {"engram.recall", "engram.recall.expand", "engram.memory.feedback"} <= served
    assert served - documented == set()
