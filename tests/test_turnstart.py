"""The rich turn start runs the embedding model once: the ask's vector is shared by the memory and
episode searches and handed to the knowledge search (SearchPages' ``query_embedding``), whose vector
half ranks by it rather than embed its keyword query again. A vector of another model is not
comparable with the pages' and the query is embedded as before. Real services over gRPC."""

from __future__ import annotations

import pytest

from agentlearn.common.v1 import embedding_pb2
from agentlearn.knowledge.v1 import knowledge_service_pb2 as kn_pb
from agentlearn.prefetch.v1 import prefetch_service_pb2 as pb
from services.prefetch.store import RunKey
from tests.test_prefetch_support import block, counting_env

ASK = "Can you send Bob the weekly billing export digest?"


@pytest.fixture
async def env(make_settings, dsn, clock, local_embedder, edge_index):
    async with counting_env(make_settings, dsn, clock, local_embedder, edge_index) as e:
        yield e


async def test_a_rich_turn_start_embeds_the_ask_alone_and_still_finds_the_page(env):
    await env.note("Bob prefers weekly digests of the billing export, sent on Mondays.")
    await env.page("eng", "Billing export runbook", "How to run the weekly billing export and send the digest.")
    env.embedder.texts.clear()
    resp = await env.build(ASK)
    assert env.embedder.texts == [ASK]  # one model run: the knowledge query is not embedded
    knowledge = block(resp, pb.BLOCK_RELEVANT_KNOWLEDGE)
    assert "Billing export runbook" in knowledge.markdown and knowledge.selection_count == 1


def _reader() -> kn_pb.Reader:
    return kn_pb.Reader(company="acme", seat="ana", role="swe")


async def test_search_pages_ranks_by_a_given_vector_of_its_model_and_embeds_the_query_otherwise(env):
    await env.page("eng", "Holiday rota", "Who is on call over the holidays.")
    [vec] = await env.embedder.embed(["who covers on-call during the holidays"])
    env.embedder.texts.clear()
    given = embedding_pb2.Embedding(values=vec.tolist(), model=vec.model, dimensions=vec.dimensions)
    # A query sharing no word with the page: only the vector half can find it.
    found = await env.knowledge.SearchPages(
        kn_pb.SearchPagesRequest(reader=_reader(), query="zzqx", query_embedding=given)
    )
    assert [h.title for h in found.hits] == ["Holiday rota"] and env.embedder.texts == []

    other = embedding_pb2.Embedding(values=vec.tolist(), model="another-model", dimensions=vec.dimensions)
    missed = await env.knowledge.SearchPages(
        kn_pb.SearchPagesRequest(reader=_reader(), query="zzqx", query_embedding=other)
    )
    assert env.embedder.texts == ["zzqx"]  # not of the pages' model: the query is embedded itself
    assert "Holiday rota" not in [h.title for h in missed.hits]


# ------------------------------------------------------------------------------------ claim + marker


async def _claim_reads_the_marker_with_it(store) -> None:  # type: ignore[no-untyped-def]
    from datetime import UTC, datetime

    t0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
    assert await store.claim_context_reading_marker(RunKey("acme", "agent-1", "run-1"), t0) == (True, None)
    await store.mark_onboarded("acme", "agent-1", "hash-1", ["platform"], t0)
    # A second caller of the same run does not build, and still reads the marker.
    assert await store.claim_context_reading_marker(RunKey("acme", "agent-1", "run-1"), t0) == (False, "hash-1")
    assert await store.claim_context_reading_marker(RunKey("acme", "agent-1", "run-2"), t0) == (True, "hash-1")
    assert await store.claim_context_reading_marker(RunKey("acme", "agent-2", "run-1"), t0) == (True, None)
    assert not await store.claim_context(RunKey("acme", "agent-1", "run-2"), t0)  # the claim is the same claim


async def test_the_fake_store_claims_and_reads_the_marker_in_one_call() -> None:
    from tests.unit.fakes.prefetch import FakePrefetchStore

    await _claim_reads_the_marker_with_it(FakePrefetchStore())


async def test_the_postgres_store_claims_and_reads_the_marker_in_one_statement(dsn: str) -> None:
    from libs.common.db import connect_pool
    from services.prefetch.store import PostgresPrefetchStore

    pool = await connect_pool(dsn)
    try:
        await _claim_reads_the_marker_with_it(PostgresPrefetchStore(pool))
    finally:
        await pool.close()


# ------------------------------------------------------------------------- what a turn start waits for


async def test_a_turn_starts_own_writes_commit_without_waiting_for_the_wal_flush(env, spans):
    """The run's claim, the note uses, the skill offers and the frozen context are each written in
    a transaction whose BEGIN set ``synchronous_commit = off`` (``db.unflushed``): the disk's flush
    is off the turn's path (docs/architecture.md, "What a turn start waits for")."""
    from libs.common import db

    await env.note("Bob prefers weekly digests of the billing export, sent on Mondays.")
    await env.skill("billing-digest", "Send the weekly billing export digest to Bob", tools=["billing_export"])
    db.configure_sql_spans("all")
    spans.clear()
    resp = await env.build(ASK)
    assert block(resp, pb.BLOCK_PERSONAL_MEMORY).selection_count == 1
    sql = sorted((s for s in spans.get_finished_spans() if s.name.startswith("db ")), key=lambda s: s.start_time)
    writes = [s for s in sql if s.attributes["db.operation.name"] in ("INSERT", "UPDATE", "DELETE")]
    assert {s.name for s in writes} >= {
        "db insert turn_contexts",  # the claim
        "db update agent_diary",  # the note's use
        "db update turn_contexts",  # the frozen context
    }, [s.name for s in writes]

    for write in writes:
        # Its neighbours among the statements of the same parent span: the BEGIN right before it and
        # the COMMIT right after it.
        mine = [s for s in sql if s.parent == write.parent]
        i = mine.index(write)
        before, after = (mine[i - 1] if i else None), (mine[i + 1] if i + 1 < len(mine) else None)
        assert before is not None and before.name == "db begin", write.name
        assert "synchronous_commit = off" in before.attributes["db.query.text"], write.name
        assert after is not None and after.name == "db commit", write.name
