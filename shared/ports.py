"""Ports: what the domain needs from the outside world, as Protocols. Adapters live beside
them (``shared/adapters/distillers/…``) and are chosen at the composition root."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Protocol, runtime_checkable
from uuid import UUID

from contracts.events import SessionEnded

__all__ = [
    "Distiller",
    "Embedder",
    "Lesson",
    "SupersessionJudge",
    "TenantFilter",
    "TraceSummary",
    "VectorHit",
    "VectorIndex",
    "VectorPoint",
]


@dataclass(frozen=True)
class Lesson:
    """One lesson a distiller proposes; the save path decides whether it is kept."""

    text: str
    importance: float
    memory_type: str = "lesson"


@dataclass(frozen=True)
class TraceSummary:
    """The at most 25 most informative calls of a trace, which they are, and rendered for a model.

    The rendering is made when a distiller first reads :attr:`text`: choosing the calls is cheap,
    rendering them (PII-safe cuts of long fields) is not, and the built-in distiller never reads it."""

    #: indexes into ``session.tool_trace`` of the calls kept, in trace order.
    kept_indexes: tuple[int, ...]
    total_calls: int
    render: Callable[[], str] = field(repr=False, compare=False)

    @cached_property
    def text(self) -> str:
        return self.render()


@runtime_checkable
class Distiller(Protocol):
    """Turns one ended session into at most five lessons. An empty list is a normal answer.

    Raising means "try again later" (the event is redelivered with backoff, then dead-lettered);
    a distiller never fails the session itself.
    """

    name: str

    async def distill(self, session: SessionEnded, summary: TraceSummary) -> list[Lesson]: ...

    async def aclose(self) -> None:
        """Release what it holds (a model endpoint's connections); a no-op for in-process ones."""
        ...


@runtime_checkable
class SupersessionJudge(Protocol):
    """Judges a pair the offline rules left undecided (docs/adr/0103-knowledge-updates.md): does
    ``new`` update or contradict ``old`` (the same owner's)? None: no answer now (the model is
    down or unreadable), and the rules' "no" stands."""

    async def supersedes(self, old: str, new: str) -> bool | None: ...

    async def aclose(self) -> None: ...


# -- recall ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class TenantFilter:
    """What every vector query must carry: the organization, the agent config, and the owner
    scopes the caller may see (``""`` is the shared pool). Narrowing fields are optional."""

    org_id: UUID
    agent_config_id: UUID
    owner_keys: tuple[str, ...]
    layer: str | None = None
    session_id: str | None = None
    memory_types: tuple[str, ...] | None = None


@dataclass(frozen=True)
class VectorPoint:
    """One entry's vector and the tenancy fields indexed beside it (never its text)."""

    id: UUID
    vector: Sequence[float]
    org_id: UUID
    agent_config_id: UUID
    owner_key: str
    layer: str
    memory_type: str
    session_id: str | None
    created_at: float  # epoch seconds
    #: The entry's lexical (BM25) sparse vector beside the dense one: dimension → weight
    #: (``shared.text.lexical.document_weights``); empty for a text without lexemes.
    lexical: Mapping[int, float] = field(default_factory=dict)


@dataclass(frozen=True)
class VectorHit:
    id: UUID
    score: float


@runtime_checkable
class VectorIndex(Protocol):
    """Nearest-neighbour search over entry vectors (dense, and the lexical sparse vector beside
    each), always within one tenant's scope. Deleting an id removes both.

    ``search`` refuses (``ValueError``) a filter without organization, agent config or owner
    scopes; an empty ``owner_keys`` means "sees nothing" and returns nothing.
    """

    dimension: int

    async def upsert(self, points: Sequence[VectorPoint]) -> None: ...

    async def delete(self, ids: Sequence[UUID]) -> None: ...

    async def search(self, vector: Sequence[float], tenant: TenantFilter, limit: int) -> list[VectorHit]: ...

    async def search_lexical(
        self, terms: Mapping[int, float], tenant: TenantFilter, limit: int
    ) -> list[VectorHit]:
        """The entries whose lexical vectors score highest against ``terms`` (dot product), within
        the same tenant filter as :meth:`search`; entries sharing no term are not returned."""
        ...

    async def count(self) -> int: ...

    async def close(self) -> None: ...


@runtime_checkable
class Embedder(Protocol):
    """Texts → vectors of ``dimension`` floats (L2-normalized). Raising ``Unavailable`` means
    "try again later"; a wrong dimension raises ``EmbeddingDimensionMismatch``."""

    name: str
    dimension: int

    async def embed(self, texts: Sequence[str]) -> list[list[float]]: ...

    def load(self) -> None:
        """Read and check the model now (blocking; a no-op for a remote model), so a damaged
        install fails the start and the first embedding does not wait for it."""
        ...

    async def aclose(self) -> None:
        """Release what it holds (a model endpoint's connections); a no-op for in-process ones."""
        ...
