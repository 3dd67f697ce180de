"""A network partition (issue 25 §3): one node of a 3-node JetStream cluster runs in a Linux
network namespace of the test's own, reached over a veth pair (10.250.25.1/30 ↔ 10.250.25.2/30,
nothing leaves the machine); the link is cut with ``ip link set … down`` and healed. Writes go on
through the majority across the cut; a client of the isolated node must not get a write
acknowledged that the node cannot replicate; after healing, the isolated node holds every
acknowledged write exactly once. Runs in ``make cluster-bench`` (needs root for namespaces)."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats
import nats.errors
import pytest
from nats.js.api import StreamConfig

from shared.embedded.nats_server import find_nats_server
from tests.platform import eventually
from tests.support.nats_cluster import ClusterNode

pytestmark = [pytest.mark.partition]

NS = f"engram-part-{os.getpid()}"
HOST_IF, NS_IF = f"ep{os.getpid() % 100000}h", f"ep{os.getpid() % 100000}n"
HOST_IP, NS_IP = "10.250.25.1", "10.250.25.2"
STREAM, SUBJECT = "PARTITION", "partition.w"


def _ip(*args: str, ns: bool = False) -> None:
    cmd = ["ip", "netns", "exec", NS, "ip", *args] if ns else ["ip", *args]
    subprocess.run(cmd, check=True, capture_output=True)


def _namespaces_permitted() -> str | None:
    """Why namespaces cannot be used here, or None."""
    if shutil.which("ip") is None:
        return "no `ip` command"
    if os.geteuid() != 0:
        return "network namespaces need root"
    probe = subprocess.run(["ip", "netns", "add", NS], capture_output=True)
    if probe.returncode != 0:
        return f"`ip netns add` refused: {probe.stderr.decode().strip()}"
    return None


@pytest.fixture
def link() -> Iterator[None]:
    """The namespace and its veth pair, removed afterwards whatever happened."""
    reason = _namespaces_permitted()
    if reason is not None:
        pytest.skip(f"partition test skipped: {reason}")
    try:
        _ip("link", "add", HOST_IF, "type", "veth", "peer", "name", NS_IF)
        _ip("link", "set", NS_IF, "netns", NS)
        _ip("addr", "add", f"{HOST_IP}/30", "dev", HOST_IF)
        _ip("link", "set", HOST_IF, "up")
        _ip("addr", "add", f"{NS_IP}/30", "dev", NS_IF, ns=True)
        _ip("link", "set", NS_IF, "up", ns=True)
        _ip("link", "set", "lo", "up", ns=True)
        yield
    finally:
        subprocess.run(["ip", "link", "del", HOST_IF], capture_output=True)
        subprocess.run(["ip", "netns", "del", NS], capture_output=True)


class _IsolatedNode(ClusterNode):
    """The cluster node inside the namespace, listening on its veth address. The other two listen
    on loopback (which the cut does not touch) and route to it over the veth."""

    def __init__(self, root: Path, name: str) -> None:
        super().__init__(root, name, "127.0.0.1")
        self.host = NS_IP

    def start(self) -> None:
        log = (self.dir / "nats-server.log").open("ab")
        self.proc = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                NS,
                find_nats_server(),
                "-c",
                str((self.dir / "nats-server.conf").resolve()),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()


@pytest.fixture
async def nodes(link: None, tmp_path: Path) -> AsyncIterator[list[ClusterNode]]:
    nodes = [ClusterNode(tmp_path, "n1"), ClusterNode(tmp_path, "n2"), _IsolatedNode(tmp_path, "n3")]
    for node in nodes:
        node.write_config(nodes, "")
    for node in nodes:
        node.start()
    try:
        yield nodes
    finally:
        for node in nodes:
            node.kill()


#: Publishes one message to the isolated node from inside the namespace; prints ACKED or FAILED.
_MINORITY_CLIENT = """
import asyncio, sys, nats
async def main():
    try:
        nc = await nats.connect(sys.argv[1], connect_timeout=2, max_reconnect_attempts=0)
        await nc.jetstream().publish(sys.argv[2], b"minority", headers={"Nats-Msg-Id": "minority"}, timeout=3)
        print("ACKED")
    except Exception as err:
        print("FAILED", type(err).__name__)
asyncio.run(main())
"""


async def test_isolated_node_acknowledges_nothing_and_catches_up_after_the_partition(
    nodes: list[ClusterNode],
) -> None:
    n3 = nodes[2]
    urls = [n.url for n in nodes[:2]]
    nc = await nats.connect(urls, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
    js = nc.jetstream()
    run = uuid.uuid4().hex[:8]
    acked: list[str] = []
    failed = {"before": 0, "during": 0, "after": 0}

    async def write(phase: str, count: int) -> None:
        for i in range(count):
            msg_id = f"{run}-{phase}-{i}"
            for _ in range(20):
                try:
                    await js.publish(SUBJECT, msg_id.encode(), headers={"Nats-Msg-Id": msg_id}, timeout=3)
                    acked.append(msg_id)
                    break
                except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
                    failed[phase] += 1
                    await asyncio.sleep(0.5)
            else:
                raise AssertionError(f"{msg_id} never acknowledged")

    async def stream_ready() -> bool:
        try:
            await js.add_stream(StreamConfig(name=STREAM, subjects=[SUBJECT], num_replicas=3))
        except (nats.errors.Error, nats.js.errors.Error):
            return False
        return True

    try:
        await eventually(stream_ready, timeout=60, interval=0.5, what="the R3 stream created")
        await write("before", 50)
        _ip("link", "set", HOST_IF, "down")  # the partition
        await write("during", 50)
        minority = await asyncio.to_thread(
            subprocess.run,
            ["ip", "netns", "exec", NS, sys.executable, "-c", _MINORITY_CLIENT, n3.url, SUBJECT],
            capture_output=True,
            text=True,
            timeout=60,
        )
        _ip("link", "set", HOST_IF, "up")  # healed
        await write("after", 50)

        async def n3_caught_up() -> bool:
            try:
                jsz = await asyncio.to_thread(n3.monitor, "/jsz?streams=true")
            except OSError:
                return False
            return int(jsz.get("messages", 0)) >= len(acked)

        await eventually(n3_caught_up, timeout=60, interval=0.5, what="the isolated node caught up")
        # Read the stream back through the healed node itself.
        n3_nc = await nats.connect(n3.url)
        try:
            sub = await n3_nc.jetstream().subscribe(SUBJECT, ordered_consumer=True)
            got: list[str] = []
            while len(got) < len(acked):
                msg = await sub.next_msg(timeout=10)
                got.append(msg.data.decode())
            info = await n3_nc.jetstream().stream_info(STREAM)
        finally:
            await n3_nc.close()
    finally:
        await nc.close()
    lost = len(set(acked) - set(got))
    duplicated = len(got) - len(set(got))
    minority_acked = int(minority.stdout.startswith("ACKED"))
    print(
        f"\nFAULT partition: writes={len(acked)} failed_before={failed['before']} "
        f"failed_during={failed['during']} failed_after={failed['after']} minority={minority.stdout.strip()} "
        f"stream_messages={info.state.messages} lost={lost} duplicated={duplicated}"
    )
    assert minority_acked == 0, "the isolated node acknowledged a write it could not replicate"
    assert lost == 0
    assert duplicated == 0
    assert info.state.messages == len(acked), "the stream holds writes nobody had acknowledged"
