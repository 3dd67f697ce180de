"""A deterministic feature-hashing embedder: for tests, demos and offline use, not a semantic model.

Each text becomes a bag of word unigrams and bigrams (lowercased, common English stopwords left
out, light suffix stripping so ``deploys``/``deployed``/``deploy`` meet). Every feature is hashed
with BLAKE2b (stable across processes and machines, unlike Python's salted ``hash()``) to a bucket
and a sign; counts are damped (``1 + ln tf``) and the vector is L2-normalized. Texts that share
words are close; texts that only mean the same thing are not. Pure Python, no dependencies.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from functools import lru_cache
from hashlib import blake2b
from itertools import pairwise

__all__ = ["HashingEmbedder", "feature_hashes"]

_WORD_RE = re.compile(r"\w+")
_SIGN_BIT = 1 << 63
_MASK_64 = (1 << 64) - 1
# Odd 64-bit constants (golden ratio, splitmix64) that spread a bigram's two hashes over all bits.
_MIX_1 = 0x9E3779B97F4A7C15
_MIX_2 = 0xBF58476D1CE4E5B9
# 1 + ln(tf) for small term counts, looked up instead of computed: most counts are 1.
_DAMPED = [0.0, *(1.0 + math.log(count) for count in range(1, 64))]
_DAMPED_LEN = len(_DAMPED)
# Frequent words that would otherwise make unrelated sentences look alike. (One string, not a
# list literal: ruff format would spread 53 words over 53 lines.)
_STOPWORDS = frozenset(
    (  # noqa: SIM905
        "a an and are as at be been but by do does for from had has have i if in into is it its me my "
        "of on or our so than that the their them then there these they this to was we were what when "
        "which who will with you your"
    ).split()
)
# Longest first; each only when the remaining stem keeps at least three characters.
_SUFFIXES = ("ments", "ment", "ings", "ing", "ies", "ed", "s")


class HashingEmbedder:
    """An :class:`~shared.ports.Embedder` by signed feature hashing; ``name`` is ``hashing-<dimension>``.

    Deterministic: the same text gives the same vector in every process. A text without any word
    (empty, punctuation only) gets the same fixed vector as every other such text.
    """

    def __init__(self, dimension: int = 384) -> None:
        if dimension < 2:
            raise ValueError(f"hashing embedder dimension must be at least 2, got {dimension}")
        self.dimension = dimension
        self.name = f"hashing-{dimension}"

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """The unit vectors of ``texts``, in order. Fast enough (>20k short texts/s) to run inline."""
        return self.embed_sync(texts)

    def embed_sync(self, texts: Sequence[str]) -> list[list[float]]:
        """:meth:`embed` without the event loop, for benchmarks and synchronous callers."""
        return [self._vector(text) for text in texts]

    def load(self) -> None:
        """Nothing to load: the hashing embedder has no model."""

    async def aclose(self) -> None:
        """Nothing held."""

    def _vector(self, text: str) -> list[float]:
        dimension = self.dimension
        buckets: dict[int, float] = {}
        bucket_value = buckets.get  # bound once: this loop is the embedder's hot path
        for digest, count in Counter(feature_hashes(text)).items():
            weight = _DAMPED[count] if count < _DAMPED_LEN else 1.0 + math.log(count)
            bucket = digest % dimension
            buckets[bucket] = bucket_value(bucket, 0.0) + (weight if digest & _SIGN_BIT else -weight)
        norm = math.sqrt(sum(value * value for value in buckets.values()))
        vector = [0.0] * dimension
        if norm == 0.0:
            # Colliding features cancelled out exactly: any fixed unit vector keeps the port's
            # promise of L2-normalized output.
            vector[0] = 1.0
            return vector
        for bucket, value in buckets.items():
            vector[bucket] = value / norm
        return vector


def feature_hashes(text: str) -> list[int]:
    """The 64-bit hashes of the features of ``text``: its word stems, then each adjacent pair.

    Stopwords are left out unless the text has nothing else; a text without words has the one
    feature of the empty word, so it still gets a vector. A bigram's hash is mixed from its two
    words' hashes rather than hashed from a joined string: same result every time, far cheaper.
    """
    words = _WORD_RE.findall(text.lower())
    kept = [word for word in words if word not in _STOPWORDS] or words or [""]
    unigrams = list(map(_word_hash, kept))
    bigrams = [_mix(first, second) for first, second in pairwise(unigrams)]
    return unigrams + bigrams


def _mix(first: int, second: int) -> int:
    mixed = ((first ^ (second * _MIX_1)) * _MIX_2) & _MASK_64
    return mixed ^ (mixed >> 31)


@lru_cache(maxsize=1 << 16)
def _word_hash(word: str) -> int:
    """A word's stem, hashed to 64 stable bits: the bucket comes from its value, the sign from its top bit."""
    return int.from_bytes(blake2b(_stem(word).encode(), digest_size=8).digest(), "little")


def _stem(word: str) -> str:
    """A crude stem: one inflectional suffix off, then a final "e" ("creates", "created" → "creat")."""
    for suffix in _SUFFIXES:
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            stem = word[: -len(suffix)]
            if suffix == "ies":
                return stem + "y"
            if (suffix == "s" and stem.endswith(("s", "u", "i"))) or (suffix == "ed" and stem.endswith("e")):
                return word  # "class", "status", "analysis", "exceed" are not inflected
            word = stem
            break
    if len(word) > 3 and word.endswith("e"):
        return word[:-1]
    return word
