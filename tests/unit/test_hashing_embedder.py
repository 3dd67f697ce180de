"""The hashing embedder (shared/adapters/embedders/hashing.py): deterministic, normalized, word-overlap
aware."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from shared.adapters.embedders import HashingEmbedder
from tests.unit.embedder_suite import DEPLOY_FAILURE, TEXTS, EmbedderSuite, cosine

REPO = Path(__file__).resolve().parents[2]


class TestHashingEmbedderContract(EmbedderSuite):
    @pytest.fixture
    def embedder(self) -> HashingEmbedder:
        return HashingEmbedder()


def test_two_instances_agree() -> None:
    """Two fresh embedders give bit-identical vectors for the same texts."""
    assert HashingEmbedder().embed_sync(TEXTS) == HashingEmbedder().embed_sync(TEXTS)


def test_another_process_gives_the_same_vectors() -> None:
    """A new interpreter (with another hash seed) gives bit-identical vectors: no salted hash()."""
    script = (
        "import json, sys\n"
        "from shared.adapters.embedders.hashing import HashingEmbedder\n"
        "print(json.dumps(HashingEmbedder(384).embed_sync(json.loads(sys.stdin.read()))))\n"
    )
    for seed in ("1", "2"):
        done = subprocess.run(
            [sys.executable, "-c", script],
            input=json.dumps(TEXTS),
            capture_output=True,
            text=True,
            cwd=REPO,
            env={"PYTHONHASHSEED": seed, "PATH": ""},
            check=True,
        )
        assert json.loads(done.stdout) == HashingEmbedder(384).embed_sync(TEXTS)


@pytest.mark.parametrize("dimension", [2, 8, 100, 384, 1536])
def test_the_dimension_is_honoured(dimension: int) -> None:
    """Vectors have the requested dimension, unit length, and the name says which."""
    embedder = HashingEmbedder(dimension)
    assert embedder.name == f"hashing-{dimension}"
    assert embedder.dimension == dimension
    for vector in embedder.embed_sync(TEXTS):
        assert len(vector) == dimension
        assert math.hypot(*vector) == pytest.approx(1.0)


@pytest.mark.parametrize("dimension", [0, 1, -384])
def test_a_degenerate_dimension_is_refused(dimension: int) -> None:
    """A dimension below 2 is a configuration error."""
    with pytest.raises(ValueError, match="dimension"):
        HashingEmbedder(dimension)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("deploys", "deploy"),
        ("deployed", "deploying"),
        ("Deployment", "deploy"),
        ("queries", "query"),
        ("exceeded", "exceeds"),
        ("The quota", "quota"),
    ],
)
def test_inflections_case_and_stopwords_meet(a: str, b: str) -> None:
    """Light stemming, lowercasing and stopwords make these pairs embed identically."""
    first, second = HashingEmbedder().embed_sync([a, b])
    assert first == second


def test_word_order_matters_through_bigrams() -> None:
    """Same words in another order are similar but not identical (bigrams differ)."""
    forward, backward = HashingEmbedder().embed_sync(["dog bites man", "man bites dog"])
    assert 0.3 < cosine(forward, backward) < 0.9


def test_sharing_more_words_means_closer() -> None:
    """Similarity grows with word overlap: one shared content word < two < all of them."""
    base, one, two = HashingEmbedder().embed_sync(
        [DEPLOY_FAILURE, "quota", "quota exceeded on deploy"],
    )
    assert 0.0 < cosine(base, one) < cosine(base, two) < 1.0


async def test_embed_is_embed_sync() -> None:
    """The async port method answers exactly what the synchronous one does."""
    embedder = HashingEmbedder()
    assert await embedder.embed(TEXTS) == embedder.embed_sync(TEXTS)
