"""The distributed deployment under faults: a 3-node JetStream cluster (R3 streams), Postgres,
Redis, and every service as its own processes with replicas under their own NATS identities,
part of the workload through the two HTTP gateway replicas; every fault is counted — 0 lost,
0 duplicated, purged stays purged, the audit chain verifies, and no request (over NATS or HTTP)
fails once the deployment has recovered. Run by ``make cluster-test``."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import pytest

from tests.cluster.scenario import SHORT, UPGRADE, run

pytestmark = [pytest.mark.cluster, pytest.mark.faults]

RESULTS = Path(__file__).parent / ".results" / "cluster.json"


@pytest.fixture
def root() -> Iterator[Path]:
    """The deployment's directory, outside pytest's own: Postgres runs as another user when the
    tests run as root, and every pytest session on the machine resets /tmp/pytest-of-<user> to
    mode 0700, which would lock that user out of its data mid-run."""
    path = Path(tempfile.mkdtemp(prefix="engram-cluster-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def test_faults_on_the_cluster_lose_and_double_nothing(root: Path) -> None:
    """Leader-node kill, a SIGKILL per service, a rolling restart, Postgres restart, Redis stop:
    every acknowledged session's lessons exactly once, purges stick, requests recover."""
    report = await run(root, SHORT)
    print("\n" + report.table())
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({**asdict(report), "ok": report.ok()}, indent=2))
    assert [r.fault for r in report.rows] == [
        "nats-leader-kill",
        "kill-9 ingest-1",
        "kill-9 distill-1",
        "kill-9 governance-audit-1",
        "kill-9 embed+recall-1",
        "kill-9 gateway-1",
        "rolling-restart",
        *(["upgrade"] if UPGRADE else []),
        "postgres-restart",
        "redis-stop",
    ]
    for row in report.rows:
        assert row.sessions > 0, f"{row.fault}: no session published during the fault"
        assert (row.lost, row.duplicated, row.miscounted) == (0, 0, 0), f"{row.fault}: {row}"
        assert row.purged_left == 0, f"{row.fault}: purged memory came back"
        assert row.failed_after_recovery == 0, f"{row.fault}: requests failed after recovery"
        assert row.http_requests > 0, f"{row.fault}: no HTTP request during the fault"
        assert row.http_failed_after == 0, f"{row.fault}: HTTP requests failed after recovery"
    assert report.distill_completed == report.sessions, "a session distilled twice or never"
    assert report.memory_written == report.memory_written_unique, "memory.written published twice"
    assert report.memory_written == report.saved_and_reinforced
    assert report.audit_chain_ok
    # The replicated services lose no request to one replica's death (its queue group answers);
    # the Edge vector process is a single replica, so recall fails until it is back (reported).
    assert report.rows[3].failed_during <= 2, report.rows[3]
    # A gateway replica's death: its clients go to the other one.
    assert report.rows[5].http_failovers > 0, report.rows[5]
    assert report.rows[5].http_failed_during <= 2, report.rows[5]
