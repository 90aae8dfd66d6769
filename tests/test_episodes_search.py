"""SearchEpisodes: the seat's raw rows by similarity (the query's model only) unioned with a lexical
half; a compacted row is never a hit; an unreachable index falls back to an exact per-seat scan
and says so; the index can be rebuilt from Postgres without one embedding call."""

from __future__ import annotations

from datetime import timedelta

import grpc
import pytest

from agentlearn.common.v1 import embedding_pb2
from agentlearn.episodes.v1 import episode_service_pb2 as pb
from agentlearn.episodes.v1 import episode_service_pb2_grpc as pb_grpc
from libs.common.embeddings.openai_compat import OpenAICompatibleEmbedder
from libs.common.vectorindex import collection_name
from services.episodes import passes
from tests.support.app import open_app
from tests.support.grpc_errors import error_info
from tests.support.rebuild import rebuilt_index
from tests.support.scripted_openai import openai_provider
from tests.support.turns import raw_episode

TURNS = [
    ("Message from Ana: Slack message", "Rotate the staging database credentials", "Rotated them in the vault"),
    ("Message from Bob: Slack message", "Why is the nightly build red?", "Fixed a flaky kafka consumer test"),
    ("swe was assigned scheduled work weekly-report", "", "Sent the weekly status report to the team"),
    ("Message from Carla: Jira ticket", "Ticket POC-518: the billing export times out", "Added an index"),
    ("Message from Dan: email", "Plan the offsite dinner for the platform team", "Booked a restaurant"),
]


class Turns:
    def __init__(self, stub, clock):  # type: ignore[no-untyped-def]
        self.stub, self.clock, self.n = stub, clock, 0

    async def add(  # type: ignore[no-untyped-def]
        self, label, ask="", what="", *, seat="ana", outcome=pb.TURN_OUTCOME_DONE, days_ago=0.0, tools=("t",)
    ):
        self.n += 1
        self.clock.advance(seconds=1)
        end = self.clock.now() - timedelta(days=days_ago)
        resp = await self.stub.RecordEpisode(raw_episode(seat, f"run-{self.n}", end, label, ask, what, tools, outcome))
        return resp.episode

    async def all(self, seat="ana"):  # type: ignore[no-untyped-def]
        return {t[0]: await self.add(*t, seat=seat) for t in TURNS}


def search(stub, query, seat="ana", **kw):  # type: ignore[no-untyped-def]
    return stub.SearchEpisodes(pb.SearchEpisodesRequest(company="acme", seat=seat, query=query, **kw))


@pytest.fixture
async def episodes(make_settings, dsn, clock, local_embedder, vector_index):
    settings = make_settings(learning={"episode_lifecycle": {"max_raw_episodes_per_agent": 5}})
    async with open_app(
        settings, dsn, names=["episodes"], clock=clock, embedder=local_embedder, index=vector_index
    ) as app:
        stub = pb_grpc.EpisodeServiceStub(app.channel)
        turns = Turns(stub, clock)
        turns.dsn, turns.embedder, turns.index = dsn, local_embedder, vector_index
        yield app, stub, turns


async def test_similarity_finds_the_topical_turn_and_says_how(episodes):
    _, stub, turns = episodes
    rows = await turns.all()
    resp = await search(stub, "why is the nightly build failing", lexical_limit=0)
    assert resp.embedding_status == embedding_pb2.EMBEDDING_STATUS_EMBEDDED
    assert resp.vector_source == embedding_pb2.VECTOR_SOURCE_INDEX
    assert resp.hits[0].episode.id == rows[TURNS[1][0]].id
    assert list(resp.hits[0].found_by) == [pb.SEARCH_HALF_VECTOR]
    # Only the related turn: the other four are below the model's relevance floor (they used to be
    # returned as the "most similar" of five whatever they were about).
    assert len(resp.hits) == 1 and resp.hits[0].similarity >= resp.relevance_floor == pytest.approx(0.42)
    assert resp.unreachable_by_vector_count == 0


async def test_an_ask_like_nothing_the_seat_did_finds_nothing(episodes, make_settings):
    """The relevance floor (measured per model on the dev data): a query unrelated to every turn is
    answered with no hit at all, by either half — a name in common is not relatedness."""
    _, stub, turns = episodes
    await turns.all()
    for query in ("Ana: what should we bring to the team picnic on Saturday?", "quarterly tax filing for the EU"):
        resp = await search(stub, query)
        assert list(resp.hits) == [], query
    # With the floor switched off for the model, the top-K are returned whatever they are about.
    off = make_settings(learning={"relevance": {"floors": {"all-MiniLM-L6-v2": 0}}})
    async with open_app(
        off, turns.dsn, names=["episodes"], clock=turns.clock, embedder=turns.embedder, index=turns.index
    ) as app:
        resp = await search(pb_grpc.EpisodeServiceStub(app.channel), "quarterly tax filing for the EU", lexical_limit=0)
        assert len(resp.hits) == 5 and resp.relevance_floor == 0


async def test_the_ask_and_the_account_are_part_of_the_vector_not_only_the_label(episodes):
    """Three turns share one label: only the ask and account tell them apart."""
    _, stub, turns = episodes
    a = await turns.add("Message from Ana: Slack message", "Can you renew the TLS certificate?", "Renewed it")
    await turns.add("Message from Ana: Slack message", "Order pizza for Friday", "Ordered")
    await turns.add("Message from Ana: Slack message", "", "Answered a question about holidays")
    resp = await search(stub, "certificate expiry", lexical_limit=0)
    assert resp.hits[0].episode.id == a.id


async def test_default_limit_and_the_lexical_half(episodes):
    _, stub, turns = episodes
    for i in range(12):
        await turns.add(f"Routine ping {i}", f"Please restart the staging deploy (request {i})", "Restarted it")
    target = await turns.add("Message from Carla: Jira ticket", "What is POC-518 about?", "Explained it")
    resp = await search(stub, "restart the staging deploy", lexical_limit=0)
    assert len(resp.hits) == 10  # learning.episodes.search_limit
    resp = await search(stub, "POC-518", limit=1)
    lexical = [h for h in resp.hits if pb.SEARCH_HALF_LEXICAL in h.found_by]
    assert [h.episode.id for h in lexical] == [target.id] and lexical[0].lexical_rank > 0
    resp = await search(stub, "POC-518", limit=1, lexical_limit=0)
    assert len(resp.hits) == 1 and list(resp.hits[0].found_by) == [pb.SEARCH_HALF_VECTOR]


async def test_outcome_filter_applies_to_both_halves(episodes):
    _, stub, turns = episodes
    ok = await turns.add("Deploy request", "Deploy service billing", "Deployed", outcome=pb.TURN_OUTCOME_DONE)
    bad = await turns.add("Deploy request", "Deploy service billing again", "Rollback", outcome=pb.TURN_OUTCOME_FAILED)
    resp = await search(stub, "deploy billing", outcome_filter=pb.TURN_OUTCOME_FAILED)
    assert {h.episode.id for h in resp.hits} == {bad.id}
    assert set(resp.hits[0].found_by) == {pb.SEARCH_HALF_VECTOR, pb.SEARCH_HALF_LEXICAL}
    resp = await search(stub, "deploy billing")
    assert {h.episode.id for h in resp.hits} == {ok.id, bad.id}


async def test_a_seat_never_finds_another_seats_turns(episodes):
    _, stub, turns = episodes
    await turns.all(seat="bob")
    mine = await turns.add("Message from Ana: Slack message", "Rotate the staging credentials", "Done")
    resp = await search(stub, "rotate staging database credentials vault")
    assert [h.episode.id for h in resp.hits] == [mine.id]


async def test_a_compacted_row_is_never_embedded_nor_a_hit(episodes, clock):
    app, stub, turns = episodes
    for i in range(6):
        await turns.add(f"Recent ping {i}", "", "ok", tools=(f"recent{i}",))
    folded = [
        await turns.add("Rotate credentials", f"Rotate the {env} database credentials", "Rotated", days_ago=40)
        for env in ("staging", "qa", "dev")
    ]
    report = await app.passes()["episode-lifecycle"].run()
    assert report.clusters_compacted == 1
    compacted = await app.infra.pool.fetchrow("SELECT * FROM episodes WHERE kind = 'compacted'")
    assert compacted["embedding"] is None and compacted["embedding_model"] is None and not compacted["indexed"]
    assert compacted["label"] == "Rotate credentials"
    resp = await search(stub, "Rotate credentials database", limit=100)
    ids = {h.episode.id for h in resp.hits}
    assert str(compacted["id"]) not in ids and {h.episode.kind for h in resp.hits} == {pb.EPISODE_KIND_RAW}
    assert len(ids & {f.id for f in folded}) == 2  # the exemplars stay searchable
    # Nor through the exact scan, nor after a rebuild of the index from Postgres.
    await app.components["episodes"].rebuild_index()
    assert await app.infra.index.count(collection_name("episodes", 384)) == 6 + 2
    await app.infra.index.close()
    resp = await search(stub, "Rotate credentials database", limit=100)
    assert resp.vector_source == embedding_pb2.VECTOR_SOURCE_EXACT_SCAN
    assert str(compacted["id"]) not in {h.episode.id for h in resp.hits}


async def test_an_unreachable_index_falls_back_to_an_exact_scan_and_says_so(episodes):
    app, stub, turns = episodes
    await turns.all()
    indexed = await search(stub, "billing export is slow", lexical_limit=0)
    await app.infra.index.close()
    resp = await search(stub, "billing export is slow", lexical_limit=0)
    assert resp.vector_source == embedding_pb2.VECTOR_SOURCE_EXACT_SCAN
    assert [h.episode.id for h in resp.hits] == [h.episode.id for h in indexed.hits]
    for a, b in zip(resp.hits, indexed.hits, strict=True):
        assert a.similarity == pytest.approx(b.similarity, abs=1e-4)
    # Recording still works with the index down: the row keeps its vector, unindexed.
    ep = await turns.add("Message from Eve: email", "Reset my password", "Reset it")
    assert ep.embedding_model == "all-MiniLM-L6-v2"
    assert await app.infra.pool.fetchval("SELECT indexed FROM episodes WHERE id = $1::uuid", ep.id) is False


async def test_a_row_recorded_while_the_index_was_down_is_found_by_an_exact_scan_until_indexed(
    make_settings, dsn, clock, local_embedder, vector_index
):
    """The index refuses a row's upsert, then is back without its point: until the index pass puts
    it in, the index's answer would miss the row, so the exact scan answers and says so."""
    from tests.support.refusing_index import RefusingIndex

    index = RefusingIndex(vector_index)
    async with open_app(
        make_settings(), dsn, names=["episodes"], clock=clock, embedder=local_embedder, index=index
    ) as app:
        stub = pb_grpc.EpisodeServiceStub(app.channel)
        turns = Turns(stub, clock)
        for t in TURNS[:3] + TURNS[4:]:
            await turns.add(*t)
        index.refusing = True
        down = await turns.add(*TURNS[3])
        assert await app.infra.pool.fetchval("SELECT indexed FROM episodes WHERE id = $1::uuid", down.id) is False
        index.refusing = False  # back, without the row's point
        resp = await search(stub, "billing export is slow", lexical_limit=0)
        assert resp.vector_source == embedding_pb2.VECTOR_SOURCE_EXACT_SCAN
        assert resp.hits[0].episode.id == down.id
        assert resp.unreachable_by_vector_count == 0  # it has a vector: the exact scan reaches it
        assert await passes.index_pending(app.components["episodes"].service) == 1
        resp = await search(stub, "billing export is slow", lexical_limit=0)
        assert resp.vector_source == embedding_pb2.VECTOR_SOURCE_INDEX
        assert resp.hits[0].episode.id == down.id


async def test_a_provided_query_vector_is_used_as_is(episodes, local_embedder):
    _, stub, turns = episodes
    rows = await turns.all()
    [vec] = await local_embedder.embed(["dinner plans for the team"])
    resp = await search(
        stub,
        "",
        lexical_limit=0,
        query_embedding=embedding_pb2.Embedding(values=vec.tolist(), model=vec.model, dimensions=vec.dimensions),
    )
    assert resp.embedding_status == embedding_pb2.EMBEDDING_STATUS_PROVIDED
    assert resp.hits[0].episode.id == rows[TURNS[4][0]].id


@pytest.mark.parametrize(
    ("kwargs", "field", "reason"),
    [
        ({"limit": -1}, "limit", "LIMIT_OUT_OF_RANGE"),
        ({"limit": 101}, "limit", "LIMIT_OUT_OF_RANGE"),
        ({"lexical_limit": -1}, "lexical_limit", "LIMIT_OUT_OF_RANGE"),
        ({"lexical_limit": 101}, "lexical_limit", "LIMIT_OUT_OF_RANGE"),
        ({"query": " "}, "query", "FIELD_REQUIRED"),
        ({"outcome_filter": 9}, "outcome_filter", "FIELD_INVALID"),
        ({"seat": ""}, "seat", "FIELD_REQUIRED"),
        ({"query_embedding": embedding_pb2.Embedding(values=[0.0] * 8, model="m")}, "query_embedding.values", None),
        ({"query_embedding": embedding_pb2.Embedding(values=[1.0] * 8)}, "query_embedding.model", "FIELD_REQUIRED"),
    ],
)
async def test_bad_searches_are_invalid_argument_naming_the_field(episodes, kwargs, field, reason):
    _, stub, _ = episodes
    req = {"company": "acme", "seat": "ana", "query": "x", **kwargs}
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await stub.SearchEpisodes(pb.SearchEpisodesRequest(**req))
    code, info, bad = error_info(exc.value)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and info.domain == "episodes.agentlearn.dev"
    assert info.reason == (reason or "VECTOR_UNUSABLE")
    assert bad.field_violations[0].field == field


async def test_a_vector_of_another_model_is_never_a_match(
    make_settings, dsn, clock, local_embedder, scripted_openai, vector_index
):
    async with open_app(
        make_settings(), dsn, names=["episodes"], clock=clock, embedder=local_embedder, index=vector_index
    ) as app:
        await Turns(pb_grpc.EpisodeServiceStub(app.channel), clock).all()
    scripted_openai.dims = 384
    settings = make_settings(providers={"embeddings": openai_provider(scripted_openai, "other")})
    other = OpenAICompatibleEmbedder(settings.providers.embeddings)
    async with open_app(settings, dsn, names=["episodes"], clock=clock, embedder=other, index=vector_index) as app:
        resp = await search(pb_grpc.EpisodeServiceStub(app.channel), "nightly build", lexical_limit=0)
        assert list(resp.hits) == [] and resp.unreachable_by_vector_count == len(TURNS)
    await other.close()


async def test_rebuild_restores_every_raw_vector_without_one_embedding_call(
    make_settings, dsn, clock, scripted_openai, tmp_path
):
    async def record_all(app):  # type: ignore[no-untyped-def]
        stub = pb_grpc.EpisodeServiceStub(app.channel)
        await Turns(stub, clock).all()
        return await search(stub, TURNS[3][1], lexical_limit=0)

    settings = make_settings(providers={"embeddings": openai_provider(scripted_openai, "scripted-embed")})
    async with rebuilt_index(settings, dsn, clock, scripted_openai, tmp_path, "episodes", record_all) as rebuilt:
        app, second, restored, before = rebuilt
        assert restored == len(TURNS)
        assert await second.count(collection_name("episodes", 64)) == len(TURNS)
        after = await search(pb_grpc.EpisodeServiceStub(app.channel), TURNS[3][1], lexical_limit=0)
        assert after.vector_source == embedding_pb2.VECTOR_SOURCE_INDEX
        assert [h.episode.id for h in after.hits] == [h.episode.id for h in before.hits]


async def test_rows_written_while_the_index_was_down_are_indexed_by_the_fill_pass(
    make_settings, dsn, clock, local_embedder, tmp_path
):
    from libs.common.vectorindex.qdrant_edge_index import QdrantEdgeIndex

    down = QdrantEdgeIndex(tmp_path / "idx")
    async with open_app(
        make_settings(), dsn, names=["episodes"], clock=clock, embedder=local_embedder, index=down
    ) as app:
        await down.close()
        turns = Turns(pb_grpc.EpisodeServiceStub(app.channel), clock)
        pending = [await turns.add(f"while down {i}", f"question {i}", "answered") for i in range(3)]
    back = QdrantEdgeIndex(tmp_path / "idx")
    async with open_app(
        make_settings(), dsn, names=["episodes"], clock=clock, embedder=local_embedder, index=back
    ) as app:
        result = await app.passes()["episode-fill"].run()
        assert result["indexed"] == 3 and result["fill"].requests == 0  # nothing to embed, only to index
        assert await passes.index_pending(app.components["episodes"].service) == 0
        resp = await search(pb_grpc.EpisodeServiceStub(app.channel), "while down", lexical_limit=0)
        assert resp.vector_source == embedding_pb2.VECTOR_SOURCE_INDEX
        assert {h.episode.id for h in resp.hits} == {p.id for p in pending}
    await back.close()


# The three statements a search ran after its index search before they were one (main 6abc384):
# the oracle the one statement is held to.
_SEPARATE = {
    "hydrate": "SELECT id FROM episodes WHERE company = $1 AND seat = $2 AND kind = 'raw' AND id = ANY($3)",
    "lexical": """
        WITH q AS (
            SELECT string_agg(quote_literal(lexeme), ' | ')::tsquery AS tsq
            FROM unnest(tsvector_to_array(to_tsvector('english', $4))) AS lexeme)
        SELECT e.id, ts_rank(e.tsv, q.tsq, 1) AS rank,
               CASE WHEN $6::vector IS NOT NULL AND e.embedding IS NOT NULL AND e.embedding_model = $7
                         AND e.embedding_dims = $8
                    THEN 1 - (e.embedding <=> $6::vector) END AS similarity
        FROM episodes e, q
        WHERE e.company = $1 AND e.seat = $2 AND e.kind = 'raw' AND ($5::text IS NULL OR e.outcome = $5)
          AND e.tsv @@ q.tsq
        ORDER BY rank DESC, e.end_time DESC, e.id DESC LIMIT $3""",
    "unreachable": """
        SELECT count(*) FROM episodes
        WHERE company = $1 AND seat = $2 AND kind = 'raw'
          AND (embedding IS NULL OR embedding_model IS DISTINCT FROM $3 OR embedding_dims IS DISTINCT FROM $4)
          AND ($5::text IS NULL OR outcome = $5)""",
}


async def test_the_one_statement_reads_answer_exactly_as_the_separate_ones(episodes, local_embedder):
    """The store's read after the index search (the hits' re-read, the lexical half, the unreachable
    count in one statement) returns what the three statements it replaced returned, the lexical
    half's order included, with the seat, kind, outcome and model rules of each."""
    import uuid

    import numpy as np

    from services.episodes.domain import TurnOutcome
    from services.episodes.ports import RawRows
    from services.episodes.store import PostgresEpisodeStore

    app, _, turns = episodes
    rows = await turns.all()
    theirs = await turns.all(seat="bob")
    failed = await turns.add(
        "Message from Ana: Slack message", "Rotate the staging keys", outcome=pb.TURN_OUTCOME_FAILED
    )
    no_vector = await turns.add("Message from Ana: email", "Rotate the database password again")
    pool = app.infra.pool
    await pool.execute(
        "UPDATE episodes SET embedding = NULL, embedding_model = NULL, embedding_dims = NULL WHERE id = $1::uuid",
        no_vector.id,
    )
    # Rows whose vectors the index does not hold yet: one of each outcome of this seat, and the
    # other seat's (not counted).
    await pool.execute(
        "UPDATE episodes SET indexed = false WHERE id = ANY($1::uuid[])", [failed.id, rows[TURNS[0][0]].id]
    )
    await pool.execute("UPDATE episodes SET indexed = false WHERE seat = 'bob'")
    store = PostgresEpisodeStore(pool)
    [vec] = await local_embedder.embed(["rotate the staging database credentials"])
    want = [uuid.UUID(e.id) for e in (*rows.values(), failed, no_vector, *theirs.values())] + [uuid.uuid4()]
    for outcome in (None, TurnOutcome.DONE, TurnOutcome.FAILED):
        raw = RawRows("acme", "ana", outcome)
        o = str(outcome) if outcome else None
        for model, values in ((vec.model, vec.values), ("bogus-model", vec.values), (vec.model, np.ones(7))):
            dims = int(values.shape[0])
            for ids, query, k in ((want, "rotate database credentials", 3), ([], "staging nightly", 50), (want, "", 0)):
                got = await store.search_reads(raw, values, model, ids, query, k)
                hydrated = await pool.fetch(_SEPARATE["hydrate"], "acme", "ana", ids)
                lexical = await pool.fetch(
                    _SEPARATE["lexical"], "acme", "ana", k, query, o, values.astype(np.float32), model, dims
                )
                unreachable = await pool.fetchval(_SEPARATE["unreachable"], "acme", "ana", model, dims, o)
                assert set(got.hits) == {r["id"] for r in hydrated} and all(e.id == i for i, e in got.hits.items())
                assert [(e.id, r, s) for e, r, s in got.lexical] == [
                    (
                        r["id"],
                        pytest.approx(r["rank"]),
                        None if r["similarity"] is None else pytest.approx(r["similarity"]),
                    )
                    for r in lexical
                ]
                assert got.unreachable == unreachable
                comparable = (model, dims) == (vec.model, vec.values.shape[0])
                assert got.unindexed == (0 if not comparable else 2 if outcome is None else 1)
    mine = await store.search_reads(RawRows("acme", "ana"), vec.values, vec.model, want, "x", 5)
    assert set(mine.hits) == {uuid.UUID(e.id) for e in (*rows.values(), failed, no_vector)}
    assert mine.unreachable == 1  # the row without a vector; the other seat's are not counted
