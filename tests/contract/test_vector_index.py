"""The behaviour every VectorIndex adapter must show, written once (:class:`VectorIndexSuite`) and
run against Qdrant Edge on a temporary directory and qdrant-client's local mode; then the two
compared on the same data, and Qdrant Edge's background indexing checked on its own.

No servers: these run at unit-test speed.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4, uuid5

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from qdrant_client import AsyncQdrantClient, models

from contracts.errors import EmbeddingDimensionMismatch, VectorUnavailable
from shared.adapters.vectors._tenancy import KEYWORD_FIELDS, payload_of, tenant_conditions
from shared.adapters.vectors.qdrant_edge import QdrantEdgeIndex
from shared.adapters.vectors.qdrant_server import QdrantServerIndex
from shared.ports import TenantFilter, VectorHit, VectorIndex, VectorPoint
from tests.platform import eventually

pytestmark = pytest.mark.filterwarnings("ignore:Payload indexes have no effect in the local Qdrant")

DIM = 8
OWNERS = ("", "alice", "bob", "carol")

OpenIndex = Callable[..., VectorIndex]


def unit(seed: int, dimension: int = DIM) -> list[float]:
    """A reproducible random unit vector."""
    vector = np.random.default_rng(seed).standard_normal(dimension)
    return (vector / np.linalg.norm(vector)).tolist()


def point(
    vector: Sequence[float],
    tenant: TenantFilter,
    *,
    owner: str = "",
    layer: str = "semantic",
    memory_type: str = "lesson",
    session_id: str | None = None,
    point_id: UUID | None = None,
    lexical: dict[int, float] | None = None,
) -> VectorPoint:
    return VectorPoint(
        id=point_id or uuid4(),
        vector=vector,
        org_id=tenant.org_id,
        agent_config_id=tenant.agent_config_id,
        owner_key=owner,
        layer=layer,
        memory_type=memory_type,
        session_id=session_id,
        created_at=time.time(),
        lexical=lexical or {},
    )


def scope(owner_keys: Sequence[str] = OWNERS, **narrowing: Any) -> TenantFilter:
    """A fresh organization and agent config seeing ``owner_keys``."""
    return TenantFilter(uuid4(), uuid4(), tuple(owner_keys), **narrowing)


def ids(hits: Sequence[VectorHit]) -> list[UUID]:
    return [hit.id for hit in hits]


# -- tenant isolation: a grid of points and the filters that may see them ---------------------

_HOME = scope(owner_keys=())
_ELSEWHERE = scope(owner_keys=())
_GRID_VECTOR = unit(42)
_GRID_TERMS = {1: 1.0}


def _grid() -> list[VectorPoint]:
    """A point for each combination of org, agent config, owner, layer, session and memory type
    (2 x 2 x 3 x 2 x 3 x 2 = 144), all with one vector and one term, so only the filter tells
    them apart. Ids are fixed, so filling the grid again replaces it."""
    points = []
    for org, config, owner, layer, session, memory_type in itertools.product(
        (_HOME.org_id, _ELSEWHERE.org_id),
        (_HOME.agent_config_id, _ELSEWHERE.agent_config_id),
        ("", "alice", "bob"),
        ("semantic", "episodic"),
        (None, "s1", "s2"),
        ("lesson", "fact"),
    ):
        where = TenantFilter(org, config, ())
        point_id = uuid5(_HOME.org_id, repr((org, config, owner, layer, session, memory_type)))
        points.append(
            point(
                _GRID_VECTOR,
                where,
                owner=owner,
                layer=layer,
                session_id=session,
                memory_type=memory_type,
                point_id=point_id,
                lexical=_GRID_TERMS,
            )
        )
    return points


_GRID = _grid()


def _allows(asked: TenantFilter, p: VectorPoint) -> bool:
    """What a tenant filter lets through, stated here from SPEC 3, not from the adapters' code."""
    return (
        p.org_id == asked.org_id
        and p.agent_config_id == asked.agent_config_id
        and p.owner_key in asked.owner_keys
        and (asked.layer is None or p.layer == asked.layer)
        and (asked.session_id is None or p.session_id == asked.session_id)
        and (asked.memory_types is None or p.memory_type in asked.memory_types)
    )


async def _ensure_grid(index: VectorIndex) -> None:
    if await index.count() != len(_GRID):
        await index.upsert(_GRID)


def _home(*owner_keys: str, **narrowing: Any) -> TenantFilter:
    return TenantFilter(_HOME.org_id, _HOME.agent_config_id, owner_keys, **narrowing)


_EVERYONE = ("", "alice", "bob")

#: Each case: the filter, and how many grid points it allows (the grid has 12 per owner in
#: each org x agent config: 2 layers x 3 sessions x 2 memory types).
_ISOLATION_CASES: dict[str, tuple[TenantFilter, int]] = {
    "home, every owner": (_home(*_EVERYONE), 36),
    "another org, same agent config": (
        TenantFilter(_ELSEWHERE.org_id, _HOME.agent_config_id, _EVERYONE),
        36,
    ),
    "same org, another agent config": (
        TenantFilter(_HOME.org_id, _ELSEWHERE.agent_config_id, _EVERYONE),
        36,
    ),
    "another org and agent config": (
        TenantFilter(_ELSEWHERE.org_id, _ELSEWHERE.agent_config_id, ("alice",)),
        12,
    ),
    "one owner key": (_home("alice"), 12),
    "another owner key": (_home("bob"), 12),
    "the shared pool only": (_home(""), 12),
    "an owner and the shared pool": (_home("alice", ""), 24),
    "an owner key with no points": (_home("mallory"), 0),
    "owner keys repeated": (_home("alice", "alice"), 12),
    "no owner keys": (_home(), 0),
    "no owner keys, narrowed": (_home(layer="semantic", session_id="s1"), 0),
    "layer": (_home(*_EVERYONE, layer="episodic"), 18),
    "a layer no point has": (_home(*_EVERYONE, layer="procedural"), 0),
    "session": (_home(*_EVERYONE, session_id="s1"), 12),
    "a session no point has": (_home(*_EVERYONE, session_id="s3"), 0),
    "memory types": (_home(*_EVERYONE, memory_types=("fact",)), 18),
    "memory types, one unknown": (_home(*_EVERYONE, memory_types=("fact", "preference")), 18),
    "no memory types": (_home(*_EVERYONE, memory_types=()), 0),
    "owner and layer": (_home("alice", layer="semantic"), 6),
    "owner, layer and session": (_home("alice", layer="semantic", session_id="s2"), 2),
    "owner, layer, session and memory type": (
        _home("bob", layer="episodic", session_id="s1", memory_types=("lesson",)),
        1,
    ),
    "session and memory types": (_home("", "alice", session_id="s2", memory_types=("lesson", "fact")), 8),
    "another agent config, narrowed": (
        TenantFilter(
            _HOME.org_id, _ELSEWHERE.agent_config_id, ("alice",), layer="semantic", memory_types=("fact",)
        ),
        3,
    ),
}

_ANY_FILTER = st.builds(
    TenantFilter,
    org_id=st.sampled_from((_HOME.org_id, _ELSEWHERE.org_id)),
    agent_config_id=st.sampled_from((_HOME.agent_config_id, _ELSEWHERE.agent_config_id)),
    owner_keys=st.lists(st.sampled_from(("", "alice", "bob", "mallory")), max_size=4).map(tuple),
    layer=st.sampled_from((None, "semantic", "episodic", "procedural")),
    session_id=st.sampled_from((None, "s1", "s2", "s3")),
    memory_types=st.none()
    | st.lists(st.sampled_from(("lesson", "fact", "preference")), max_size=3).map(tuple),
)


async def _isolation_problems(index: VectorIndex, name: str, asked: TenantFilter, allowed: int) -> list[str]:
    """What is wrong with the dense and the lexical search through ``asked`` (nothing: ``[]``):
    a point found that the filter does not allow, or one it allows but not found."""
    expected = {p.id for p in _GRID if _allows(asked, p)}
    if len(expected) != allowed:
        return [f"{name}: the case says {allowed} points, the grid has {len(expected)} it allows"]
    problems = []
    found_by = {
        "search": await index.search(_GRID_VECTOR, asked, limit=len(_GRID) + 1),
        "search_lexical": await index.search_lexical(_GRID_TERMS, asked, limit=len(_GRID) + 1),
    }
    for how, hits in found_by.items():
        found = set(ids(hits))
        if found != expected:
            strangers = [_describe(p) for p in _GRID if p.id in found - expected]
            missed = [_describe(p) for p in _GRID if p.id in expected - found]
            problems.append(
                f"{name}: {how} found {len(found)} of {len(expected)} allowed; "
                f"not allowed: {strangers[:3]}; missed: {missed[:3]}"
            )
    return problems


def _describe(p: VectorPoint) -> str:
    org = "home" if p.org_id == _HOME.org_id else "other"
    config = "home" if p.agent_config_id == _HOME.agent_config_id else "other"
    return f"org={org} config={config} owner={p.owner_key!r} {p.layer} {p.session_id} {p.memory_type}"


def test_the_filter_pins_only_keys_written_and_indexed() -> None:
    """Every payload key a tenant filter can pin is written beside each vector and indexed by both
    adapters, so writing and filtering cannot drift apart."""
    narrowest = tenant_conditions(_home("alice", layer="semantic", session_id="s1", memory_types=("fact",)))
    assert narrowest is not None
    pinned = {condition.key for condition in narrowest}
    assert pinned == set(KEYWORD_FIELDS)
    assert pinned <= payload_of(_GRID[0]).keys()


class VectorIndexSuite:
    """Subclass as ``Test<Adapter>Contract``: provide a ``storage`` fixture (where the points
    live, shared by every index a test opens, so a second index there is a restart) and
    :meth:`make`."""

    def make(self, storage: Any, dimension: int) -> VectorIndex:
        raise NotImplementedError

    @pytest.fixture
    async def open_index(self, storage: Any) -> AsyncIterator[OpenIndex]:
        opened: list[VectorIndex] = []

        def open_(dimension: int = DIM) -> VectorIndex:
            opened.append(self.make(storage, dimension))
            return opened[-1]

        yield open_
        for index in opened:
            await index.close()

    @pytest.fixture
    def index(self, open_index: OpenIndex) -> VectorIndex:
        return open_index()

    async def test_satisfies_the_port(self, index: VectorIndex) -> None:
        """The adapter is a VectorIndex of the dimension it was made with, empty at first."""
        assert isinstance(index, VectorIndex)
        assert index.dimension == DIM
        assert await index.count() == 0

    async def test_returns_the_nearest_first(self, index: VectorIndex) -> None:
        """Hits come nearest first, scored by cosine similarity (1.0 for the same direction)."""
        tenant = scope()
        points = [point(unit(seed), tenant) for seed in range(20)]
        await index.upsert(points)
        target = points[7]
        query = [2.0 * x for x in target.vector]  # cosine ignores length
        hits = await index.search(query, tenant, limit=5)
        assert hits[0].id == target.id
        assert hits[0].score == pytest.approx(1.0, abs=1e-5)
        scores = [hit.score for hit in hits]
        assert scores == sorted(scores, reverse=True)
        expected = sorted(points, key=lambda p: -float(np.dot(p.vector, target.vector)))[:5]
        assert ids(hits) == [p.id for p in expected]
        assert scores == pytest.approx([float(np.dot(p.vector, target.vector)) for p in expected], abs=1e-5)

    async def test_never_returns_another_tenants_point(self, index: VectorIndex) -> None:
        """With identical vectors, a point that differs in org, agent config or owner is never a hit."""
        home = scope(owner_keys=("alice",))
        vector = unit(1)
        mine = point(vector, home, owner="alice")
        other_org = point(vector, TenantFilter(uuid4(), home.agent_config_id, ("alice",)), owner="alice")
        other_agent = point(vector, TenantFilter(home.org_id, uuid4(), ("alice",)), owner="alice")
        other_owner = point(vector, home, owner="bob")
        await index.upsert([mine, other_org, other_agent, other_owner])

        assert ids(await index.search(vector, home, limit=10)) == [mine.id]
        both_owners = TenantFilter(home.org_id, home.agent_config_id, ("alice", "bob"))
        assert set(ids(await index.search(vector, both_owners, limit=10))) == {mine.id, other_owner.id}
        for stranger in (other_org, other_agent):
            theirs = TenantFilter(stranger.org_id, stranger.agent_config_id, ("alice", "bob", ""))
            assert ids(await index.search(vector, theirs, limit=10)) == [stranger.id]

    # One test body run by each adapter's subclass (differing executors) on a fixture it
    # re-populates idempotently every example: both health checks are expected here.
    @settings(
        max_examples=25,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.differing_executors],
    )
    @given(visible=st.sets(st.sampled_from(OWNERS)))
    async def test_sees_exactly_the_owner_scopes_it_asks_for(
        self, index: VectorIndex, visible: set[str]
    ) -> None:
        """For any set of owner keys, hits are exactly the tenant's points of those owners."""
        tenant = _PROPERTY_TENANT
        decoys = (TenantFilter(uuid4(), tenant.agent_config_id, ()), TenantFilter(tenant.org_id, uuid4(), ()))
        vector = unit(3)
        mine = {
            owner: point(vector, tenant, owner=owner, point_id=_owner_id(tenant, owner)) for owner in OWNERS
        }
        await index.upsert([*mine.values(), *(point(vector, d, owner=o) for d in decoys for o in OWNERS)])
        asked = TenantFilter(tenant.org_id, tenant.agent_config_id, tuple(sorted(visible)))
        hits = await index.search(vector, asked, limit=50)
        assert set(ids(hits)) == {mine[owner].id for owner in visible}

    async def test_no_owner_keys_sees_nothing(self, index: VectorIndex) -> None:
        """An empty owner_keys is a valid filter that matches nothing."""
        tenant = scope()
        await index.upsert([point(unit(1), tenant, owner=owner) for owner in OWNERS])
        nobody = TenantFilter(tenant.org_id, tenant.agent_config_id, ())
        assert await index.search(unit(1), nobody, limit=10) == []

    @pytest.mark.parametrize("missing", ["org_id", "agent_config_id", "owner_keys"])
    async def test_refuses_a_filter_without_a_scope(self, index: VectorIndex, missing: str) -> None:
        """A filter missing its organization, agent config or owner keys is refused, not widened."""
        tenant = scope()
        await index.upsert([point(unit(1), tenant)])
        fields: dict[str, Any] = {"org_id": tenant.org_id, "agent_config_id": tenant.agent_config_id}
        fields["owner_keys"] = tenant.owner_keys
        fields[missing] = None
        with pytest.raises(ValueError, match=missing):
            await index.search(unit(1), TenantFilter(**fields), limit=10)

    async def test_layer_session_and_memory_type_narrow_the_search(self, index: VectorIndex) -> None:
        """layer, session_id and memory_types each keep only the points that match them."""
        tenant = scope()
        vector = unit(5)
        episodic = point(vector, tenant, layer="episodic", session_id="s1", memory_type="episodic")
        lesson = point(vector, tenant, layer="semantic", session_id="s1", memory_type="lesson")
        fact = point(vector, tenant, layer="semantic", session_id="s2", memory_type="fact")
        no_session = point(vector, tenant, layer="semantic", memory_type="preference")
        await index.upsert([episodic, lesson, fact, no_session])

        async def found(**narrowing: Any) -> set[UUID]:
            narrowed = TenantFilter(tenant.org_id, tenant.agent_config_id, OWNERS, **narrowing)
            return set(ids(await index.search(vector, narrowed, limit=10)))

        assert await found() == {episodic.id, lesson.id, fact.id, no_session.id}
        assert await found(layer="episodic") == {episodic.id}
        assert await found(session_id="s1") == {episodic.id, lesson.id}
        assert await found(memory_types=("fact", "preference")) == {fact.id, no_session.id}
        assert await found(layer="semantic", session_id="s1", memory_types=("lesson",)) == {lesson.id}
        assert await found(memory_types=()) == set()

    async def test_every_tenant_filter_finds_exactly_the_allowed_points(self, index: VectorIndex) -> None:
        """On a grid of points differing in org, agent config, owner, layer, session and memory
        type (same vector, same terms), each named filter finds exactly the points it allows,
        in the dense and the lexical search alike."""
        await _ensure_grid(index)
        wrong = [
            problem
            for name, (asked, allowed) in _ISOLATION_CASES.items()
            for problem in await _isolation_problems(index, name, asked, allowed)
        ]
        assert not wrong, "\n".join(wrong)

    # As test_sees_exactly_the_owner_scopes_it_asks_for: one fixture, filled once, many examples.
    @settings(
        max_examples=60,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.differing_executors],
    )
    @given(asked=_ANY_FILTER)
    async def test_any_tenant_filter_finds_exactly_the_allowed_points(
        self, index: VectorIndex, asked: TenantFilter
    ) -> None:
        """For any combination of org, agent config, owner keys, layer, session and memory types,
        both searches find exactly the grid points that combination allows."""
        await _ensure_grid(index)
        allowed = sum(_allows(asked, p) for p in _GRID)
        assert await _isolation_problems(index, "drawn", asked, allowed) == []

    async def test_delete_removes_and_ignores_unknown_ids(self, index: VectorIndex) -> None:
        """Deleted points are gone from search and count; deleting unknown ids changes nothing."""
        tenant = scope()
        points = [point(unit(seed), tenant) for seed in range(5)]
        await index.upsert(points)
        await index.delete([points[0].id, points[1].id])
        await index.delete([uuid4()])
        await index.delete([])
        assert await index.count() == 3
        hits = await index.search(points[0].vector, tenant, limit=10)
        assert set(ids(hits)) == {p.id for p in points[2:]}

    async def test_upserting_an_id_again_replaces_it(self, index: VectorIndex) -> None:
        """A second upsert of an id replaces its vector and payload; it never appears twice."""
        tenant = scope()
        first = point(unit(1), tenant, owner="alice")
        await index.upsert([first, point(unit(2), tenant)])
        moved = point(unit(9), tenant, owner="bob", point_id=first.id)
        await index.upsert([moved])
        assert await index.count() == 2
        hits = await index.search(unit(9), tenant, limit=10)
        assert ids(hits).count(first.id) == 1
        assert hits[0].id == first.id
        assert hits[0].score == pytest.approx(1.0, abs=1e-5)
        alice_only = TenantFilter(tenant.org_id, tenant.agent_config_id, ("alice",))
        assert await index.search(unit(9), alice_only, limit=10) == []

    async def test_refuses_vectors_of_another_dimension(self, index: VectorIndex) -> None:
        """A vector of the wrong length is refused on write and on search, and nothing is written."""
        tenant = scope()
        with pytest.raises(EmbeddingDimensionMismatch):
            await index.upsert([point(unit(1), tenant), point(unit(2, DIM + 1), tenant)])
        with pytest.raises(EmbeddingDimensionMismatch):
            await index.search(unit(1, DIM - 1), tenant, limit=10)
        assert await index.count() == 0

    async def test_lexical_search_scores_by_dot_product_within_the_tenant(self, index: VectorIndex) -> None:
        """search_lexical ranks by the dot product of the sparse vectors, leaves out points sharing
        no term, and keeps to the same tenant filter as the dense search."""
        home = scope(owner_keys=("alice",))
        strong = point(unit(1), home, owner="alice", lexical={7: 2.0, 11: 1.0})
        weak = point(unit(2), home, owner="alice", lexical={11: 0.5, 99: 3.0})
        unrelated = point(unit(3), home, owner="alice", lexical={99: 3.0})
        no_terms = point(unit(4), home, owner="alice")
        other_owner = point(unit(5), home, owner="bob", lexical={7: 5.0})
        other_org = point(
            unit(6), TenantFilter(uuid4(), home.agent_config_id, ("alice",)), owner="alice", lexical={7: 5.0}
        )
        await index.upsert([strong, weak, unrelated, no_terms, other_owner, other_org])
        hits = await index.search_lexical({7: 1.5, 11: 1.0}, home, limit=10)
        assert ids(hits) == [strong.id, weak.id]
        assert [hit.score for hit in hits] == pytest.approx([2.0 * 1.5 + 1.0, 0.5])
        assert await index.search_lexical({}, home, limit=10) == []
        assert (
            await index.search_lexical(
                {7: 1.0}, TenantFilter(home.org_id, home.agent_config_id, ()), limit=10
            )
            == []
        )
        narrowed = TenantFilter(home.org_id, home.agent_config_id, ("alice",), layer="episodic")
        assert await index.search_lexical({7: 1.0}, narrowed, limit=10) == []

    async def test_delete_removes_the_lexical_vector_too(self, index: VectorIndex) -> None:
        """A deleted point is gone from the lexical search as well; a rewrite without terms
        leaves no lexical vector behind."""
        tenant = scope()
        gone = point(unit(1), tenant, lexical={3: 1.0})
        rewritten = point(unit(2), tenant, lexical={3: 2.0})
        await index.upsert([gone, rewritten])
        await index.delete([gone.id])
        await index.upsert([point(unit(2), tenant, point_id=rewritten.id)])
        assert await index.search_lexical({3: 1.0}, tenant, limit=10) == []

    async def test_a_reopened_index_finds_its_points(self, open_index: OpenIndex) -> None:
        """After close, a new index on the same storage has every point, searchable as before."""
        tenant = scope()
        points = [point(unit(seed), tenant) for seed in range(10)]
        first = open_index()
        await first.upsert(points)
        await first.delete([points[0].id])
        await first.close()
        again = open_index()
        assert await again.count() == 9
        hits = await again.search(points[3].vector, tenant, limit=3)
        assert hits[0].id == points[3].id


_PROPERTY_TENANT = scope()


def _owner_id(tenant: TenantFilter, owner: str) -> UUID:
    """The same id for the same owner in every hypothesis example (re-upserts replace)."""
    return uuid5(tenant.org_id, owner)


class TestQdrantEdgeContract(VectorIndexSuite):
    @pytest.fixture
    def storage(self, tmp_path: Path) -> Path:
        return tmp_path / "edge"

    def make(self, storage: Path, dimension: int) -> VectorIndex:
        return QdrantEdgeIndex(storage, dimension)


class TestQdrantServerContract(VectorIndexSuite):
    """qdrant-client's local mode stands in for the server, which outlives the index objects."""

    @pytest.fixture
    async def storage(self) -> AsyncIterator[AsyncQdrantClient]:
        client = AsyncQdrantClient(":memory:")
        yield client
        await client.close()

    def make(self, storage: AsyncQdrantClient, dimension: int) -> VectorIndex:
        return QdrantServerIndex(storage, "engram_vectors", dimension)


@pytest.fixture(scope="session")
def qdrant_url() -> Iterator[str]:
    """A real Qdrant server: ``ENGRAM_TEST_QDRANT_URL`` if set, else one started with
    testcontainers when a Docker engine answers; skipped (with the reason) otherwise."""
    url = os.environ.get("ENGRAM_TEST_QDRANT_URL", "")
    if url:
        yield url
        return
    try:
        from testcontainers.community.qdrant import QdrantContainer  # type: ignore[import-untyped]
        from testcontainers.core.docker_client import DockerClient  # type: ignore[import-untyped]

        DockerClient().client.ping()
    except Exception as exc:  # no Docker engine here (this machine has none): say so, do not fail
        pytest.skip(f"no real Qdrant server: set ENGRAM_TEST_QDRANT_URL or run a Docker engine ({exc})")
    with QdrantContainer() as container:
        yield f"http://{container.get_container_host_ip()}:{container.get_exposed_port(6333)}"


class TestRealQdrantServerContract(VectorIndexSuite):
    """The same suite against a real Qdrant server (a fresh collection per test)."""

    @pytest.fixture
    async def storage(self, qdrant_url: str) -> AsyncIterator[tuple[AsyncQdrantClient, str]]:
        client = AsyncQdrantClient(url=qdrant_url, timeout=10)
        collection = f"engram_test_{uuid4().hex}"
        yield client, collection
        with contextlib.suppress(Exception):
            await client.delete_collection(collection)
        await client.close()

    def make(self, storage: tuple[AsyncQdrantClient, str], dimension: int) -> VectorIndex:
        client, collection = storage
        return QdrantServerIndex(client, collection, dimension)


async def test_an_unreachable_qdrant_server_is_vector_unavailable() -> None:
    """With no server at the URL, every call raises VectorUnavailable (retry later), not a client error."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = AsyncQdrantClient(url=f"http://127.0.0.1:{port}", timeout=2, check_compatibility=False)
    index = QdrantServerIndex(client, "engram_vectors", DIM)
    try:
        with pytest.raises(VectorUnavailable):
            await index.search(unit(1), scope(), limit=10)
        with pytest.raises(VectorUnavailable):
            await index.upsert([point(unit(1), scope())])
    finally:
        await client.close()


# -- both adapters on the same data ----------------------------------------------------------


async def test_edge_and_server_agree_on_the_nearest_ten(tmp_path: Path) -> None:
    """On 2,000 seeded random unit vectors, both adapters give the same top 10 for 50 queries."""
    dimension = 64
    rng = np.random.default_rng(2024)
    vectors = rng.standard_normal((2_000, dimension))
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    tenant = scope()
    points = [point(vector.tolist(), tenant, owner=OWNERS[i % 4]) for i, vector in enumerate(vectors)]
    client = AsyncQdrantClient(":memory:")
    edge = QdrantEdgeIndex(tmp_path / "edge", dimension)
    server = QdrantServerIndex(client, "engram_vectors", dimension)
    try:
        for index in (edge, server):
            await index.upsert(points)
        for query in rng.standard_normal((50, dimension)).tolist():
            from_edge = await edge.search(query, tenant, limit=10)
            from_server = await server.search(query, tenant, limit=10)
            _assert_same_ranking(from_edge, from_server)
    finally:
        await edge.close()
        await client.close()


def _assert_same_ranking(
    left: Sequence[VectorHit], right: Sequence[VectorHit], tolerance: float = 1e-5
) -> None:
    """Same scores in order; the ids agree except where scores tie (either order is right)."""
    assert [hit.score for hit in left] == pytest.approx([hit.score for hit in right], abs=tolerance)
    cutoff = left[-1].score + tolerance
    assert {h.id for h in left if h.score > cutoff} == {h.id for h in right if h.score > cutoff}
    assert len(set(ids(left))) == len(set(ids(right))) == len(left)


# -- Qdrant Edge: indexing in the background -------------------------------------------------


def _clustered(rng: np.random.Generator, count: int, dimension: int) -> np.ndarray:
    """Unit vectors around 30 centres: neighbourhoods an HNSW graph can find, like embeddings."""
    centres = rng.standard_normal((30, dimension))
    vectors = centres[rng.integers(0, 30, count)] + 0.3 * rng.standard_normal((count, dimension))
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def _exact_top(points: Sequence[VectorPoint], query: np.ndarray, limit: int) -> list[UUID]:
    scores = np.array([p.vector for p in points]) @ query
    return [points[i].id for i in np.argsort(-scores)[:limit]]


def _small_edge_index(path: Path, dimension: int) -> QdrantEdgeIndex:
    """Thresholds low enough that a few thousand points get an HNSW graph and searches use it."""
    return QdrantEdgeIndex(
        path,
        dimension,
        seal_threshold=100_000,
        check_interval_s=3_600,
        indexing_threshold_kb=1,
        full_scan_threshold_kb=1,
    )


async def test_edge_search_is_exact_before_indexing_and_right_after(tmp_path: Path) -> None:
    """Edge searches exactly before its build and through HNSW after it, and writes still apply."""
    dimension = 32
    rng = np.random.default_rng(7)
    tenant, neighbour = scope(), scope()
    mine = [
        point(v.tolist(), tenant, owner=OWNERS[i % 4])
        for i, v in enumerate(_clustered(rng, 2_000, dimension))
    ]
    theirs = [point(v.tolist(), neighbour) for v in _clustered(rng, 1_000, dimension)]
    queries = [mine[i].vector + 0.05 * rng.standard_normal(dimension) for i in range(0, 2_000, 100)]
    index = _small_edge_index(tmp_path / "edge", dimension)
    try:
        await index.upsert([*mine, *theirs])
        before = await index.stats()
        assert (before.indexed_vectors, before.pending_points) == (0, 3_000)
        for query in queries:
            assert ids(await index.search(query.tolist(), tenant, limit=10)) == _exact_top(mine, query, 10)

        await index.build_index()
        after = await index.stats()
        assert (after.points, after.pending_points, after.indexed_vectors) == (3_000, 0, 3_000)
        mine_ids = {p.id for p in mine}
        for position, query in zip(range(0, 2_000, 100), queries, strict=True):
            hits = ids(await index.search(query.tolist(), tenant, limit=10))
            assert hits[0] == mine[position].id
            assert set(hits) <= mine_ids
            assert len(set(hits) & set(_exact_top(mine, query, 10))) >= 9

        moved, gone = mine[0], mine[1]  # both in the built shard now
        await index.upsert([point(unit(77, dimension), tenant, point_id=moved.id)])
        await index.delete([gone.id])
        assert await index.count() == 2_999
        assert ids(await index.search(unit(77, dimension), tenant, limit=1)) == [moved.id]
        for old in (moved, gone):
            assert old.id not in ids(await index.search(old.vector, tenant, limit=10))
    finally:
        await index.close()


async def test_edge_serves_writes_and_searches_while_a_build_runs(tmp_path: Path) -> None:
    """During a build, writes and searches proceed at once; what changed meanwhile survives the swap."""
    dimension = 32
    rng = np.random.default_rng(11)
    tenant = scope()
    points = [point(v.tolist(), tenant) for v in _clustered(rng, 3_000, dimension)]
    index = _small_edge_index(tmp_path / "edge", dimension)
    try:
        await index.upsert(points)
        build = asyncio.create_task(index.build_index())
        while not (await index.stats()).building:  # a child process builds the HNSW graph
            assert not build.done()
            await asyncio.sleep(0.01)

        started = time.perf_counter()
        added = point(unit(99, dimension), tenant)
        await index.upsert([added])
        await index.delete([points[0].id])
        await index.upsert([point(unit(98, dimension), tenant, point_id=points[1].id)])
        hits = await index.search(unit(99, dimension), tenant, limit=1)
        assert time.perf_counter() - started < 0.5
        assert ids(hits) == [added.id]
        assert (await index.stats()).building, "the build finished before the writes: nothing was tested"

        await build
        assert await index.count() == 3_000
        assert points[0].id not in ids(await index.search(points[0].vector, tenant, limit=10))
        [replaced] = await index.search(unit(98, dimension), tenant, limit=1)
        assert replaced.id == points[1].id
        assert replaced.score == pytest.approx(1.0, abs=1e-5)
        assert ids(await index.search(unit(99, dimension), tenant, limit=1)) == [added.id]
        assert (await index.stats()).pending_points == 2
    finally:
        await index.close()


async def test_edge_reopens_with_its_index_and_unfinished_builds(tmp_path: Path) -> None:
    """A reopened Edge index keeps indexed and sealed-but-unbuilt shards, and finishes the build."""
    dimension = 32
    rng = np.random.default_rng(5)
    tenant = scope()
    points = [point(v.tolist(), tenant) for v in _clustered(rng, 1_500, dimension)]
    index = _small_edge_index(tmp_path / "edge", dimension)
    await index.upsert(points[:1_000])
    await index.build_index()
    await index.upsert(points[1_000:])
    build = asyncio.create_task(index.build_index())
    while not (await index.stats()).building:
        await asyncio.sleep(0.01)
    await index.close()  # abandons the build: the sealed shard waits, unindexed
    with pytest.raises(RuntimeError, match="closed"):
        await build

    again = _small_edge_index(tmp_path / "edge", dimension)
    try:
        assert await again.count() == 1_500
        assert ids(await again.search(points[1_200].vector, tenant, limit=1)) == [points[1_200].id]
        await again.build_index()
        stats = await again.stats()
        assert (stats.points, stats.pending_points, stats.indexed_vectors) == (1_500, 0, 1_500)
        assert not [child for child in (tmp_path / "edge").iterdir() if child.name.startswith("build-")]
    finally:
        await again.close()


async def test_edge_storage_stays_bounded_under_churn_below_the_cap(tmp_path: Path) -> None:
    """Writes and deletes that keep the live count far below ``seal_threshold`` (prune, expiry)
    still seal the live shard after that many writes; its build keeps only the survivors, so the
    deleted points leave storage instead of piling up in one live shard forever (found by
    ``make soak``: RSS grew ~3 MiB/min)."""
    dimension = 16
    rng = np.random.default_rng(3)
    tenant = scope()
    index = QdrantEdgeIndex(tmp_path / "edge", dimension, seal_threshold=200, check_interval_s=0.05)
    live_dirs: set[str] = set()
    try:
        window: list[VectorPoint] = []
        for _ in range(60):  # 1,200 writes, never more than 40 points alive
            batch = [point(v.tolist(), tenant) for v in rng.standard_normal((20, dimension))]
            await index.upsert(batch)
            window += batch
            if len(window) > 40:
                await index.delete([p.id for p in window[:20]])
                window = window[20:]
            live_dirs |= {p.name for p in (tmp_path / "edge").iterdir() if p.name.startswith("live-")}
            # Paced on the condition, not on time: once the live shard is due for sealing, the
            # next writes wait until the background task has sealed it (on a busy machine the
            # task runs late, and sampling the directory would miss short-lived live shards).
            for _ in range(6_000):
                if not index._live_full():
                    break
                await asyncio.sleep(0.01)
            live_dirs.add(index._manifest_now.live)

        def live_now() -> list[str]:
            return [p.name for p in (tmp_path / "edge").iterdir() if p.name.startswith("live-")]

        for _ in range(2_400):  # sealed live shards are built (vacuumed) and removed in the background
            if len(live_now()) == 1 and not (await index.stats()).building:
                break
            await asyncio.sleep(0.05)
        assert len(live_dirs) >= 4, "the live shard was never sealed under churn"
        assert await index.count() == 40
        assert len(live_now()) == 1, live_now()
        hits = await index.search(window[-1].vector, tenant, limit=1)
        assert ids(hits) == [window[-1].id]
    finally:
        await index.close()


async def test_edge_small_builds_go_back_into_the_live_shard(tmp_path: Path) -> None:
    """A background build left with fewer than ``absorb_below`` points (churn under a cap) makes
    no shard of its own: its points go back into the live shard, where they stay searchable. Each
    loaded shard pre-faults tens of MiB of mapped files whatever it holds (``make soak`` saw RSS
    jump 60 MiB per build); one live shard holds what a tiny sealed shard would."""
    dimension = 16
    rng = np.random.default_rng(13)
    tenant = scope()
    index = QdrantEdgeIndex(tmp_path / "edge", dimension, seal_threshold=400, check_interval_s=0.05)
    try:
        points = [point(v.tolist(), tenant) for v in rng.standard_normal((300, dimension))]
        await index.upsert(points)
        first_live = index._manifest_now.live
        await index.delete([p.id for p in points[50:]])  # 250 deleted: the live shard seals

        async def absorbed() -> bool:  # the background task seals, exports and absorbs
            stats = await index.stats()
            return index._manifest_now.live != first_live and stats.shards == 1 and not stats.building

        await eventually(absorbed, timeout=120, interval=0.05, what="the small build absorbed")
        assert index._manifest_now.live != first_live, "the live shard was never sealed"
        assert not [p.name for p in (tmp_path / "edge").iterdir() if p.name.startswith("sealed-")]
        stats = await index.stats()
        assert (stats.points, stats.pending_points, stats.shards) == (50, 50, 1)
        for kept in points[:50:7]:
            assert ids(await index.search(kept.vector, tenant, limit=1)) == [kept.id]
    finally:
        await index.close()


async def test_edge_absorbing_a_build_keeps_what_changed_meanwhile(tmp_path: Path) -> None:
    """A write or delete during an absorbed build wins over the exported copy of the point."""
    dimension = 16
    rng = np.random.default_rng(17)
    tenant = scope()
    index = QdrantEdgeIndex(tmp_path / "edge", dimension, seal_threshold=4_000, check_interval_s=3_600)
    try:
        points = [point(v.tolist(), tenant) for v in rng.standard_normal((600, dimension))]
        await index.upsert(points)
        # The build waits before absorbing until the writes below are done: however the machine
        # schedules it, they fall inside the build.
        release, absorb = asyncio.Event(), index._absorb

        async def absorb_when_released(*args: Any, **kwargs: Any) -> None:
            await release.wait()
            await absorb(*args, **kwargs)

        index._absorb = absorb_when_released  # type: ignore[method-assign]
        build = asyncio.create_task(index._build(seal=True, absorb=True))
        while index._changed_during_build is None:  # sealed; exporting in chunks now
            assert not build.done()
            await asyncio.sleep(0)
        moved, gone = points[0], points[1]
        await index.upsert([point(unit(5, dimension), tenant, point_id=moved.id)])
        await index.delete([gone.id])
        assert index._changed_during_build is not None, "the build ended before the writes"
        assert {moved.id, gone.id} <= index._changed_during_build

        release.set()
        await build
        assert not [p.name for p in (tmp_path / "edge").iterdir() if p.name.startswith("sealed-")]
        assert await index.count() == 599
        [hit] = await index.search(unit(5, dimension), tenant, limit=1)
        assert (hit.id, round(hit.score, 4)) == (moved.id, 1.0)
        assert gone.id not in ids(await index.search(gone.vector, tenant, limit=10))
    finally:
        await index.close()


async def test_edge_lexical_vectors_survive_the_build(tmp_path: Path) -> None:
    """The builder process carries each point's lexical vector into the indexed shard: lexical
    scores are the same before and after, and a delete afterwards removes it there too."""
    tenant = scope()
    points = [
        point(
            unit(seed), tenant, owner=OWNERS[seed % 4], lexical={seed % 7: 1.0 + seed / 100, 1000 + seed: 2.0}
        )
        for seed in range(300)
    ]
    index = _small_edge_index(tmp_path / "edge", DIM)
    try:
        await index.upsert(points)
        query = {3: 1.0, 1003: 10.0}
        before = await index.search_lexical(query, tenant, limit=50)
        await index.build_index()
        assert (await index.stats()).pending_points == 0
        after = await index.search_lexical(query, tenant, limit=50)
        assert [(hit.id, round(hit.score, 5)) for hit in after] == [
            (hit.id, round(hit.score, 5)) for hit in before
        ]
        assert after[0].id == points[3].id  # the only one with term 1003
        await index.delete([points[3].id])
        assert points[3].id not in ids(await index.search_lexical(query, tenant, limit=50))
    finally:
        await index.close()


async def test_stores_without_lexical_vectors_are_refused_with_what_to_do(tmp_path: Path) -> None:
    """A Qdrant Edge store of manifest format 1 and a server collection without the lexical sparse
    vectors (both made before hybrid's lexical leg moved into the store) are refused, naming
    ``engram reindex``, instead of failing on the first write."""
    old = tmp_path / "edge"
    old.mkdir()
    (old / "manifest.json").write_text(
        json.dumps(
            {"format": 1, "dimension": DIM, "live": "live-000001", "generations": [], "next_number": 2}
        )
    )
    edge = QdrantEdgeIndex(old, DIM)
    with pytest.raises(ValueError, match="engram reindex"):
        await edge.count()

    client = AsyncQdrantClient(location=":memory:")
    await client.create_collection(
        "before", vectors_config=models.VectorParams(size=DIM, distance=models.Distance.COSINE)
    )
    with pytest.raises(ValueError, match="engram reindex"):
        await QdrantServerIndex(client, "before", DIM).ensure_collection()
    await client.close()
