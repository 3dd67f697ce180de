"""The distributed deployment on one machine: a 3-node NATS JetStream cluster, Postgres, Redis, and
every service as its own OS process (``engram serve …``) with replicas, each under its own
least-privilege NATS identity — what an orchestrator runs, small enough for loopback.

Processes are started, SIGKILLed, SIGTERMed and restarted here the way Kubernetes would; waits
are on conditions (``/readyz`` answering 200, a node's ``/healthz``), never on sleeps.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from shared.embedded.nats_server import free_port, port_in_use
from shared.embedded.postgres import EmbeddedPostgres
from shared.security.nats_auth.keys import new_user_seed, public_key_of
from shared.security.nats_auth.permissions import (
    EDGE_VECTOR_PROCESS,
    GATEWAY,
    Grant,
    Permissions,
    gateway_permissions,
    platform_permissions,
    process_name,
    process_permissions,
)
from shared.security.nats_auth.render import NatsUser, render_authorization
from shared.storage.db.engine import migrate
from tests.platform import until_nothing_missing
from tests.support.nats_cluster import NatsCluster
from tests.support.previous_release import previous_command

REPO = Path(__file__).resolve().parents[2]

#: What runs, and how many of each: every service in its own processes, two replicas each, except
#: embed and recall, which share the one process that may open the Qdrant Edge store (no Qdrant
#: server can run here; see docs/adr/0043-vector-stores.md); and the HTTP gateway,
#: two replicas (last: it needs no streams, and is ready only once the services answer).
DEPLOYMENT: dict[tuple[str, ...], int] = {
    ("ingest",): 2,
    ("distill",): 2,
    ("governance-audit",): 2,
    EDGE_VECTOR_PROCESS: 1,
    (GATEWAY,): 2,
}
PLATFORM_INBOX = "_INBOX_platform"
#: How long the harness waits for one ``/readyz`` answer: above the gateway's own bound on each
#: service's probe answer (2 s, ``services/gateway/bridge.py``), so a 503 naming the silent service
#: arrives rather than a client timeout that names nothing.
READYZ_TIMEOUT_S = 5.0
#: Between two looks at every process's readiness (all at once). Each look costs the deployment work (every
#: process pings Postgres; a gateway may probe the services), so the harness looks about as often
#: as an orchestrator does (Kubernetes: every 5 s), not ten times a second, and does not load the
#: deployment whose recovery it times.
READINESS_LOOK_S = 1.0
_EVERYTHING = Permissions(
    publish=(Grant("test observer", (">",)),), subscribe=(Grant("test observer", (">",)),)
)


def identity_name(names: Sequence[str]) -> str:
    """The NATS user of a process running ``names`` (``gateway`` for the HTTP gateway)."""
    return GATEWAY if tuple(names) == (GATEWAY,) else process_name(names)


def identity_permissions(names: Sequence[str]) -> Permissions:
    return gateway_permissions() if tuple(names) == (GATEWAY,) else process_permissions(names)


@dataclass
class Identities:
    """Seeds for every process kind, the platform client and the test's observer."""

    services: dict[str, str] = field(default_factory=dict)
    platform: str = field(default_factory=new_user_seed)
    observer: str = field(default_factory=new_user_seed)

    def seed_for(self, names: Sequence[str]) -> str:
        return self.services.setdefault(identity_name(names), new_user_seed())

    def auth_conf(self, deployment: dict[tuple[str, ...], int]) -> str:
        users = [
            NatsUser(
                public_key_of(self.seed_for(names)),
                identity_permissions(names),
                f"engram serve {' '.join(names)}",
            )
            for names in deployment
        ]
        users.append(NatsUser(public_key_of(self.platform), platform_permissions(PLATFORM_INBOX), "platform"))
        users.append(NatsUser(public_key_of(self.observer), _EVERYTHING, "test observer (never deployed)"))
        return render_authorization(users, "cluster harness users (tests/cluster/harness.py)")


class ServiceProcess:
    """One replica: ``engram serve <names>`` with its own health port and log file."""

    def __init__(self, names: Sequence[str], replica: int, env: dict[str, str], log_dir: Path) -> None:
        self.names = tuple(names)
        self.replica = replica
        self.label = f"{identity_name(names)}-{replica}"
        self.health_port = free_port()
        self.env = {**env, "ENGRAM_HEALTH_PORT": str(self.health_port), "ENGRAM_HEALTH_HOST": "127.0.0.1"}
        if self.names == (GATEWAY,):  # its probes are on its HTTP port
            self.env |= {"ENGRAM_HTTP_PORT": str(self.health_port), "ENGRAM_HTTP_HOST": "127.0.0.1"}
        self._log_dir = log_dir
        self.starts = 0
        #: Which code its current (or last) start runs: "current", or "previous" (an upgrade).
        self.release = "current"
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        #: Exit codes of every stop, in order (a SIGKILL shows as -9).
        self.exit_codes: list[int] = []

    def start(self, previous: Path | None = None) -> None:
        """Start it on this code, or on ``previous`` (the tree of the previous release)."""
        self.starts += 1
        self.release = "previous" if previous is not None else "current"
        if self._log is not None:
            self._log.close()
        self._log = self.log_path.open("wb")
        command = (
            [sys.executable, "-m", "services.cli.main"] if previous is None else previous_command(previous)
        )
        self.proc = subprocess.Popen(
            [*command, "serve", *self.names],
            cwd=REPO if previous is None else previous,
            env=self.env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    @property
    def log_path(self) -> Path:
        """The log of its current (or last) start."""
        return self._log_dir / f"{self.label}.{self.starts}.log"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def base_url(self) -> str:
        """Where its probes answer (and, for a gateway, its HTTP API)."""
        return f"http://127.0.0.1:{self.health_port}"

    def readyz(self) -> tuple[int, dict[str, Any]]:
        """``/readyz``'s status and body; 0 and ``{"error": …}`` when nothing answers."""
        try:
            url = f"{self.base_url}/readyz"
            with urllib.request.urlopen(url, timeout=READYZ_TIMEOUT_S) as r:  # noqa: S310 (http://, ours)
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read() or b"{}")
        except OSError as err:
            return 0, {"error": f"{type(err).__name__}: {getattr(err, 'reason', err)}"}

    def readiness(self) -> str:
        """ "" when ready; else what its probe said: exited, no answer, or which checks fail."""
        if not self.alive:
            return f"exited ({self.proc.returncode if self.proc else 'never started'}); see {self.log_path}"
        code, body = self.readyz()
        if code == 200:
            return ""
        if code == 0:
            return f"/readyz did not answer ({body.get('error')})"
        checks = body.get("checks") or {}
        failing = [name for name, ok in checks.items() if not ok]
        return f"/readyz {code}, failing: {', '.join(failing) or body}"

    async def wait_ready(self, timeout_s: float = 120.0) -> None:
        async def missing() -> list[str]:
            if not self.alive:
                raise RuntimeError(
                    f"{self.label} exited ({self.proc.returncode if self.proc else '?'}); see {self.log_path}"
                )
            seen = await asyncio.to_thread(self.readiness)
            return [f"{self.label}: {seen}"] if seen else []

        await until_nothing_missing(missing, what=f"{self.label} ready", timeout=timeout_s)

    def kill9(self) -> None:
        assert self.proc is not None, f"{self.label} never started"
        assert self.alive, f"{self.label} is not running"
        os.kill(self.proc.pid, signal.SIGKILL)
        self.exit_codes.append(self.proc.wait(10))

    async def terminate(self, timeout_s: float = 60.0) -> int:
        """SIGTERM and wait for the exit (the graceful drain); returns the exit code."""
        assert self.proc is not None, f"{self.label} never started"
        assert self.alive, f"{self.label} is not running"
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = await asyncio.to_thread(self.proc.wait, timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait(5)
        self.exit_codes.append(code)
        return code

    def close(self) -> None:
        if self.alive:
            assert self.proc is not None
            self.proc.kill()
            self.proc.wait(10)
        if self._log is not None:
            self._log.close()
            self._log = None


class RedisProcess:
    """A redis-server of the test's own (the machine's is shared), stopped and started at will."""

    def __init__(self, root: Path) -> None:
        self.port = free_port()
        self.dir = root
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server not found (Debian package redis-server)")
        self.dir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            cwd=self.dir,
            stdout=(self.dir / "redis.log").open("ab"),
            stderr=subprocess.STDOUT,
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while not port_in_use(self.port):
            if self.proc.poll() is not None or loop.time() > deadline:
                raise RuntimeError(f"redis-server did not start; see {self.dir / 'redis.log'}")
            await asyncio.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@dataclass
class Cluster:
    """Everything running: NATS nodes, Postgres, Redis, the service processes."""

    root: Path
    nats: NatsCluster
    postgres: EmbeddedPostgres
    database_url: str
    redis: RedisProcess
    identities: Identities
    token_keys: str
    processes: list[ServiceProcess]

    def of(self, names: Sequence[str]) -> list[ServiceProcess]:
        return [p for p in self.processes if p.names == tuple(names)]

    async def wait_all_ready(self, timeout_s: float = 180.0) -> None:
        async def missing() -> list[str]:
            seen = await asyncio.gather(*(asyncio.to_thread(p.readiness) for p in self.processes))
            return [f"{p.label}: {s}" for p, s in zip(self.processes, seen, strict=True) if s]

        await until_nothing_missing(
            missing, what="every process ready", timeout=timeout_s, interval=READINESS_LOOK_S
        )

    def nats_options(self, seed: str, inbox: str) -> dict[str, Any]:
        return {
            "servers": self.nats.urls.split(","),
            "nkeys_seed_str": seed,
            "inbox_prefix": inbox,
            "max_reconnect_attempts": -1,
            "reconnect_time_wait": 0.2,
        }


def service_env(
    *,
    nats_urls: str,
    seed: str,
    database_url: str,
    redis_url: str,
    token_keys: str,
    data_dir: Path,
    ack_wait_s: float,
    stream_replicas: int = 3,
) -> dict[str, str]:
    """The environment of one service process (the same variables infra/compose sets)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_")}
    env.update(
        ENGRAM_NATS_URL=nats_urls,
        ENGRAM_NATS_NKEY_SEED=seed,
        ENGRAM_DATABASE_URL=database_url,
        ENGRAM_REDIS_URL=redis_url,
        ENGRAM_TOKEN_KEYS=token_keys,
        ENGRAM_STREAM_REPLICAS=str(stream_replicas),
        ENGRAM_EMBEDDER="hashing-384",
        ENGRAM_DATA_DIR=str(data_dir),
        # What a killed replica held un-acked is redelivered after this (the product's default is
        # 5 s: docs/adr/0006-ack-wait-and-heartbeats.md).
        ENGRAM_ACK_WAIT_S=str(ack_wait_s),
        ENGRAM_MAX_DELIVER="5",
        ENGRAM_REDELIVER_BACKOFF_S="[0.5, 1.0, 2.0]",
        ENGRAM_OTEL_EXPORTER="none",
        ENGRAM_LOG_LEVEL="INFO",
        ENGRAM_SHUTDOWN_TIMEOUT_S="25",
    )
    return env


@asynccontextmanager
async def running_cluster(
    root: Path,
    token_keys: str,
    deployment: dict[tuple[str, ...], int] = DEPLOYMENT,
    *,
    ack_wait_s: float = 10.0,
    nodes: int = 3,
) -> AsyncIterator[Cluster]:
    """Start the whole deployment and yield once every process answers ``/readyz``; ``nodes=1``
    is a single NATS server with R1 streams (``engram up``'s shape)."""
    identities = Identities()
    nats = NatsCluster(root / "nats", identities.auth_conf(deployment), size=nodes)
    postgres = EmbeddedPostgres(root / "pg")
    redis = RedisProcess(root / "redis")
    processes: list[ServiceProcess] = []
    logs = root / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    try:
        await nats.start()
        database_url = await postgres.start()
        await migrate(database_url)
        await redis.start()
        for names, replicas in deployment.items():
            env = service_env(
                nats_urls=nats.urls,
                seed=identities.seed_for(names),
                database_url=database_url,
                redis_url=redis.url,
                token_keys=token_keys,
                data_dir=root / "data" / identity_name(names),
                ack_wait_s=ack_wait_s,
                stream_replicas=min(3, nodes),
            )
            processes += [ServiceProcess(names, i + 1, env, logs) for i in range(replicas)]
        cluster = Cluster(root, nats, postgres, database_url, redis, identities, token_keys, processes)
        # One process first creates the R3 streams, so the others find them rather than race.
        processes[0].start()
        await processes[0].wait_ready()
        for process in processes[1:]:
            process.start()
        await cluster.wait_all_ready()
        yield cluster
    finally:
        for process in processes:
            process.close()
        redis.stop()
        await postgres.stop()
        await nats.stop()
