"""The episodes' use cases on fakes (unit tier): record (embed, index bookkeeping, idempotence,
collapse by work key, refusals) and search (the vector half with its exact-scan fallback and
re-read, the outcome filter, the relevance floor on both halves, the unreachable count).

No Postgres, no model, no gRPC: ``MemoryEpisodeStore``, the exact-scan index in memory, the hashing
embedder. The integration tier (tests/test_episodes_*.py) runs the same use cases on the real parts.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

import pytest

from libs.common.clock import ManualClock
from libs.common.config import EpisodesConfig, RelevanceConfig
from libs.common.embeddings import EmbeddingRateLimited
from libs.common.errors import InvalidArgument
from libs.common.vector_path import EmbeddingStatus, VectorSource
from libs.common.vectorindex import collection_name
from libs.common.vectorindex.exact_scan import ExactScanIndex
from services.episodes.domain import COLLECTION_BASE, QueryVector, Search, TurnOutcome
from services.episodes.service import EpisodeService, Recorded, TurnRecord, index_point
from tests.unit.fakes.embedder import HashingEmbedder
from tests.unit.fakes.episodes import MemoryEpisodeStore
from tests.unit.fakes.events import RecordedEvents

COLL = collection_name(COLLECTION_BASE, 64)


@dataclass
class Episodes:
    service: EpisodeService[MemoryEpisodeStore]
    store: MemoryEpisodeStore
    index: ExactScanIndex
    embedder: HashingEmbedder
    clock: ManualClock
    events: RecordedEvents

    async def record(self, label: str, outcome: TurnOutcome = TurnOutcome.DONE, **kw: Any) -> Recorded:
        start = self.clock.now()
        self.clock.advance(minutes=1)
        rec = TurnRecord(
            "acme",
            kw.pop("seat", "ana"),
            kw.pop("turn_id", f"run-{uuid.uuid4().hex[:8]}"),
            outcome,
            start,
            start + timedelta(seconds=30),
            label=label,
            **kw,
        )
        return await self.service.record(rec)

    async def search(self, query: str, **kw: Any) -> Search:
        return await self.service.search(
            "acme",
            kw.pop("seat", "ana"),
            query,
            kw.pop("limit", 0),
            kw.pop("lexical_limit", None),
            kw.pop("outcome", None),
            kw.pop("query_vector", None),
        )


def episodes(relevance: RelevanceConfig | None = None) -> Episodes:
    store, index, emb, clock, events = (
        MemoryEpisodeStore(),
        ExactScanIndex(),
        HashingEmbedder(),
        ManualClock(),
        RecordedEvents(),
    )
    service = EpisodeService(store, emb, index, clock, EpisodesConfig(), events, relevance or RelevanceConfig())
    return Episodes(service, store, index, emb, clock, events)


def hit_ids(search: Search, half: str | None = None) -> list[uuid.UUID]:
    return [h.episode.id for h in search.hits if half is None or half in h.found_by]


async def test_record_embeds_indexes_and_emits_and_a_repeat_is_the_same_row():
    e = episodes()
    first = await e.record("triage the flaky login test", turn_id="run-1")
    assert first.created and first.skipped is None and e.store.indexed(first.episode.id)
    assert await e.index.count(COLL) == 1
    [event] = e.events.of("episode_written")
    assert event["episode_id"] == str(first.episode.id) and event["embedding_model"] == "hash-64"
    again = await e.record("triage the flaky login test", turn_id="run-1")
    assert not again.created and again.episode.id == first.episode.id and len(e.events.of("episode_written")) == 1


async def test_a_redelivery_of_the_same_work_is_collapsed_into_the_first_row():
    e = episodes()
    first = await e.record("nightly report", turn_id="run-1", work_key="report:2026-01-01")
    second = await e.record("nightly report", turn_id="run-2", work_key="report:2026-01-01")
    assert second.collapsed and not second.created and second.episode.id == first.episode.id
    found = await e.service.get("acme", "ana", "", "run-2")
    assert found.id == first.episode.id and len(e.store.rows) == 1


async def test_the_settled_record_of_a_self_iterate_round_supersedes_its_row():
    """The same run id, then another run of the same work: the round's row is settled in place (its
    id and first run id kept, the settled account, tools and vector taken), announced once more;
    later records change nothing."""
    for settled_run in ("run-1", "run-2"):
        e = episodes()
        rounds = {"work_key": "ci:42", "role": "swe"}
        mid = await e.record(
            "fix the flaky CI step",
            TurnOutcome.SELF_ITERATE,
            turn_id="run-1",
            **rounds,
            tools_called=("ci.logs",) * 6,
            what_it_did="read the logs",
        )
        settled = await e.record(
            "fix the flaky CI step",
            TurnOutcome.DONE,
            turn_id=settled_run,
            work_key="ci:42",
            tools_called=("ci.edit", "ci.run"),
            what_it_did="pinned the runner image",
        )
        ep = settled.episode
        assert (settled.created, settled.collapsed, ep.id, ep.turn_id) == (True, False, mid.episode.id, "run-1")
        assert ep.outcome is TurnOutcome.DONE and ep.tools_called == ("ci.edit", "ci.run") and ep.role == "swe"
        assert ep.start_time == mid.episode.start_time and len(e.store.rows) == 1 and e.store.indexed(ep.id)
        assert (await e.service.get("acme", "ana", "", settled_run)).id == ep.id
        [hit] = (await e.search(ep.text, outcome=TurnOutcome.DONE, lexical_limit=0)).hits
        assert hit.episode.id == ep.id and hit.similarity > 0.99
        assert [w["outcome"] for w in e.events.of("episode_written")] == ["self_iterate", "done"]
        for late in (TurnOutcome.SELF_ITERATE, TurnOutcome.FAILED):
            again = await e.record("fix the flaky CI step", late, turn_id="run-1", work_key="ci:42")
            assert not again.created and again.episode == ep


async def test_a_settled_record_without_a_vector_drops_the_rounds_point():
    e = episodes()
    mid = await e.record("rotate the signing certificate", TurnOutcome.SELF_ITERATE, turn_id="run-1")
    assert await e.index.count(COLL) == 1
    e.embedder.failure = EmbeddingRateLimited("429")
    settled = await e.record("rotate the signing certificate", turn_id="run-1", what_it_did="rotated it")
    assert (settled.created, settled.skipped, settled.episode.id) == (True, "rate_limited", mid.episode.id)
    assert settled.episode.embedding_model is None and not e.store.indexed(mid.episode.id)
    assert await e.index.count(COLL) == 0


async def test_index_down_at_record_keeps_the_vector_and_search_scans_exactly():
    e = episodes()
    e.index.available = False
    rec = await e.record("migrate the billing database")
    assert rec.created and rec.skipped is None and not e.store.indexed(rec.episode.id)
    search = await e.search("billing database migration")
    assert search.vector_source is VectorSource.EXACT_SCAN and hit_ids(search, "vector") == [rec.episode.id]
    assert search.unreachable_by_vector == 0
    e.index.available = True
    # Back, but without the row's point until the index pass: its answer would miss the row, so
    # the exact scan answers and says so.
    back = await e.search("billing database migration")
    assert back.vector_source is VectorSource.EXACT_SCAN and hit_ids(back, "vector") == [rec.episode.id]
    assert back.unreachable_by_vector == 0
    # The index pass's step: the stored vector's point upserted and the row marked indexed.
    vector = e.store.rows[rec.episode.id].vector
    assert vector is not None
    point = index_point(rec.episode.id, "acme", "ana", "done", vector, "hash-64")
    assert await e.service.index_row(point, "episode")
    caught_up = await e.search("billing database migration")
    assert caught_up.vector_source is VectorSource.INDEX and hit_ids(caught_up, "vector") == [rec.episode.id]


async def test_embedder_down_at_record_counts_the_row_unreachable_and_lexical_still_finds_it():
    e = episodes()
    e.embedder.failure = EmbeddingRateLimited("429")
    rec = await e.record("rotate the signing certificate")
    assert rec.skipped == "rate_limited" and rec.episode.embedding_model is None
    assert e.events.of("episode_written")[0]["embedding_skipped_reason"] == "rate_limited"
    e.embedder.failure = None
    search = await e.search("signing certificate")
    assert search.embedding_status is EmbeddingStatus.EMBEDDED and search.unreachable_by_vector == 1
    assert hit_ids(search, "vector") == [] and hit_ids(search, "lexical") == [rec.episode.id]
    e.embedder.failure = EmbeddingRateLimited("429")
    failed = await e.search("signing certificate")
    assert failed.embedding_status is EmbeddingStatus.FAILED and failed.vector_source is None
    assert hit_ids(failed) == [rec.episode.id]


async def test_a_row_gone_from_the_store_is_not_a_hit_though_its_point_remains():
    e = episodes()
    kept = await e.record("upgrade the kafka brokers")
    gone = await e.record("upgrade the kafka brokers again")
    e.store.delete(gone.episode.id)
    assert await e.index.count(COLL) == 2
    search = await e.search("kafka brokers upgrade")
    assert search.vector_source is VectorSource.INDEX and hit_ids(search) == [kept.episode.id]


async def test_the_outcome_filter_holds_in_the_index_the_exact_scan_and_the_count():
    e = episodes()
    done = await e.record("deploy the web tier", TurnOutcome.DONE)
    failed = await e.record("deploy the web tier", TurnOutcome.FAILED)
    e.embedder.failure = EmbeddingRateLimited("429")
    await e.record("deploy the web tier", TurnOutcome.FAILED)  # no vector
    e.embedder.failure = None
    by_index = await e.search("deploy web tier", outcome=TurnOutcome.DONE)
    assert hit_ids(by_index, "vector") == [done.episode.id] and by_index.unreachable_by_vector == 0
    e.index.available = False
    by_scan = await e.search("deploy web tier", outcome=TurnOutcome.FAILED)
    assert by_scan.vector_source is VectorSource.EXACT_SCAN and hit_ids(by_scan, "vector") == [failed.episode.id]
    assert by_scan.unreachable_by_vector == 1


async def test_the_floor_drops_unrelated_vector_hits_and_unrelated_lexical_hits_with_a_vector():
    e = episodes(RelevanceConfig(floors={"hash-64": 0.6}))
    related = await e.record("renew the tls certificate for the api gateway")
    unrelated = await e.record("order pizza for the api team offsite lunch friday")
    search = await e.search("renew tls certificate api gateway")
    assert search.relevance_floor == 0.6
    assert hit_ids(search) == [related.episode.id] and unrelated.episode.id not in hit_ids(search)
    assert all(h.similarity >= 0.6 for h in search.hits)


async def test_a_provided_vector_embeds_nothing():
    e = episodes()
    rec = await e.record("compact the audit log")
    [vec] = await e.embedder.embed(["audit log"])
    assert vec is not None
    calls = e.embedder.calls
    search = await e.search("", query_vector=QueryVector(vec.values, vec.model))
    assert search.embedding_status is EmbeddingStatus.PROVIDED and hit_ids(search, "vector") == [rec.episode.id]
    assert e.embedder.calls == calls


async def test_seats_are_apart():
    e = episodes()
    await e.record("shared words", seat="bob")
    search = await e.search("shared words")
    assert search.hits == [] and search.unreachable_by_vector == 0


@pytest.mark.parametrize(
    ("change", "reason", "field"),
    [
        ({"label": "fire run-9 of schedule", "turn_id": "run-9"}, "LABEL_NAMES_RUN_ID", "label"),
        ({"outcome": None}, "FIELD_REQUIRED", "outcome"),
        ({"end_time": "before"}, "END_BEFORE_START", "end_time"),
        ({"work_item": "trello:abc"}, "FIELD_INVALID", "work_item"),
        ({"tools_called": ("ok", " ")}, "FIELD_REQUIRED", "tools_called[1]"),
    ],
)
async def test_record_refusals_name_the_reason_and_field(change, reason, field):
    e = episodes()
    start = e.clock.now()
    rec = TurnRecord("acme", "ana", "run-1", TurnOutcome.DONE, start, start + timedelta(seconds=5), label="a label")
    if change.get("end_time") == "before":
        change = {"end_time": start - timedelta(seconds=1)}
    with pytest.raises(InvalidArgument) as err:
        await e.service.record(replace(rec, **change))
    assert err.value.reason == reason and err.value.violations[0].field == field
    assert e.store.rows == {} and e.embedder.calls == 0


async def test_search_refusals():
    e = episodes()
    with pytest.raises(InvalidArgument) as blank:
        await e.search("  ")
    assert blank.value.reason == "FIELD_REQUIRED" and blank.value.violations[0].field == "query"
    with pytest.raises(InvalidArgument) as big:
        await e.search("x", limit=10_000)
    assert big.value.reason == "LIMIT_OUT_OF_RANGE"
