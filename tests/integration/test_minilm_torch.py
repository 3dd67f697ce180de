"""The torch reference of all-MiniLM-L6-v2 (shared/adapters/embedders/minilm_torch.py), from the same
packaged weights, offline.

Needs the ``local-model`` extra (torch, sentence-transformers); skipped without it. Loading the
model takes a few seconds, so one embedder serves the whole module.
"""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from shared.adapters.embedders.minilm_torch import SentenceTransformerEmbedder, missing_dependencies
from tests.unit.embedder_suite import DEPLOY_FAILURE, RELATED, UNRELATED, EmbedderSuite, cosine

_MISSING = missing_dependencies()
pytestmark = pytest.mark.skipif(
    bool(_MISSING),
    reason=f"the local-model extra is not installed (missing {', '.join(_MISSING)}): "
    "pip install -e '.[local-model]'",
)


@pytest.fixture(scope="module")
def minilm() -> SentenceTransformerEmbedder:
    """One loaded model for the module (loading takes seconds)."""
    embedder = SentenceTransformerEmbedder()
    embedder.model()
    return embedder


class TestSentenceTransformerEmbedderContract(EmbedderSuite):
    exact = False  # a batch is padded to its longest text, which moves the last float bits

    @pytest.fixture
    def embedder(self, minilm: SentenceTransformerEmbedder) -> SentenceTransformerEmbedder:
        return minilm


async def test_is_384_dimensional_and_unit_length(minilm: SentenceTransformerEmbedder) -> None:
    """The packaged model gives 384 floats per text, L2-normalized."""
    [vector] = await minilm.embed([DEPLOY_FAILURE])
    assert (minilm.name, minilm.dimension, len(vector)) == ("all-MiniLM-L6-v2", 384, 384)
    assert sum(value * value for value in vector) == pytest.approx(1.0, abs=1e-5)


async def test_meaning_not_only_words_decides_closeness(minilm: SentenceTransformerEmbedder) -> None:
    """The deploy-quota failure is clearly closer to "deployment quota error" than to hiking."""
    failure, related, unrelated = await minilm.embed([DEPLOY_FAILURE, RELATED, UNRELATED])
    assert cosine(failure, related) > 0.6
    assert cosine(failure, unrelated) < 0.3


async def test_paraphrases_without_shared_words_are_close(minilm: SentenceTransformerEmbedder) -> None:
    """Unlike the hashing embedder, a paraphrase with no word in common is still near."""
    a, b, c = await minilm.embed(
        ["The car would not start", "My automobile failed to ignite", "Bake at 200 C"]
    )
    assert cosine(a, b) > cosine(a, c) + 0.2


async def test_encoding_does_not_block_the_event_loop(minilm: SentenceTransformerEmbedder) -> None:
    """While a large batch is encoded in a worker thread, other coroutines keep running."""
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.005)

    ticker = asyncio.create_task(tick())
    started = time.perf_counter()
    await minilm.embed([f"{DEPLOY_FAILURE} on node {n}" for n in range(256)])
    elapsed = time.perf_counter() - started
    ticker.cancel()
    assert elapsed > 0.05
    assert ticks >= 3


def test_loading_leaves_the_environment_as_it_was() -> None:
    """The offline switches are set only while the model loads, then put back."""
    before = {name: os.environ.get(name) for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    SentenceTransformerEmbedder().model()
    after = {name: os.environ.get(name) for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    assert after == before
