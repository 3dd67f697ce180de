"""hybrid's lexical leg as sparse vectors: Okapi BM25 split between the stored and the query side.

    BM25(q, d) = Σ_{t ∈ q ∩ d} idf(t) · tf(t,d)·(k1 + 1) / (tf(t,d) + k1·(1 - b + b·|d| / avgdl))

The entry's sparse vector stores the right-hand factor per term (:func:`document_weights`); the
cue's sparse vector carries ``idf(t)`` per term (:func:`query_weights`); the vector store's dot
product is then the BM25 score, computed from an inverted index — its cost follows the postings
of the cue's terms inside the store, not a scan of every entry sharing a word in Postgres.

Terms are Postgres's own lexemes (``to_tsvector('english', text)``: the same parser, stemming
and stop words as the ``search`` column), term frequency is a lexeme's position count and
``|d|`` its number of distinct lexemes — exactly what the Postgres reference leg
(``shared.storage.entries.recall.lexical_scores``) uses. Document frequencies, N and avgdl come from the
per-owner statistics Postgres keeps in step with the entries (migration 0006), summed over the
owner scopes the caller may see.

Two deliberate differences from the Postgres leg, both small: ``avgdl`` in an entry's stored
weights is its owner scope's at indexing time (``engram reindex`` brings every entry to the
current one), and statistics count active entries, including expired ones the sweeper has not
erased yet.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping

__all__ = ["BM25_B", "BM25_K1", "LEXICAL_VECTOR", "document_weights", "idf", "query_weights", "term_index"]

#: BM25's usual constants (Robertson & Zaragoza), shared with the Postgres reference leg.
BM25_K1, BM25_B = 1.2, 0.75
#: The name of the sparse vector beside each entry's dense one.
LEXICAL_VECTOR = "lexical"


def term_index(lexeme: str) -> int:
    """A lexeme's sparse dimension: 32 bits of its BLAKE2b hash (sparse indices are u32). Two
    lexemes share one with probability ~V²/2³³ over a vocabulary of V — about one pair among
    100k distinct lexemes, whose entries then also match each other's cues."""
    return int.from_bytes(hashlib.blake2b(lexeme.encode(), digest_size=4).digest(), "big")


def document_weights(term_frequencies: Mapping[str, int], avg_len: float) -> dict[int, float]:
    """The stored half of BM25 for an entry with these lexeme frequencies (its length is how many
    distinct lexemes it has)."""
    length = max(len(term_frequencies), 1)
    norm = BM25_K1 * (1 - BM25_B + BM25_B * length / max(avg_len, 1.0))
    weights: dict[int, float] = {}
    for lexeme, tf in term_frequencies.items():
        index = term_index(lexeme)
        weights[index] = weights.get(index, 0.0) + tf * (BM25_K1 + 1) / (tf + norm)
    return weights


def idf(documents: int, containing: int) -> float:
    """BM25's IDF, always positive (Lucene's form): ln(1 + (N - n + 0.5) / (n + 0.5))."""
    return math.log(1 + (documents - containing + 0.5) / (containing + 0.5))


def query_weights(documents: int, containing: Mapping[str, int]) -> dict[int, float]:
    """The cue's sparse vector: each lexeme that some visible entry holds, weighted by its IDF."""
    weights: dict[int, float] = {}
    for lexeme, count in containing.items():
        if count > 0:
            index = term_index(lexeme)
            weights[index] = weights.get(index, 0.0) + idf(max(documents, count), count)
    return weights
