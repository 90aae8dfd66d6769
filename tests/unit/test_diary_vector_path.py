"""The diary's use cases on fakes (unit tier): the write's embed and index bookkeeping, recall's
halves, the vector half's exact-scan fallback and re-read, the unreachable count, refusals.

No Postgres, no model, no gRPC: the store is ``MemoryNoteStore``, the index the exact-scan adapter
in memory, the embedder a deterministic hashing one. The integration tier (tests/test_diary_*.py)
runs the same use cases on the real parts.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import pytest

from libs.common.clock import ManualClock
from libs.common.config import DiaryConfig, RelevanceConfig
from libs.common.embeddings import EmbeddingUnavailable
from libs.common.errors import FailedPrecondition, InvalidArgument, NotFound
from libs.common.vector_path import EmbeddingStatus, VectorSource
from libs.common.vectorindex import collection_name
from libs.common.vectorindex.exact_scan import ExactScanIndex
from services.diary.domain import COLLECTION_BASE, NoteSource, NoteTier, QueryVector, Recall
from services.diary.service import DiaryService, index_point
from tests.unit.fakes.diary import MemoryNoteStore
from tests.unit.fakes.embedder import HashingEmbedder
from tests.unit.fakes.events import RecordedEvents

COLL = collection_name(COLLECTION_BASE, 64)


@dataclass
class Diary:
    service: DiaryService[MemoryNoteStore]
    store: MemoryNoteStore
    index: ExactScanIndex
    embedder: HashingEmbedder
    clock: ManualClock

    async def write(self, content: str, tier: NoteTier = NoteTier.LONG, ttl_days: int = 0, **kw: Any):
        note, skipped, _ = await self.service.write_note(
            kw.get("company", "acme"),
            kw.get("seat", "ana"),
            content,
            tier,
            ttl_days,
            NoteSource.OPERATOR,
            None,
            kw.get("request_id"),
        )
        self.clock.advance(seconds=1)  # distinct create times: recency and neighbours are ordered by them
        return note, skipped

    async def recall(self, query: str, **kw: Any) -> Recall:
        return await self.service.recall(
            kw.pop("company", "acme"),
            kw.pop("seat", "ana"),
            query,
            kw.pop("vector_limit", None),
            kw.pop("recency_limit", 0),
            kw.pop("lexical_limit", 0),
            kw.pop("query_vector", None),
            kw.pop("neighbour_limit", 0),
        )


def diary(
    embedder: HashingEmbedder | None = None, relevance: RelevanceConfig | None = None, no_embedder: bool = False
) -> Diary:
    store, index, clock = MemoryNoteStore(), ExactScanIndex(), ManualClock()
    emb = embedder or HashingEmbedder()
    service = DiaryService(
        store,
        None if no_embedder else emb,
        index,
        clock,
        DiaryConfig(),
        RecordedEvents(),
        relevance or RelevanceConfig(),
    )
    return Diary(service, store, index, emb, clock)


def ids(recall: Recall, half: str | None = None) -> list[uuid.UUID]:
    return [c.note.id for c in recall.candidates if half is None or half in c.found_by]


async def test_a_write_is_embedded_indexed_and_found_by_meaning():
    d = diary()
    note, skipped = await d.write("deploys go through the staging cluster first")
    other, _ = await d.write("lunch is at noon on fridays")
    assert skipped is None and note.embedding_model == "hash-64"
    assert d.store.indexed(note.id) and await d.index.count(COLL) == 2
    recall = await d.recall("staging cluster deploys", vector_limit=1)
    assert ids(recall, "vector") == [note.id] and other.id not in ids(recall)
    assert recall.embedding_status is EmbeddingStatus.EMBEDDED and recall.vector_source is VectorSource.INDEX
    assert recall.unreachable_by_vector == 0


async def test_index_down_at_write_keeps_the_vector_unindexed_and_recall_scans_exactly():
    d = diary()
    d.index.available = False
    note, skipped = await d.write("rotate the api keys every quarter")
    assert skipped is None  # embedded: only the index was down
    assert d.store.vector_of(note.id) is not None and not d.store.indexed(note.id)
    recall = await d.recall("api keys rotation")
    assert recall.vector_source is VectorSource.EXACT_SCAN and ids(recall, "vector") == [note.id]
    assert recall.unreachable_by_vector == 0  # it has a vector; only the index lacks its point
    d.index.available = True
    # Back, but without the note's point until the index pass: its answer would miss the note, so
    # the exact scan answers and says so.
    back = await d.recall("api keys rotation")
    assert back.vector_source is VectorSource.EXACT_SCAN and ids(back, "vector") == [note.id]
    assert back.unreachable_by_vector == 0
    # The index pass's step: the stored vector's point upserted and the note marked indexed.
    point = index_point(note.id, "acme", "ana", d.store.vector_of(note.id), "hash-64", None)
    assert await d.service.index_row(point, "note")
    caught_up = await d.recall("api keys rotation")
    assert caught_up.vector_source is VectorSource.INDEX and ids(caught_up, "vector") == [note.id]


async def test_exact_scan_ranks_as_the_index_does():
    d = diary()
    for text in ("alpha beta gamma", "alpha beta", "alpha", "delta epsilon"):
        await d.write(text)
    by_index = await d.recall("alpha beta gamma")
    d.index.available = False
    by_scan = await d.recall("alpha beta gamma")
    assert by_scan.vector_source is VectorSource.EXACT_SCAN
    assert [c.note.id for c in by_scan.candidates] == [c.note.id for c in by_index.candidates]
    assert [round(c.similarity, 5) for c in by_scan.candidates] == [round(c.similarity, 5) for c in by_index.candidates]


async def test_a_stale_point_of_a_deleted_note_is_never_returned():
    d = diary()
    kept, _ = await d.write("the backup runs at midnight")
    gone, _ = await d.write("the backup runs at midnight daily")
    d.index.available = False
    await d.service.delete("acme", "ana", str(gone.id))  # its point stays: the index is down
    d.index.available = True
    assert await d.index.count(COLL) == 2
    recall = await d.recall("backup midnight")
    assert recall.vector_source is VectorSource.INDEX and ids(recall, "vector") == [kept.id]


async def test_embedder_down_at_write_stores_the_note_and_counts_it_unreachable():
    d = diary()
    d.embedder.failure = EmbeddingUnavailable("503")
    note, skipped = await d.write("prefer small pull requests")
    assert skipped == "unavailable" and note.embedding_model is None and await d.index.count(COLL) == 0
    d.embedder.failure = None
    recall = await d.recall("small pull requests", recency_limit=5)
    assert recall.unreachable_by_vector == 1 and ids(recall, "vector") == [] and ids(recall, "recency") == [note.id]
    d.embedder.failure = EmbeddingUnavailable("503")
    failed = await d.recall("small pull requests", recency_limit=5)
    assert failed.embedding_status is EmbeddingStatus.FAILED and failed.vector_source is None
    assert ids(failed) == [note.id]  # the other halves still answer


async def test_without_an_embedder_writes_say_unconfigured_and_recall_is_lexical_and_recent():
    d = diary(no_embedder=True)
    note, skipped = await d.write("tickets need a component label")
    assert skipped == "unconfigured"
    recall = await d.recall("component label", lexical_limit=5)
    assert recall.embedding_status is EmbeddingStatus.UNCONFIGURED and ids(recall, "lexical") == [note.id]


async def test_a_provided_query_vector_is_used_and_a_blank_query_skips_the_vector_half():
    d = diary()
    note, _ = await d.write("invoices close on the fifth")
    [vec] = await d.embedder.embed(["invoices fifth"])
    assert vec is not None
    calls = d.embedder.calls
    provided = await d.recall("", query_vector=QueryVector(vec.values, vec.model))
    assert provided.embedding_status is EmbeddingStatus.PROVIDED and ids(provided, "vector") == [note.id]
    assert d.embedder.calls == calls  # nothing embedded
    blank = await d.recall("  ", recency_limit=5)
    assert blank.embedding_status is EmbeddingStatus.SKIPPED and blank.vector_source is None
    assert ids(blank) == [note.id]


async def test_the_relevance_floor_drops_unrelated_vector_hits():
    d = diary(relevance=RelevanceConfig(floors={"hash-64": 0.5}))
    related, _ = await d.write("the release train leaves on tuesdays")
    await d.write("parking permits renew in march")
    recall = await d.recall("release train tuesdays")
    assert recall.relevance_floor == 0.5 and ids(recall, "vector") == [related.id]
    assert all(c.similarity >= 0.5 for c in recall.candidates if "vector" in c.found_by)


async def test_halves_merge_vector_first_then_lexical_recency_and_neighbours():
    d = diary()
    first, _ = await d.write("kubernetes upgrades need a maintenance window")
    beside, _ = await d.write("coffee machine on floor three")
    lexical_only, _ = await d.write("window cleaning schedule")
    recent, _ = await d.write("team offsite in june")
    recall = await d.recall(
        "kubernetes upgrades maintenance window", vector_limit=1, lexical_limit=5, recency_limit=1, neighbour_limit=1
    )
    assert recall.candidates[0].note.id == first.id and "vector" in recall.candidates[0].found_by
    assert lexical_only.id in ids(recall, "lexical") and ids(recall, "recency") == [recent.id]
    assert beside.id in ids(recall, "neighbour")


async def test_an_expired_short_note_is_in_no_half():
    d = diary()
    short, _ = await d.write("the vpn is flaky today", NoteTier.SHORT, ttl_days=1)
    assert ids(await d.recall("vpn flaky", lexical_limit=5, recency_limit=5)) == [short.id]
    d.clock.advance(days=2)
    assert ids(await d.recall("vpn flaky", lexical_limit=5, recency_limit=5)) == []
    d.index.available = False
    assert ids(await d.recall("vpn flaky")) == []


async def test_a_repeated_request_id_returns_the_first_note_and_refuses_another_request():
    d = diary()
    first, _ = await d.write("one", request_id="r1")
    again, created = (
        await d.service.write_note("acme", "ana", "one", NoteTier.LONG, 0, NoteSource.OPERATOR, None, "r1")
    )[0::2]
    assert again.id == first.id and again.content == "one" and created is False
    # Another note under the key is not its retry: answering "one" would drop "two" unseen.
    with pytest.raises(FailedPrecondition) as err:
        await d.service.write_note("acme", "ana", "two", NoteTier.LONG, 0, NoteSource.OPERATOR, None, "r1")
    assert err.value.reason == "REQUEST_ID_REUSED" and err.value.violations[0].field == "request_id"


@pytest.mark.parametrize(
    ("content", "tier", "ttl", "reason", "field"),
    [
        ("x" * 2001, NoteTier.LONG, 0, "NOTE_TOO_LONG", "content"),
        ("ok", None, 0, "FIELD_REQUIRED", "tier"),
        ("ok", NoteTier.SHORT, 0, "TTL_OUT_OF_RANGE", "ttl_days"),
        ("ok", NoteTier.LONG, 3, "TTL_NOT_ALLOWED", "ttl_days"),
    ],
)
async def test_write_refusals_name_the_reason_and_field(content, tier, ttl, reason, field):
    d = diary()
    with pytest.raises(InvalidArgument) as err:
        await d.service.write_note("acme", "ana", content, tier, ttl, NoteSource.OPERATOR, None)
    assert err.value.reason == reason and err.value.violations[0].field == field
    assert d.store.rows == {}


async def test_recall_limit_over_the_cap_is_refused_and_a_missing_note_is_not_found():
    d = diary()
    with pytest.raises(InvalidArgument) as err:
        await d.recall("x", vector_limit=501)
    assert err.value.violations[0].field == "vector_limit"
    with pytest.raises(NotFound):
        await d.service.delete("acme", "ana", str(uuid.uuid4()))


async def test_seats_do_not_see_each_other():
    d = diary()
    await d.write("shared words here", seat="bob")
    recall = await d.recall("shared words here", lexical_limit=5, recency_limit=5)
    assert ids(recall) == [] and recall.unreachable_by_vector == 0
