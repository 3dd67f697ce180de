"""What finding a saved entry's supersession candidates costs the save path
(docs/adr/0103-knowledge-updates.md): the neighbourhood statement
(:func:`shared.storage.entries.supersession.neighbours`) for a batch of new entries, against one owner
holding 1k, 10k and 100k current entries, p50/p99 per batch.

The owner's entries are synthetic sentences over the labelled set's vocabulary (the words the
trigger expansion looks for occur often, as in a real owner's memory), inserted by one SQL
statement into a throwaway database; the new entries are the labelled set's newer texts.

Run: ``python -m tests.bench.supersession``; results in ``bench-results/supersession-bench.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from uuid import uuid4

import asyncpg

from shared.runtime.time import utcnow
from shared.storage.db.engine import Database
from shared.storage.entries.supersession import NewText, neighbours
from tests.bench import measure
from tests.eval.supersession_data import load
from tests.support.servers import throwaway_database

_FILL = """
INSERT INTO memory_entries (id, org_id, agent_config_id, owner_key, text, fingerprint, importance,
  reinforcement_count, memory_type, layer, source, confidence, reliability, lifecycle, pinned,
  redaction, quarantined, quarantine_reasons, provenance, created_at, updated_at, access_count,
  version, derived_from, embedding_status, metadata)
SELECT gen_random_uuid(), $1, $2, $3, t, md5(t || g) || md5(g || t), 0.5, 0, 'fact', 'memory',
  'elective', 1, 1, 'active', false, '[]', false, '[]', '{}',
  now() - make_interval(secs => g + 60), now(), 0, 1, '[]', 'indexed', '{}'
FROM (
  SELECT g, $4::text[] AS w, cardinality($4::text[]) AS n FROM generate_series($5::int, $6::int) g
) s, LATERAL (SELECT w[1 + (g * 7) % n] || ' ' || w[1 + (g * 13) % n] || ' ' || w[1 + (g * 31) % n]
  || ' ' || w[1 + (g * 101) % n] || ' ' || w[1 + (g * 211) % n] || ' ' || g AS t) x
"""


_NEW = """
INSERT INTO memory_entries (id, org_id, agent_config_id, owner_key, text, fingerprint, importance,
  reinforcement_count, memory_type, layer, source, confidence, reliability, lifecycle, pinned,
  redaction, quarantined, quarantine_reasons, provenance, created_at, updated_at, access_count,
  version, derived_from, embedding_status, metadata)
SELECT i, $1, $2, $3, t, md5(t) || md5(i::text), 0.5, 0, 'fact', 'memory', 'elective', 1, 1,
  'active', false, '[]', false, '[]', '{}', now(), now(), 0, 1, '[]', 'pending', '{}'
FROM unnest($4::uuid[], $5::text[]) AS n(i, t)
"""


async def run(sizes: list[int], batch: int, rounds: int) -> dict[str, Any]:
    pairs = load()
    vocabulary = sorted({w for p in pairs for w in re.findall(r"[a-z]+", (p.old + " " + p.new).lower())})
    news = [p.new for p in pairs if p.label == "update"]
    out: dict[str, Any] = {"batch": batch, "rounds": rounds, "vocabulary": len(vocabulary), "sizes": {}}
    with tempfile.TemporaryDirectory(prefix="engram-bench-ss-") as tmp:
        async with throwaway_database(os.environ.get("ENGRAM_TEST_DATABASE_URL"), Path(tmp)) as url:
            pg = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://", 1))
            db = Database(url, pool_size=2)
            org, agent, owner = uuid4(), uuid4(), "end_user:bench"
            try:
                held = 0
                for size in sorted(sizes):
                    await pg.execute(_FILL, org, agent, owner, vocabulary, held + 1, size)
                    held = size
                    await pg.execute("ANALYZE memory_entries")
                    timings = []
                    for r in range(rounds):
                        texts = [news[(r * batch + i) % len(news)] for i in range(batch)]
                        new = [NewText(uuid4(), org, agent, owner, t, utcnow()) for t in texts]
                        await pg.execute(_NEW, org, agent, owner, [n.id for n in new], [n.text for n in new])
                        async with db.transaction() as session:
                            start = time.perf_counter()
                            found = await neighbours(session, new)
                            timings.append((time.perf_counter() - start) * 1000)
                        await pg.execute(
                            "DELETE FROM memory_entries WHERE id = ANY($1::uuid[])", [n.id for n in new]
                        )
                    out["sizes"][size] = {
                        **measure.summary(timings),
                        "candidates_per_entry": round(sum(len(v) for v in found.values()) / batch, 2),
                    }
                    print(f"  {size:>7} entries: {out['sizes'][size]}", flush=True)
            finally:
                await db.close()
                await pg.close()
    return out


async def main(args: argparse.Namespace) -> int:
    print(f"[supersession candidates: batches of {args.batch}]", flush=True)
    result = await run(args.sizes, args.batch, args.rounds)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"(full results: {args.out})")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 100000])
    parser.add_argument("--batch", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--out", type=Path, default=Path("bench-results/supersession-bench.json"))
    sys.exit(asyncio.run(main(parser.parse_args())))
