"""Helpers shared by the security tests: minting (honest and forged) tokens, talking to Engram as
an attacker would, telling a leak from an echo, snapshotting a victim's rows, and reporting what
each attack tried and what got through (printed, and kept in ``tests/security/.results``)."""

from __future__ import annotations

import base64
import json
import os
import random
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from uuid import UUID, uuid4

import jwt
from nats.aio.client import Client
from sqlalchemy import func, select

from contracts.common import Principal
from shared.security.auth import TokenService
from shared.storage.db.engine import Database
from shared.storage.db.models import AUDIT_LOG, ENTRIES, ERASURES, RECALLS
from tests.platform import request

if TYPE_CHECKING:
    from tests.security.transport import Interface

__all__ = [
    "LINES",
    "RESULTS_DIR",
    "RESULTS_FILE",
    "SEED",
    "Tally",
    "b64url",
    "claims_for",
    "count_rows",
    "error_code",
    "forge",
    "mint",
    "org_snapshot",
    "report",
    "rng",
    "save",
    "unb64url",
]

RESULTS_DIR = Path(__file__).parent / ".results"
RESULTS_FILE = RESULTS_DIR / "security.json"
#: One seed for every fuzzer, overridable to explore further (``ENGRAM_SECURITY_SEED=...``).
SEED = int(os.environ.get("ENGRAM_SECURITY_SEED", "20240611"))

#: Summary lines of this run, printed again by ``pytest_terminal_summary`` (works without ``-s``).
LINES: list[str] = []


def rng(salt: str) -> random.Random:
    return random.Random(f"{SEED}:{salt}")


def mint(tokens: TokenService, org: UUID, ref: str, perms: Iterable[str], **kw: Any) -> str:
    return tokens.mint(org_id=org, principal=Principal.parse_ref(ref), permissions=set(perms), **kw)


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def claims_for(org: UUID, ref: str = "service:runner", perms: Sequence[str] | None = None) -> dict[str, Any]:
    """The claims ``TokenService.mint`` would write, for hand-made tokens."""
    principal = Principal.parse_ref(ref)
    now = int(time.time())
    return {
        "iss": "engram",
        "iat": now,
        "exp": now + 3600,
        "jti": uuid4().hex,
        "org": str(org),
        "pk": principal.kind,
        "pid": principal.id,
        "perms": sorted(perms if perms is not None else ["memory.read", "memory.write", "memory.admin"]),
    }


def forge(org: UUID, kid: str, secret: str) -> dict[str, str]:
    """Bearer tokens that must all be refused with ``UNAUTHENTICATED``, by name. Built with
    PyJWT directly (and by hand where PyJWT would refuse), never through ``TokenService``.

    ``kid``/``secret`` are the deployment's real key: several variants are signed with it but
    break another rule (algorithm, issuer, expiry, required claims)."""
    claims = claims_for(org, perms=["memory.read", "memory.write", "memory.admin", "memory.purge"])
    good = jwt.encode(claims, secret, algorithm="HS256", headers={"kid": kid})
    head, body, sig = good.split(".")
    tampered_claims = {**claims, "org": str(uuid4()), "pk": "service"}
    tampered_body = b64url(json.dumps(tampered_claims, separators=(",", ":")).encode())
    none_header = b64url(json.dumps({"alg": "none", "typ": "JWT", "kid": kid}).encode())
    body_plain = b64url(json.dumps(claims, separators=(",", ":")).encode())
    flipped = sig[:-2] + ("A" if sig[-2] != "A" else "B") + sig[-1]
    expired = {**claims, "iat": int(time.time()) - 7200, "exp": int(time.time()) - 3600}
    no_exp = {k: v for k, v in claims.items() if k != "exp"}
    no_org = {k: v for k, v in claims.items() if k != "org"}
    return {
        "wrong_key_same_kid": jwt.encode(claims, secret + "x", algorithm="HS256", headers={"kid": kid}),
        "alg_none_pyjwt": jwt.encode(claims, None, algorithm="none", headers={"kid": kid}),
        "alg_none_unsigned": f"{none_header}.{body_plain}.",
        "alg_none_with_old_sig": f"{none_header}.{body_plain}.{sig}",
        "tampered_payload": f"{head}.{tampered_body}.{sig}",
        "flipped_signature": f"{head}.{body}.{flipped}",
        "stripped_signature": f"{head}.{body}.",
        "wrong_kid_right_secret": jwt.encode(claims, secret, algorithm="HS256", headers={"kid": "other"}),
        "no_kid": jwt.encode(claims, secret, algorithm="HS256"),
        "hs512_right_secret": jwt.encode(claims, secret, algorithm="HS512", headers={"kid": kid}),
        "expired": jwt.encode(expired, secret, algorithm="HS256", headers={"kid": kid}),
        "no_exp_claim": jwt.encode(no_exp, secret, algorithm="HS256", headers={"kid": kid}),
        "no_org_claim": jwt.encode(no_org, secret, algorithm="HS256", headers={"kid": kid}),
        "wrong_issuer": jwt.encode(
            {**claims, "iss": "evil"}, secret, algorithm="HS256", headers={"kid": kid}
        ),
        "bad_org_claim": jwt.encode({**claims, "org": "*"}, secret, algorithm="HS256", headers={"kid": kid}),
        # Claims no store could keep or no field takes, signed with the real key: refused, not a 500.
        "nul_in_session_claim": jwt.encode(
            {**claims, "sid": "run\x00-1"}, secret, algorithm="HS256", headers={"kid": kid}
        ),
        "surrogate_in_principal_claim": jwt.encode(
            {**claims, "pk": "service", "pid": "\ud800"}, secret, algorithm="HS256", headers={"kid": kid}
        ),
        "object_session_claim": jwt.encode(
            {**claims, "sid": {"a": 1}}, secret, algorithm="HS256", headers={"kid": kid}
        ),
        "garbage": "not-a-token",
        "two_parts": f"{head}.{body}",
        "oversize": good + "A" * 5000,
    }


def error_code(reply: Mapping[str, Any]) -> str | None:
    err = reply.get("error")
    return str(err.get("code")) if isinstance(err, dict) else None


async def save(
    nc: Client,
    token: str,
    agent: UUID,
    texts: Sequence[str],
    principal: dict[str, Any] | None = None,
    **kw: Any,
) -> list[str]:
    body: dict[str, Any] = {
        "agent_config_id": str(agent),
        "entries": [{"text": t, "importance": round(0.5 + i / 200, 4)} for i, t in enumerate(texts)],
        "wait": True,
        **kw,
    }
    if principal is not None:
        body["principal"] = principal
    reply = await request(nc, "engram.memory.save", body, token, timeout=20)
    assert reply.get("status") == 200, reply
    return [str(i) for i in reply["ids"]]


async def count_rows(db: Database, *conditions: Any, table: Any = ENTRIES) -> int:
    async with db.read() as s:
        return int((await s.execute(select(func.count()).select_from(table).where(*conditions))).scalar_one())


async def org_snapshot(db: Database, org: UUID) -> dict[str, Any]:
    """Everything of ``org`` an attacker could change: every entry row (all columns but the derived
    search vector), recall records and labels, tombstones, and the audit chain's length."""
    cols = [c for c in ENTRIES.c if c.name != "search"]
    async with db.read() as s:
        rows = (await s.execute(select(*cols).where(ENTRIES.c.org_id == org).order_by(ENTRIES.c.id))).all()
        recalls = (
            await s.execute(
                select(RECALLS.c.pack_id, RECALLS.c.label, RECALLS.c.label_source)
                .where(RECALLS.c.org_id == org)
                .order_by(RECALLS.c.pack_id)
            )
        ).all()
        erasures = (
            await s.execute(select(func.count()).select_from(ERASURES).where(ERASURES.c.org_id == org))
        ).scalar_one()
        audit_n = (
            await s.execute(select(func.count()).select_from(AUDIT_LOG).where(AUDIT_LOG.c.org_id == org))
        ).scalar_one()
    return {
        "entries": [tuple(str(v) for v in r) for r in rows],
        "recalls": [tuple(str(v) for v in r) for r in recalls],
        "erasures": int(erasures),
        "audit": int(audit_n),
    }


@dataclass
class Tally:
    """What one attack tried and what got through."""

    name: str
    requests: int = 0
    codes: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def note(self, reply: Mapping[str, Any]) -> str | None:
        self.requests += 1
        code = error_code(reply)
        self.codes[code or "OK"] += 1
        return code

    def problem(self, what: str) -> None:
        if len(self.problems) < 200:
            self.problems.append(what)

    def conclude(
        self,
        *,
        interface: Interface | None = None,
        snapshots: tuple[Any, Any] | None = None,
        **extra: Any,
    ) -> None:
        """Report the attack — its requests, ``extra`` counts, wrong acceptances, whether the
        victim's rows changed (``snapshots``: before and after), codes, problems and what the
        interface itself found — then assert that nothing got through."""
        changed = snapshots is not None and snapshots[0] != snapshots[1]
        report(
            self.name,
            requests=self.requests,
            **extra,
            wrong_acceptances=len(self.problems),
            **({"foreign_writes": int(changed)} if snapshots is not None else {}),
            codes=dict(self.codes),
            problems=self.problems,
            **(interface.counts() if interface is not None else {}),
        )
        assert self.problems == []
        assert not changed, "the attack changed the victim's rows"


def report(name: str, **counts: Any) -> str:
    """Print ``SECURITY <name>: k=v ...`` and merge the counts into ``.results/security.json``."""
    shown = " ".join(f"{k}={v}" for k, v in counts.items() if not isinstance(v, dict | list))
    line = f"SECURITY {name}: {shown}"
    print(line)
    LINES.append(line)
    RESULTS_DIR.mkdir(exist_ok=True)
    try:
        data = json.loads(RESULTS_FILE.read_text())
    except (OSError, ValueError):
        data = {}
    data[name] = {**counts, "seed": SEED, "at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    RESULTS_FILE.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
    return line
