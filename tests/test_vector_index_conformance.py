"""One suite, every adapter of the vector-index port: Qdrant's embedded engine, qdrant-client local
mode (the same client code that talks to a Qdrant server), and the exact scan (the unit tier's
index, and what the stores' Postgres fallback computes)."""

from __future__ import annotations

import uuid
from pathlib import Path

import numpy as np
import pytest

from libs.common.vectorindex import IndexPoint, IndexUnavailable, VectorIndex, collection_name
from libs.common.vectorindex.exact_scan import ExactScanIndex

COLL = collection_name("conformance", 8)


@pytest.fixture(params=["edge", "local", "exact"])
async def vector_index(request: pytest.FixtureRequest, tmp_path: Path):
    """This suite's adapters: conftest's two Qdrant ones, and the exact scan."""
    if request.param == "edge":
        from libs.common.vectorindex.qdrant_edge_index import QdrantEdgeIndex

        index: VectorIndex = QdrantEdgeIndex(tmp_path / "edge")
    elif request.param == "local":
        from libs.common.vectorindex.qdrant_client_index import QdrantClientIndex

        index = QdrantClientIndex.local()
    else:
        index = ExactScanIndex()
    yield index
    try:
        await index.close()
    except Exception:
        pass


def vec(*xs: float) -> np.ndarray:
    v = np.zeros(8, dtype=np.float32)
    v[: len(xs)] = xs
    return v / np.linalg.norm(v)


def point(v, company="acme", seat="ana", model="m", expire_at=1e12, **labels):  # type: ignore[no-untyped-def]
    return IndexPoint(uuid.uuid4(), v, company, seat, model, expire_at, labels)


async def search(index, v, **kw):  # type: ignore[no-untyped-def]
    args = {"company": "acme", "seat": "ana", "model": "m", "now": 1000.0, "limit": 10, **kw}
    return await index.search(COLL, v, **args)


async def test_nearest_first_with_cosine_scores(vector_index):
    a, b, c = point(vec(1, 0)), point(vec(1, 1)), point(vec(0, 1))
    await vector_index.upsert(COLL, [a, b, c])
    hits = await search(vector_index, vec(1, 0.1))
    assert [h.id for h in hits] == [a.id, b.id, c.id]
    assert hits[0].score == pytest.approx(float(vec(1, 0) @ vec(1, 0.1)), abs=1e-4)


async def test_filters_company_seat_model_expiry_and_labels(vector_index):
    mine = point(vec(1, 0), kind="raw")
    others = [
        point(vec(1, 0), company="other"),
        point(vec(1, 0), seat="bob"),
        point(vec(1, 0), model="m2"),
        point(vec(1, 0), expire_at=999.0),  # expired at now=1000
        point(vec(1, 0), kind="compacted"),
    ]
    await vector_index.upsert(COLL, [mine, *others])
    hits = await search(vector_index, vec(1, 0), labels={"kind": "raw"})
    assert [h.id for h in hits] == [mine.id]
    unexpired = await search(vector_index, vec(1, 0), now=998.0, labels={"kind": "raw"})
    assert len(unexpired) == 1  # the expired one lacks the label; expiry alone tested below
    soon = point(vec(1, 0), expire_at=1500.0)
    await vector_index.upsert(COLL, [soon])
    assert soon.id in {h.id for h in await search(vector_index, vec(1, 0), now=1400.0)}
    assert soon.id not in {h.id for h in await search(vector_index, vec(1, 0), now=1500.0)}


async def test_limit_upsert_replaces_and_delete_removes(vector_index):
    pts = [point(vec(1, i / 10)) for i in range(5)]
    await vector_index.upsert(COLL, pts)
    assert len(await search(vector_index, vec(1, 0), limit=3)) == 3
    moved = IndexPoint(pts[0].id, vec(0, 1), "acme", "ana", "m")
    await vector_index.upsert(COLL, [moved])
    assert await vector_index.count(COLL) == 5
    assert (await search(vector_index, vec(0, 1), limit=1))[0].id == pts[0].id
    await vector_index.delete(COLL, [pts[1].id, pts[2].id])
    assert await vector_index.count(COLL) == 3
    assert {h.id for h in await search(vector_index, vec(1, 0))} == {pts[0].id, pts[3].id, pts[4].id}


async def test_unknown_collection_reads_empty_and_reset_empties(vector_index):
    assert await search(vector_index, vec(1)) == []
    assert await vector_index.count(COLL) == 0
    await vector_index.delete(COLL, [uuid.uuid4()])
    await vector_index.upsert(COLL, [point(vec(1))])
    await vector_index.reset(COLL)
    assert await vector_index.count(COLL) == 0 and await search(vector_index, vec(1)) == []


async def test_prepare_opens_an_empty_collection_and_never_empties_one(vector_index):
    assert COLL not in await vector_index.collections()
    await vector_index.prepare(COLL, 8)
    assert COLL in await vector_index.collections()
    assert await vector_index.count(COLL) == 0 and await search(vector_index, vec(1)) == []
    p = point(vec(1, 0))
    await vector_index.upsert(COLL, [p])
    await vector_index.prepare(COLL, 8)  # a second start: opens what is there, keeps its points
    assert [h.id for h in await search(vector_index, vec(1, 0))] == [p.id]


async def test_prepare_on_a_closed_index_reports_unavailable(vector_index):
    await vector_index.close()
    with pytest.raises(IndexUnavailable):
        await vector_index.prepare(COLL, 8)


async def test_a_closed_index_reports_unavailable(vector_index):
    await vector_index.upsert(COLL, [point(vec(1))])
    await vector_index.close()
    with pytest.raises(IndexUnavailable):
        await search(vector_index, vec(1))


async def test_edge_shards_persist_across_reopen(tmp_path):
    from libs.common.vectorindex.qdrant_edge_index import QdrantEdgeIndex

    first = QdrantEdgeIndex(tmp_path / "e")
    p = point(vec(1, 2))
    await first.upsert(COLL, [p])
    await first.close()
    again = QdrantEdgeIndex(tmp_path / "e")
    assert [h.id for h in await search(again, vec(1, 2))] == [p.id]
    await again.close()
    # Opened at start (a restarted server) rather than on first use: the same points.
    started = QdrantEdgeIndex(tmp_path / "e")
    await started.prepare(COLL, 8)
    assert await started.count(COLL) == 1
    assert [h.id for h in await search(started, vec(1, 2))] == [p.id]
    await started.close()


async def test_client_local_mode_persists_under_a_path(tmp_path):
    from libs.common.vectorindex.qdrant_client_index import QdrantClientIndex

    first = QdrantClientIndex.local(tmp_path / "q")
    p = point(vec(2, 1))
    await first.upsert(COLL, [p])
    await first.close()
    again = QdrantClientIndex.local(tmp_path / "q")
    assert [h.id for h in await search(again, vec(2, 1))] == [p.id]
    await again.close()


async def test_collections_and_point_ids_page_through_every_point(vector_index):
    """The orphan sweep's reads (issue 17): every collection, and every point id a page at a time."""
    assert COLL not in await vector_index.collections()
    points = [point(vec(1, i / 10)) for i in range(7)]
    await vector_index.upsert(COLL, points)
    assert COLL in await vector_index.collections()
    seen: list[uuid.UUID] = []
    after = None
    while page := await vector_index.point_ids(COLL, after, 3):
        assert len(page) <= 3
        seen += page
        after = page[-1]
    assert sorted(seen) == sorted(p.id for p in points) and len(seen) == len(set(seen))
    assert await vector_index.point_ids(collection_name("absent", 8), None, 3) == []


async def test_exact_scan_taken_down_reports_unavailable_and_comes_back():
    """The unit tier's outage: a down exact-scan index refuses every call as an unreachable server
    does, and answers again once it is back."""
    index = ExactScanIndex()
    p = point(vec(1))
    await index.upsert(COLL, [p])
    index.available = False
    for call in (search(index, vec(1)), index.upsert(COLL, [point(vec(1))]), index.count(COLL)):
        with pytest.raises(IndexUnavailable):
            await call
    index.available = True
    assert [h.id for h in await search(index, vec(1))] == [p.id]
