"""Embedder throughput (``python -m tests.bench.embedder_throughput``): texts/s of the hashing
embedder and, when the ``local-model`` extra is installed, of all-MiniLM-L6-v2 on the CPU.

Texts are short memory-like sentences (10-16 words), all different. Each embedder is warmed up
first (for MiniLM that includes loading the model), then timed over several rounds; the best round
is reported, since other load on the machine only ever makes a round slower. Results go to
``bench-results/embedder_throughput.json`` and a markdown table on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from shared.embedders.hashing import HashingEmbedder
from shared.embedders.minilm_torch import SentenceTransformerEmbedder, missing_dependencies

_SUBJECTS = ["the deploy", "the nightly backup", "kubectl apply", "the payment API", "certbot", "the CI job"]
_VERBS = ["failed", "timed out", "was retried", "succeeded", "was rate limited", "returned 503"]
_CAUSES = [
    "because the quota was exceeded",
    "after the DNS change propagated",
    "when the token expired",
    "because the disk on node {n} was full",
    "until the user {n} asked to pin the version",
    "since the region eu-west-{n} was degraded",
]


def make_texts(count: int, seed: int = 7) -> list[str]:
    """``count`` different short sentences about tool calls and their outcomes."""
    rng = random.Random(seed)
    return [
        f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_CAUSES).format(n=n)} (run {n})"
        for n in range(count)
    ]


def measure(
    embed: Callable[[Sequence[str]], Any], texts: list[str], batch: int, rounds: int
) -> dict[str, Any]:
    """The best texts/s over ``rounds`` passes over ``texts`` in batches of ``batch``."""
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        for start in range(0, len(texts), batch):
            embed(texts[start : start + batch])
        best = min(best, time.perf_counter() - started)
    return {
        "batch": batch,
        "texts": len(texts),
        "best_s": round(best, 3),
        "texts_per_s": round(len(texts) / best),
    }


def main(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
    }
    hashing = HashingEmbedder(384)
    texts = make_texts(args.hashing_texts)
    hashing.embed_sync(texts[:1000])  # warm-up
    results["hashing-384"] = [measure(hashing.embed_sync, texts, batch, args.rounds) for batch in (64, 1000)]
    missing = missing_dependencies()
    if missing:
        results["all-MiniLM-L6-v2"] = {"skipped": f"missing {', '.join(missing)}"}
        return results
    import torch  # only to report the thread count inference ran with

    minilm = SentenceTransformerEmbedder(batch_size=64)
    started = time.perf_counter()
    minilm.model()
    load_s = time.perf_counter() - started
    texts = make_texts(args.model_texts)
    minilm.embed_sync(texts[:128])  # warm-up
    results["all-MiniLM-L6-v2"] = {
        "load_s": round(load_s, 2),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "runs": [measure(minilm.embed_sync, texts, 64, args.rounds)],
    }
    return results


def render(results: dict[str, Any]) -> str:
    rows = ["| embedder | batch | texts/s |", "|---|---|---|"]
    for run in results["hashing-384"]:
        rows.append(f"| hashing-384 | {run['batch']} | {run['texts_per_s']} |")
    minilm = results["all-MiniLM-L6-v2"]
    if "skipped" in minilm:
        rows.append(f"| all-MiniLM-L6-v2 | - | skipped: {minilm['skipped']} |")
    else:
        for run in minilm["runs"]:
            rows.append(
                f"| all-MiniLM-L6-v2 ({minilm['torch_threads']} threads, load {minilm['load_s']} s) "
                f"| {run['batch']} | {run['texts_per_s']} |"
            )
    return "\n".join(rows)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--hashing-texts", type=int, default=20_000)
    parser.add_argument("--model-texts", type=int, default=1_024)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("bench-results/embedder_throughput.json"))
    args = parser.parse_args()
    results = main(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(render(results))
