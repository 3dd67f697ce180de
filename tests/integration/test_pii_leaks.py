"""No raw PII anywhere but where the caller allowed it (SPEC 4.3 pii_handling, 6, 7.4).

The real services run; a corpus of PII values — one distinct value per kind and path — goes in
through ``engram.session.ended`` (task, tool inputs, outputs and errors, transcript; the built-in
distiller turns them into lessons and, with ``keep_observations``, every call into an observation)
and through ``engram.memory.save``. Once every entry is written and embedded, recalled (so the
disclosure audit exists) and every outbox row relayed, each place Engram keeps anything is searched
for every raw value:

- every column of every table of every schema in Postgres (``information_schema``), bytes included;
- the vector store: each point written through the :class:`~shared.ports.VectorIndex` port, and
  every file the Qdrant Edge store keeps on disk;
- every message (data and headers) of ``ENGRAM_MEMORY``, ``ENGRAM_AUDIT``, ``ENGRAM_DLQ`` and ``ENGRAM_FEED``;
- the cue-vector cache in Redis, when it runs;
- every log record at DEBUG (``caplog``) and every line of the JSON handler ``shared.observability.logging``
  installs.

``ENGRAM_SESSIONS`` is excluded: it *is* the raw input (``session.ended``, ``session.validated``,
``save.accepted``), a work queue whose messages leave once processed (and within
``session_retention_s`` at the latest). A dead letter's ``original_b64`` (the rejected input kept
for replay) is stored with PII redacted, so it is searched like everything else.

Each test prints what it planted, what it looked at and every leak (``pytest -s`` shows it).
"""

from __future__ import annotations

import base64
import json
import logging
import re
import sys
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import pytest
from nats.aio.client import Client
from nats.js.errors import NotFoundError
from sqlalchemy import text

from services.runtime import build_embedder, build_vector_index, running_services
from shared.adapters.vectors._tenancy import payload_of
from shared.observability.logging import NOISY_LOGGERS, JsonFormatter, setup_logging
from shared.ports import TenantFilter, VectorHit, VectorIndex, VectorPoint
from shared.runtime.settings import EngramSettings
from shared.service.infra import Infra
from shared.storage.db.engine import Database
from tests.platform import eventually, publish_session, request, session_payload

pytestmark = pytest.mark.integration

ALICE = {"kind": "end_user", "id": "alice"}
SCANNED_STREAMS = ("ENGRAM_MEMORY", "ENGRAM_AUDIT", "ENGRAM_DLQ", "ENGRAM_FEED")
#: Kinds whose values are also searched without separators ("4111111111111111").
_SEPARATED_KINDS = {"CARD", "IBAN", "NATIONAL_ID", "PHONE"}


@dataclass(frozen=True)
class Planted:
    kind: str
    value: str

    def needles(self) -> list[str]:
        """The value as written and, for numbers printed in groups, without separators (casefolded)."""
        forms = [self.value.casefold()]
        compact = re.sub(r"[^0-9A-Za-z]", "", self.value).casefold()
        if self.kind in _SEPARATED_KINDS and len(compact) >= 9 and compact not in forms:
            forms.append(compact)
        return forms


# -- the corpus: one distinct value per kind and path ---------------------------------------------

JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJkZXBsb3ktYm90In0.c2lnbmF0dXJlX3BsYWNlaG9sZGVy"
KEY_BODY = "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ"

SESSION_VALUES = {
    "email": Planted("EMAIL", "jane.doe@example.com"),
    "phone": Planted("PHONE", "+44 20 7946 0958"),
    "phone_national": Planted("PHONE", "020 7946 0123"),
    "card": Planted("CARD", "4111 1111 1111 1111"),
    "iban": Planted("IBAN", "DE89 3704 0044 0532 0130 00"),
    "ssn": Planted("NATIONAL_ID", "123-45-6789"),
    "nino": Planted("NATIONAL_ID", "AB 12 34 56 C"),
    "ipv4": Planted("IP_ADDRESS", "10.0.0.12"),
    "ipv6": Planted("IP_ADDRESS", "2001:db8::ff00:42:8329"),
    "aws": Planted("SECRET", "AKIAIOSFODNN7EXAMPLE"),
    "password": Planted("SECRET", "hunter2-Gr8"),
    "github": Planted("SECRET", "ghp_abcdefghijklmnopqrstuvwxyz0123456789"),
}
SAVE_VALUES = {
    "email": Planted("EMAIL", "mia.lopez@example.org"),
    "phone": Planted("PHONE", "+49 151 12345678"),
    "phone_nanp": Planted("PHONE", "(415) 555-0132"),
    "card": Planted("CARD", "5555 5555 5555 4444"),
    "iban": Planted("IBAN", "GB82 WEST 1234 5698 7654 32"),
    "ssn": Planted("NATIONAL_ID", "234-56-7891"),
    "dni": Planted("NATIONAL_ID", "12345678Z"),
    "bsn": Planted("NATIONAL_ID", "111222333"),
    "ipv4": Planted("IP_ADDRESS", "192.168.77.31"),
    "ipv6": Planted("IP_ADDRESS", "fd12:3456:789a::1"),
    "stripe": Planted("SECRET", "sk_live_abcdefghijklmnop5678"),
    "jwt": Planted("SECRET", JWT),
    "private_key": Planted("SECRET", KEY_BODY),
}
#: In a recall cue (hashed into the recall record, never stored) and in a rejected session.
CUE_VALUE = Planted("EMAIL", "cue.person@example.net")
REJECTED_VALUES = {
    "email": Planted("EMAIL", "rejected.person@example.com"),
    "card": Planted("CARD", "3782 822463 10005"),
}
BLOCK_VALUES = {
    "email": Planted("EMAIL", "blocked.person@example.com"),
    "iban": Planted("IBAN", "FR14 2004 1010 0505 0001 3M02 606"),
    "aws": Planted("SECRET", "AKIAZZ2BLOCKEDKEY777"),
}
ALLOW_VALUES = {
    "email": Planted("EMAIL", "allowed.person@example.com"),
    "card": Planted("CARD", "4012 8888 8888 1881"),
}


def _sessions(org: UUID, agent: UUID) -> list[dict[str, Any]]:
    v = {name: planted.value for name, planted in SESSION_VALUES.items()}
    failed = session_payload(
        org,
        agent,
        principal=ALICE,
        status="failed",
        steps=3,
        task=f"Refund order A-7 for {v['email']}",
        tool_trace=[
            {
                "tool": "lookup_customer",
                "input": {"email": v["email"]},
                "output": {"phone": v["phone"], "note": f"Remember that the refund IBAN is {v['iban']}."},
            },
            {
                "tool": "refund_payment",
                "input": {"card": v["card"]},
                "error": f"card {v['card']} declined; caller {v['ipv4']} blocked",
            },
        ],
        transcript=[
            {"role": "user", "content": f"Remember: my SSN is {v['ssn']} and my NINO is {v['nino']}."}
        ],
    )
    recovered = session_payload(
        org,
        agent,
        principal=ALICE,
        status="success",
        steps=4,
        task=f"Rotate the deploy key on {v['ipv6']}",
        tool_trace=[
            {"tool": "deploy", "input": {"host": v["ipv6"]}, "error": f"auth failed for key {v['aws']}"},
            {"tool": "deploy", "input": {"host": v["ipv6"], "password": v["password"]}, "output": "ok"},
            {
                "tool": "notify",
                "input": {"to": v["phone_national"]},
                "output": f"Note to self: the mirror token is {v['github']}.",
            },
        ],
    )
    return [failed, recovered]


def _save_texts() -> list[str]:
    v = {name: planted.value for name, planted in SAVE_VALUES.items()}
    return [
        f"Customer {v['email']} prefers calls on {v['phone']} or {v['phone_nanp']}.",
        f"Card on file {v['card']}; payouts go to {v['iban']}.",
        f"Identity checked: SSN {v['ssn']}, DNI {v['dni']}, BSN {v['bsn']}.",
        f"VPN gateway {v['ipv4']} and {v['ipv6']} are allow-listed.",
        f"Billing uses api_key={v['stripe']} and the deploy JWT {v['jwt']}.",
        "Deploy key: -----BEGIN OPENSSH PRIVATE KEY-----"
        f" {v['private_key']} -----END OPENSSH PRIVATE KEY-----",
    ]


# -- where things are kept ----------------------------------------------------------------------


class RecordingIndex:
    """The real vector index behind the :class:`VectorIndex` port, keeping every point written."""

    def __init__(self, inner: VectorIndex) -> None:
        self.inner = inner
        self.dimension = inner.dimension
        self.points: list[VectorPoint] = []

    async def upsert(self, points: Sequence[VectorPoint]) -> None:
        self.points.extend(points)
        await self.inner.upsert(points)

    async def delete(self, ids: Sequence[UUID]) -> None:
        await self.inner.delete(ids)

    async def search(self, vector: Sequence[float], tenant: TenantFilter, limit: int) -> list[VectorHit]:
        return await self.inner.search(vector, tenant, limit)

    async def search_lexical(
        self, terms: Mapping[int, float], tenant: TenantFilter, limit: int
    ) -> list[VectorHit]:
        return await self.inner.search_lexical(terms, tenant, limit)

    async def count(self) -> int:
        return await self.inner.count()

    async def close(self) -> None:
        await self.inner.close()


@pytest.fixture(scope="module")
async def vectors(settings: EngramSettings) -> AsyncIterator[RecordingIndex]:
    inner = build_vector_index(settings, build_embedder(settings))
    assert inner is not None, "these tests need a vector store"
    index = RecordingIndex(inner)
    yield index
    await index.close()


@pytest.fixture(scope="module")
async def engram(settings: EngramSettings, vectors: RecordingIndex) -> AsyncIterator[Infra]:
    """The conftest's services, with the vector index handed in so the test can see what it stores."""
    async with running_services(settings, vector_index=vectors) as infra:
        yield infra


@dataclass
class JsonLogs:
    """The handler ``shared.observability.logging`` installs, writing JSON lines to the captured stderr."""

    capsys: pytest.CaptureFixture[str]
    lines: list[str] = field(default_factory=list)

    def read(self) -> list[str]:
        captured = self.capsys.readouterr()
        sys.stdout.write(captured.out)  # what the test printed stays printed
        self.lines.extend(captured.err.splitlines())
        return self.lines


@pytest.fixture
def json_logs(capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> Iterator[JsonLogs]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    noisy = {name: logging.getLogger(name).level for name in NOISY_LOGGERS}
    setup_logging("DEBUG", json=True)
    caplog.set_level(logging.DEBUG)
    logs = JsonLogs(capsys)
    yield logs
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)
    for name, noisy_level in noisy.items():
        logging.getLogger(name).setLevel(noisy_level)


def _nowhere(where: str) -> bool:
    return False


@dataclass
class Scan:
    """Searches everything Engram keeps for the raw values; counts what it looked at.

    A value found where ``allowed(where)`` says it may be is counted as allowed; anywhere else it
    is a leak. Dead letters' ``original_b64`` (the rejected input kept for replay) included.
    """

    values: list[Planted]
    allowed: Callable[[str], bool] = _nowhere
    leaks: list[tuple[str, str]] = field(default_factory=list)
    found_where_allowed: list[tuple[str, str]] = field(default_factory=list)
    looked_at: dict[str, int] = field(default_factory=dict)

    def check(self, where: str, haystack: str | bytes | None) -> None:
        if haystack is None:
            return
        if isinstance(haystack, bytes | bytearray | memoryview):
            haystack = bytes(haystack).decode("utf-8", errors="ignore")
        folded = haystack.casefold()
        for planted in self.values:
            if any(needle in folded for needle in planted.needles()):
                if self.allowed(where):
                    self.found_where_allowed.append((where, planted.value))
                else:
                    self.leaks.append((where, planted.value))

    def count(self, what: str, n: int = 1) -> None:
        self.looked_at[what] = self.looked_at.get(what, 0) + n

    async def postgres(self, db: Database) -> None:
        async with db.read() as session:
            columns = (
                await session.execute(
                    text(
                        "SELECT table_schema, table_name, column_name, data_type"
                        " FROM information_schema.columns"
                        " WHERE table_schema NOT IN ('pg_catalog', 'information_schema')"
                        " AND table_schema NOT LIKE 'pg_toast%' ORDER BY 1, 2, ordinal_position"
                    )
                )
            ).all()
            tables: dict[tuple[str, str], list[tuple[str, str]]] = {}
            for schema, table, column, data_type in columns:
                tables.setdefault((schema, table), []).append((column, data_type))
            for (schema, table), cols in tables.items():
                # Bytes as they are (decoded here); every other type as Postgres prints it.
                select = ", ".join(f'"{c}"' if t == "bytea" else f'"{c}"::text' for c, t in cols)
                rows = (await session.execute(text(f'SELECT {select} FROM "{schema}"."{table}"'))).all()  # noqa: S608 (names from information_schema)
                self.count("postgres tables")
                self.count("postgres columns", len(cols))
                self.count("postgres rows", len(rows))
                for row in rows:
                    for (column, _), cell in zip(cols, row, strict=True):
                        self.check(f"postgres {schema}.{table}.{column}", cell)

    async def streams(self, nc: Client) -> None:
        js = nc.jetstream()
        for stream in SCANNED_STREAMS:
            info = await js.stream_info(stream)
            if not info.state.messages:
                continue
            for seq in range(info.state.first_seq, info.state.last_seq + 1):
                try:
                    msg = await js.get_msg(stream, seq)
                except NotFoundError:
                    continue
                self.count(f"{stream} messages")
                where = f"{stream} #{seq} {msg.subject}"
                self.check(f"{where} headers", json.dumps(msg.headers or {}))
                data = msg.data or b""
                if stream == "ENGRAM_DLQ":
                    letter = json.loads(data)
                    original = letter.pop("original_b64", None)
                    if original is not None:
                        self.check(f"{where} original_b64", base64.b64decode(original))
                    data = json.dumps(letter).encode()
                self.check(where, data)

    async def vector_store(self, index: RecordingIndex, data_dir: Path) -> None:
        for point in index.points:
            self.count("vector points")
            self.check(f"vector point {point.id}", json.dumps(payload_of(point)))
            self.check(f"vector point {point.id}", repr(point))
        for path in sorted(p for p in data_dir.rglob("*") if p.is_file()):
            self.count("vector store files")
            self.check(f"vector store file {path.relative_to(data_dir)}", path.read_bytes())

    async def redis(self, url: str) -> None:
        from redis.asyncio import Redis
        from redis.exceptions import RedisError

        client = Redis.from_url(url)
        try:
            async for key in client.scan_iter(match="engram:*"):
                self.count("redis keys")
                self.check(f"redis key {key!r}", key)
                if await client.type(key) == b"string":
                    self.check(f"redis value {key!r}", await client.get(key))
        except (RedisError, OSError):
            self.count("redis unavailable")
        finally:
            await client.aclose()

    def logs(self, caplog: pytest.LogCaptureFixture, json_logs: JsonLogs) -> None:
        formatter = JsonFormatter()
        for record in caplog.records:
            self.count("log records")
            self.check(f"log record {record.name}", formatter.format(record))
        for line in json_logs.read():
            self.count("json log lines")
            self.check("json log line", line)

    def report(self, title: str) -> str:
        kinds = sorted({p.kind for p in self.values})
        lines = [
            f"{title}: planted {len(self.values)} values of {len(kinds)} kinds ({', '.join(kinds)})",
            "  looked at: " + ", ".join(f"{n} {what}" for what, n in self.looked_at.items()),
            f"  leaks found: {len(self.leaks)}",
            *(f"    {value!r} in {where}" for where, value in self.leaks),
        ]
        if self.found_where_allowed:
            lines.append(f"  found where allowed: {len(self.found_where_allowed)}")
            lines += [f"    {value!r} in {where}" for where, value in self.found_where_allowed]
        return "\n".join(lines)

    async def everywhere(
        self,
        *,
        db: Database,
        nc: Client,
        index: RecordingIndex,
        settings: EngramSettings,
        caplog: pytest.LogCaptureFixture,
        json_logs: JsonLogs,
    ) -> None:
        await self.postgres(db)
        await self.streams(nc)
        await self.vector_store(index, settings.data_dir)
        await self.redis(settings.redis_url)
        self.logs(caplog, json_logs)


# -- helpers ------------------------------------------------------------------------------------


async def _count(db: Database, sql: str, **params: Any) -> int:
    async with db.read() as session:
        return int((await session.execute(text(sql), params)).scalar_one())


async def _audit_count(db: Database, org: UUID, kind: str) -> int:
    return await _count(
        db, "SELECT count(*) FROM audit_log WHERE org_id = :org AND kind = :kind", org=org, kind=kind
    )


async def _relayed(db: Database, org: UUID) -> bool:
    """No outbox row of the organization (nor any dead letter, which names none) waits to be relayed."""
    pending = await _count(
        db,
        "SELECT count(*) FROM outbox WHERE subject LIKE 'engram.dlq.%'"
        " OR position(:org in convert_from(payload, 'UTF8')) > 0",
        org=str(org),
    )
    return pending == 0


async def _dead_letters(nc: Client) -> int:
    return int((await nc.jetstream().stream_info("ENGRAM_DLQ")).state.messages)


async def _settled(db: Database, org: UUID, agent: UUID, *, entries: int | None = None) -> None:
    """Every entry of the agent config embedded, and every outbox row relayed to its stream."""

    async def ready() -> bool:
        pending = await _count(
            db,
            "SELECT count(*) FROM memory_entries WHERE org_id = :org AND agent_config_id = :agent"
            " AND embedding_status <> 'indexed'",
            org=org,
            agent=agent,
        )
        stored = await _count(
            db,
            "SELECT count(*) FROM memory_entries WHERE org_id = :org AND agent_config_id = :agent",
            org=org,
            agent=agent,
        )
        return (
            pending == 0 and await _relayed(db, org) and (entries is None or stored >= entries) and stored > 0
        )

    await eventually(ready, timeout=60, what="entries embedded and the outbox relayed")


async def _stored(db: Database, org: UUID, agent: UUID) -> list[dict[str, Any]]:
    async with db.read() as session:
        rows = await session.execute(
            text(
                "SELECT text, source, layer, redaction, quarantined FROM memory_entries"
                " WHERE org_id = :org AND agent_config_id = :agent"
            ),
            {"org": org, "agent": agent},
        )
        return [dict(row._mapping) for row in rows]


async def _configure(nc: Client, token: str, agent: UUID, config: dict[str, Any]) -> None:
    reply = await request(nc, "engram.config.put", {"agent_config_id": str(agent), "config": config}, token)
    assert "error" not in reply, reply


async def _save(nc: Client, token: str, agent: UUID, texts: list[str]) -> dict[str, Any]:
    body = {
        "agent_config_id": str(agent),
        "wait": True,
        "principal": ALICE,
        "entries": [{"text": t, "importance": 0.6, "memory_type": "fact"} for t in texts],
    }
    reply = await request(nc, "engram.memory.save", body, token)
    assert reply.get("status") == 200, reply
    return reply


# -- the tests ----------------------------------------------------------------------------------


async def test_redacted_pii_is_stored_nowhere_raw(
    engram: Infra,
    nc: Client,
    observer_nc: Client,
    db: Database,
    settings: EngramSettings,
    vectors: RecordingIndex,
    org: UUID,
    agent: UUID,
    service_token: str,
    caplog: pytest.LogCaptureFixture,
    json_logs: JsonLogs,
) -> None:
    """With the default ``redact``, PII sent through both write paths, a recall cue and a rejected
    session appears raw in no table, vector, stream message, cache entry or log line."""
    await _configure(nc, service_token, agent, {"keep_observations": True})
    sessions = _sessions(org, agent)
    for session in sessions:
        await publish_session(nc, session, service_token)
    saved = await _save(nc, service_token, agent, _save_texts())
    assert saved["saved"] == len(_save_texts())

    # A session the token may not write (another organization): dead-lettered with its reason.
    letters = await _dead_letters(observer_nc)
    rejected = session_payload(
        uuid4(),
        agent,
        principal=ALICE,
        task=f"Call {REJECTED_VALUES['email'].value}",
        tool_trace=[
            {"tool": "charge", "input": {}, "error": f"card {REJECTED_VALUES['card'].value} declined"}
        ],
    )
    await publish_session(nc, rejected, service_token)

    async def distilled() -> bool:
        return await _audit_count(db, org, "distill.completed") == len(sessions)

    await eventually(distilled, timeout=60, what="both sessions distilled")
    await _settled(db, org, agent)

    # Recalls, so disclosure records exist (one with PII in its cue).
    for fields in (
        {"strategy": "last_k"},
        {"strategy": "hybrid", "cue": f"card declined for {CUE_VALUE.value}"},
        {"strategy": "semantic", "cue": "refund card"},
    ):
        reply = await request(
            nc, "engram.recall", {"agent_config_id": str(agent), "principal": ALICE, **fields}, service_token
        )
        assert "error" not in reply, reply
        assert reply["results"], (fields, reply)

    async def recorded() -> bool:
        recalls = await _count(db, "SELECT count(*) FROM recall_records WHERE org_id = :org", org=org)
        rejects = await _audit_count(db, org, "session.rejected")
        lettered = await _dead_letters(observer_nc) > letters
        return recalls >= 3 and rejects >= 1 and lettered and await _relayed(db, org)

    await eventually(recorded, timeout=30, what="recall records, the rejection and their events")

    # What was stored is the corpus, redacted: every kind planted on each path was replaced.
    stored = await _stored(db, org, agent)
    for source, planted in (("distill", SESSION_VALUES), ("elective", SAVE_VALUES)):
        kinds = {kind for row in stored if row["source"] == source for kind in row["redaction"]}
        assert kinds == {p.kind for p in planted.values()}, (source, kinds)
    observations = sum(row["layer"] == "observation" for row in stored)
    assert observations
    assert await _audit_count(db, org, "memory.recalled") >= 3
    placeholders = sum(len(re.findall(r"\[[A-Z_]+\]", row["text"])) for row in stored)
    print(f"\nstored {len(stored)} entries ({observations} observations) holding {placeholders} placeholders")

    scan = Scan([*SESSION_VALUES.values(), *SAVE_VALUES.values(), CUE_VALUE, *REJECTED_VALUES.values()])
    await scan.everywhere(
        db=db, nc=observer_nc, index=vectors, settings=settings, caplog=caplog, json_logs=json_logs
    )
    print(scan.report("redact"))
    assert scan.looked_at.get("vector points", 0) >= len(stored)
    assert scan.looked_at.get("ENGRAM_DLQ messages", 0) >= 1
    assert not scan.leaks, scan.report("redact")


async def test_block_refuses_pii_and_stores_nothing_of_it(
    engram: Infra,
    nc: Client,
    observer_nc: Client,
    db: Database,
    settings: EngramSettings,
    vectors: RecordingIndex,
    org: UUID,
    agent: UUID,
    service_token: str,
    caplog: pytest.LogCaptureFixture,
    json_logs: JsonLogs,
) -> None:
    """With ``block``, an entry holding PII is refused on both paths, a ``policy.denied`` record
    says why (kinds, not values), and the value is nowhere."""
    await _configure(nc, service_token, agent, {"pii_handling": "block"})
    v = {name: planted.value for name, planted in BLOCK_VALUES.items()}
    reply = await _save(
        nc,
        service_token,
        agent,
        [f"Send the refund to {v['iban']} for {v['email']}.", "Refunds take 3 days."],
    )
    assert (reply["saved"], reply["skipped"]) == (1, 1)
    session = session_payload(
        org,
        agent,
        principal=ALICE,
        task="Sync the mirror",
        tool_trace=[{"tool": "sync", "input": {}, "error": f"auth failed for key {v['aws']}"}],
        transcript=[{"role": "user", "content": "Remember that the mirror syncs nightly at two."}],
    )
    await publish_session(nc, session, service_token)

    async def distilled() -> bool:
        return await _audit_count(db, org, "distill.completed") == 1

    await eventually(distilled, timeout=60, what="the session distilled")
    await _settled(db, org, agent)

    async with db.read() as s:
        denials = [
            row[0]
            for row in await s.execute(
                text("SELECT details FROM audit_log WHERE org_id = :org AND kind = 'policy.denied'"),
                {"org": org},
            )
        ]
    reasons = [reason for details in denials for reason in details["reasons"]]
    assert "policy:pii:EMAIL,IBAN" in reasons
    assert "policy:pii:SECRET" in reasons
    stored = await _stored(db, org, agent)
    assert "Refunds take 3 days." in {row["text"] for row in stored}
    assert all(not row["redaction"] for row in stored)

    scan = Scan(list(BLOCK_VALUES.values()))
    await scan.everywhere(
        db=db, nc=observer_nc, index=vectors, settings=settings, caplog=caplog, json_logs=json_logs
    )
    print(scan.report("block"))
    assert not scan.leaks, scan.report("block")


async def test_allow_stores_pii_as_given_and_nowhere_else(
    engram: Infra,
    nc: Client,
    observer_nc: Client,
    db: Database,
    settings: EngramSettings,
    vectors: RecordingIndex,
    org: UUID,
    agent: UUID,
    service_token: str,
    caplog: pytest.LogCaptureFixture,
    json_logs: JsonLogs,
) -> None:
    """With ``allow``, the text is stored exactly as given — and still only in the entry itself:
    events, audit records, vectors and logs carry ids, never text."""
    await _configure(nc, service_token, agent, {"pii_handling": "allow"})
    v = {name: planted.value for name, planted in ALLOW_VALUES.items()}
    given = f"Contact {v['email']}; the card on file is {v['card']}."
    reply = await _save(nc, service_token, agent, [given])
    assert reply["saved"] == 1
    await _settled(db, org, agent, entries=1)
    (row,) = await _stored(db, org, agent)
    assert (row["text"], row["redaction"]) == (given, [])
    recalled = await request(
        nc, "engram.recall", {"agent_config_id": str(agent), "principal": ALICE}, service_token
    )
    assert [r["text"] for r in recalled["results"]] == [given]

    # The entry's own text, the full-text index computed from it and the per-owner term statistics
    # counted from that index (erased with the entry), and recall's cached replies (a copy of what
    # recall answers, deleted with the entry) are where it was allowed to go.
    def allowed(where: str) -> bool:
        return where in {
            "postgres public.memory_entries.text",
            "postgres public.memory_entries.search",
            "postgres public.lexical_terms.lexeme",
        } or where.startswith("redis value b'engram:recall:")

    scan = Scan(list(ALLOW_VALUES.values()), allowed)
    await scan.everywhere(
        db=db, nc=observer_nc, index=vectors, settings=settings, caplog=caplog, json_logs=json_logs
    )
    print(scan.report("allow"))
    assert ("postgres public.memory_entries.text", v["card"]) in scan.found_where_allowed
    assert not scan.leaks, scan.report("allow")


# -- beyond the text: dead letters and metadata ----------------------------------------------------


async def test_dead_letters_keep_no_raw_pii(
    engram: Infra, nc: Client, observer_nc: Client, db: Database, org: UUID, agent: UUID, service_token: str
) -> None:
    """A session refused at ingest is dead-lettered without the PII it carried."""
    value = "dead.letter@example.com"
    rejected = session_payload(uuid4(), agent, principal=ALICE, task=f"Mail {value}")
    letters = await _dead_letters(observer_nc)
    await publish_session(nc, rejected, service_token)

    async def lettered() -> bool:
        return await _dead_letters(observer_nc) > letters and await _relayed(db, org)

    await eventually(lettered, what="the rejection dead-lettered")
    scan = Scan([Planted("EMAIL", value)])
    await scan.streams(observer_nc)
    assert not scan.leaks, scan.report("dead letters")


async def test_entry_metadata_is_redacted_too(
    engram: Infra, nc: Client, db: Database, org: UUID, agent: UUID, service_token: str
) -> None:
    """PII a runner puts in an entry's metadata is redacted like PII in its text."""
    value = "meta.person@example.com"
    body = {
        "agent_config_id": str(agent),
        "wait": True,
        "principal": ALICE,
        "entries": [{"text": "Prefers e-mail.", "metadata": {"contact": value}}],
    }
    reply = await request(nc, "engram.memory.save", body, service_token)
    assert reply.get("saved") == 1, reply
    scan = Scan([Planted("EMAIL", value)])
    await scan.postgres(db)
    assert not scan.leaks, scan.report("metadata")
