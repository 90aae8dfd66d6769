"""RecallNotes: the candidate pool is vector top-K ∪ recency top-K ∪ lexical top-K, each K 50 by
default and 0 switching its half off, deduped by id, one seat, unexpired, the query's model only;
and the neighbours half (the notes written next to the best hits). The lexical half's ranking is
checked against an IDF computed here from the seat's own lexemes."""

from __future__ import annotations

import math

import grpc
import pytest

from agentlearn.common.v1 import embedding_pb2
from agentlearn.diary.v1 import diary_service_pb2 as pb
from agentlearn.diary.v1 import diary_service_pb2_grpc as pb_grpc
from libs.common.embeddings.openai_compat import OpenAICompatibleEmbedder
from tests.support.app import open_app
from tests.support.grpc_errors import error_info
from tests.support.scripted_openai import openai_provider

FACTS = [
    "Bob prefers weekly status digests over daily pings",
    "The staging database is rebuilt every Sunday night",
    "Ana wants pull requests to use semantic commit messages",
    "The security channel must be tagged before merging auth changes",
    "Carla is on vacation until the end of the month",
]


async def write(stub, content, *, seat="ana", tier=pb.NOTE_TIER_LONG, ttl=0, clock=None):  # type: ignore[no-untyped-def]
    if clock is not None:
        clock.advance(seconds=1)
    resp = await stub.WriteNote(
        pb.WriteNoteRequest(company="acme", seat=seat, content=content, tier=tier, ttl_days=ttl)
    )
    return resp.note


def recall(stub, query, seat="ana", **limits):  # type: ignore[no-untyped-def]
    # The neighbours half is off unless a test is about it: the others test their own halves.
    limits.setdefault("neighbour_limit", 0)
    return stub.RecallNotes(pb.RecallNotesRequest(company="acme", seat=seat, query=query, **limits))


def halves(candidate) -> set[int]:  # type: ignore[no-untyped-def]
    return set(candidate.found_by)


async def test_vector_half_finds_the_topical_note_and_says_how(diary, clock):
    _, stub = diary
    ids = {f: (await write(stub, f, clock=clock)).id for f in FACTS}
    resp = await recall(stub, "how often should I send Bob an update?", recency_limit=0, lexical_limit=0)
    assert resp.embedding_status == embedding_pb2.EMBEDDING_STATUS_EMBEDDED
    assert resp.vector_source == embedding_pb2.VECTOR_SOURCE_INDEX
    top = resp.candidates[0]
    assert top.note.id == ids[FACTS[0]]
    assert halves(top) == {pb.RECALL_HALF_VECTOR}
    sims = [c.similarity for c in resp.candidates]
    assert sims == sorted(sims, reverse=True)


async def test_the_vector_half_offers_only_notes_above_the_models_relevance_floor(diary, clock):
    """The vector half holds its top-K to the model's relevance floor (measured on the dev data): an
    ask unrelated to every note gets no vector hit at all (it used to get the K least-unlike notes),
    while the recency half still brings the newest notes whatever the topic."""
    _, stub = diary
    for f in FACTS:
        await write(stub, f, clock=clock)
    resp = await recall(stub, "quarterly tax filing for the EU subsidiary", lexical_limit=0)
    assert resp.relevance_floor == pytest.approx(0.42)
    assert [c for c in resp.candidates if pb.RECALL_HALF_VECTOR in c.found_by] == []
    assert len(resp.candidates) == len(FACTS)  # recency: every note, none found by meaning
    related = await recall(stub, "how often should I send Bob an update?", recency_limit=0, lexical_limit=0)
    assert related.candidates and all(c.similarity >= related.relevance_floor for c in related.candidates)


async def test_recency_half_returns_the_newest_notes_regardless_of_topic(diary, clock):
    _, stub = diary
    notes = [await write(stub, f"routine fact number {i}", clock=clock) for i in range(60)]
    resp = await recall(stub, "", vector_limit=0, lexical_limit=0)
    got = [c.note.id for c in resp.candidates]
    assert got == [n.id for n in reversed(notes)][:50]  # default K is 50, newest first
    resp = await recall(stub, "", vector_limit=0, lexical_limit=0, recency_limit=5)
    assert [c.note.id for c in resp.candidates] == [n.id for n in reversed(notes)][:5]


async def test_lexical_half_matches_words_the_vector_may_miss(diary, clock):
    _, stub = diary
    target = await write(stub, "Ticket POC-518 tracks the flaky kafka consumer", clock=clock)
    for f in FACTS:
        await write(stub, f, clock=clock)
    resp = await recall(stub, "what is POC-518 about?", vector_limit=0, recency_limit=0)
    assert [c.note.id for c in resp.candidates] == [target.id]
    assert halves(resp.candidates[0]) == {pb.RECALL_HALF_LEXICAL}
    assert resp.candidates[0].lexical_rank > 0


async def test_halves_are_unioned_and_deduped_by_id(diary, clock):
    _, stub = diary
    for f in FACTS:
        await write(stub, f, clock=clock)
    resp = await recall(stub, "Bob weekly digests")
    ids = [c.note.id for c in resp.candidates]
    assert len(ids) == len(set(ids)) == len(FACTS)
    bob = next(c for c in resp.candidates if "Bob" in c.note.content)
    assert halves(bob) == {pb.RECALL_HALF_VECTOR, pb.RECALL_HALF_RECENCY, pb.RECALL_HALF_LEXICAL}
    assert resp.candidates[0].note.id == bob.note.id


async def test_zero_switches_every_half_off(diary, clock):
    _, stub = diary
    await write(stub, FACTS[0], clock=clock)
    resp = await recall(stub, "Bob", vector_limit=0, recency_limit=0, lexical_limit=0)
    assert list(resp.candidates) == []
    assert resp.embedding_status == embedding_pb2.EMBEDDING_STATUS_SKIPPED


@pytest.mark.parametrize("field", ["vector_limit", "recency_limit", "lexical_limit", "neighbour_limit"])
@pytest.mark.parametrize("value", [-1, 501])
async def test_limits_out_of_range_are_refused(diary, field, value):
    _, stub = diary
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await recall(stub, "x", **{field: value})
    code, info, bad = error_info(exc.value)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert info.reason == "LIMIT_OUT_OF_RANGE"
    assert bad.field_violations[0].field == field


async def test_a_seat_never_sees_another_seats_notes_in_any_half(diary, clock):
    _, stub = diary
    for f in FACTS:
        await write(stub, f, seat="bob", clock=clock)
    await write(stub, "Ana keeps her own notes", seat="ana", clock=clock)
    resp = await recall(stub, "Bob weekly digests staging database", seat="ana")
    assert {c.note.seat for c in resp.candidates} == {"ana"}
    assert len(resp.candidates) == 1


async def test_an_expired_short_note_takes_no_slot_even_before_the_sweep(diary, clock):
    app, stub = diary
    short = await write(stub, "Sprint freeze runs through Friday", tier=pb.NOTE_TIER_SHORT, ttl=2, clock=clock)
    long = await write(stub, "Bob prefers weekly digests", clock=clock)
    resp = await recall(stub, "sprint freeze Friday")
    assert short.id in {c.note.id for c in resp.candidates}
    clock.advance(days=2, seconds=1)
    resp = await recall(stub, "sprint freeze Friday")
    assert [c.note.id for c in resp.candidates] == [long.id]
    # ...and the row is still there: the read's own predicate excluded it, not a sweep.
    assert await app.infra.pool.fetchval("SELECT count(*) FROM agent_diary") == 2
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await stub.GetNote(pb.GetNoteRequest(company="acme", seat="ana", note_id=short.id))
    assert exc.value.code() == grpc.StatusCode.NOT_FOUND


async def test_a_vector_of_another_model_is_never_a_match(
    make_settings, dsn, clock, local_embedder, scripted_openai, vector_index
):
    """Notes embedded by one model; the query embedded by another: the vector half finds nothing
    and says how many notes it could not reach."""
    async with open_app(
        make_settings(), dsn, names=["diary"], clock=clock, embedder=local_embedder, index=vector_index
    ) as app:
        stub = pb_grpc.DiaryServiceStub(app.channel)
        for f in FACTS:
            await write(stub, f, clock=clock)
    # Same database and index, another embedder of the same width.
    scripted_openai.dims = 384
    settings = make_settings(providers={"embeddings": openai_provider(scripted_openai, "other-model")})
    other = OpenAICompatibleEmbedder(settings.providers.embeddings)
    async with open_app(settings, dsn, names=["diary"], clock=clock, embedder=other, index=vector_index) as app:
        stub = pb_grpc.DiaryServiceStub(app.channel)
        resp = await recall(stub, "Bob weekly digests", recency_limit=0, lexical_limit=0)
        assert list(resp.candidates) == []
        assert resp.unreachable_by_vector_count == len(FACTS)
    await other.close()


async def test_a_provided_query_vector_is_used_without_embedding_again(diary, clock, local_embedder):
    _, stub = diary
    for f in FACTS:
        await write(stub, f, clock=clock)
    [vec] = await local_embedder.embed(["who is on vacation?"])
    resp = await recall(
        stub,
        "",
        recency_limit=0,
        lexical_limit=0,
        query_embedding=embedding_pb2.Embedding(values=vec.tolist(), model=vec.model, dimensions=vec.dimensions),
    )
    assert resp.embedding_status == embedding_pb2.EMBEDDING_STATUS_PROVIDED
    assert "vacation" in resp.candidates[0].note.content


async def test_an_unusable_provided_vector_is_refused(diary):
    _, stub = diary
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await recall(stub, "", query_embedding=embedding_pb2.Embedding(values=[0.0] * 384, model="m"))
    code, info, _ = error_info(exc.value)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and info.reason == "VECTOR_UNUSABLE"


async def test_an_unreachable_index_falls_back_to_an_exact_scan_and_says_so(diary, clock):
    app, stub = diary
    ids = {f: (await write(stub, f, clock=clock)).id for f in FACTS}
    indexed = await recall(stub, "who is away on vacation?", recency_limit=0, lexical_limit=0)
    await app.infra.index.close()  # the index goes away
    resp = await recall(stub, "who is away on vacation?", recency_limit=0, lexical_limit=0)
    assert resp.vector_source == embedding_pb2.VECTOR_SOURCE_EXACT_SCAN
    assert resp.candidates[0].note.id == ids[FACTS[4]]
    # The exact scan ranks exactly as the index did.
    assert [c.note.id for c in resp.candidates] == [c.note.id for c in indexed.candidates]
    for a, b in zip(resp.candidates, indexed.candidates, strict=True):
        assert a.similarity == pytest.approx(b.similarity, abs=1e-4)
    # Writes still succeed while the index is down: the row keeps its vector, unindexed.
    note = await write(stub, "Dan joins the platform team on Monday", clock=clock)
    assert note.embedding_model == "all-MiniLM-L6-v2"
    assert await app.infra.pool.fetchval("SELECT indexed FROM agent_diary WHERE id = $1::uuid", note.id) is False


async def test_a_note_written_while_the_index_was_down_is_found_by_an_exact_scan_until_indexed(
    make_settings, dsn, clock, local_embedder, vector_index
):
    """The index refuses a note's upsert, then is back without its point: until the index pass puts
    it in, the index's answer would miss the note, so the exact scan answers and says so."""
    from services.diary import passes
    from tests.support.app import open_app
    from tests.support.refusing_index import RefusingIndex

    index = RefusingIndex(vector_index)
    async with open_app(
        make_settings(), dsn, names=["diary"], clock=clock, embedder=local_embedder, index=index
    ) as app:
        stub = pb_grpc.DiaryServiceStub(app.channel)
        for f in FACTS[:4]:
            await write(stub, f, clock=clock)
        index.refusing = True
        down = await write(stub, FACTS[4], clock=clock)
        assert await app.infra.pool.fetchval("SELECT indexed FROM agent_diary WHERE id = $1::uuid", down.id) is False
        index.refusing = False  # back, without the note's point
        resp = await recall(stub, "who is away on vacation?", recency_limit=0, lexical_limit=0)
        assert resp.vector_source == embedding_pb2.VECTOR_SOURCE_EXACT_SCAN
        assert resp.candidates[0].note.id == down.id and halves(resp.candidates[0]) == {pb.RECALL_HALF_VECTOR}
        assert resp.unreachable_by_vector_count == 0  # it has a vector: the exact scan reaches it
        assert await passes.index_pending(app.components["diary"].service) == 1
        resp = await recall(stub, "who is away on vacation?", recency_limit=0, lexical_limit=0)
        assert resp.vector_source == embedding_pb2.VECTOR_SOURCE_INDEX
        assert resp.candidates[0].note.id == down.id


# ------------------------------------------------------------------------------------ neighbours


async def test_the_neighbours_half_brings_the_notes_written_next_to_the_best_hits(diary, clock):
    """A fact is stated and qualified over adjacent notes: the note written just after the best hit
    (no word of the query, nothing like it) comes with it, one on each side and no further; another
    seat's note written in between is never a neighbour, nor an expired one."""
    _, stub = diary
    for f in FACTS:
        await write(stub, f, clock=clock)
    before = await write(stub, "Planning notes for the quarter follow.", clock=clock)
    await write(stub, "Bob is the operator on this.", seat="bob", clock=clock)  # another seat, in between
    hit = await write(stub, "The Q3 revenue report goes to the board.", clock=clock)
    await write(stub, "Lunch is at noon.", tier=pb.NOTE_TIER_SHORT, ttl=1, clock=clock)  # expires below
    after = await write(stub, "It is due on the last Friday of October.", clock=clock)
    further = await write(stub, "Finance prepares the figures in advance.", clock=clock)
    clock.advance(days=1, seconds=1)
    query = "Q3 revenue report"
    off = await recall(stub, query, recency_limit=0)
    assert hit.id in {c.note.id for c in off.candidates}
    assert not {before.id, after.id} & {c.note.id for c in off.candidates}
    on = await recall(stub, query, recency_limit=0, neighbour_limit=1)
    found = {c.note.id: set(c.found_by) for c in on.candidates}
    assert found[before.id] == found[after.id] == {pb.RECALL_HALF_NEIGHBOUR}
    assert further.id not in found and {c.note.seat for c in on.candidates} == {"ana"}
    assert [c.note.id for c in on.candidates][-2:] in ([before.id, after.id], [after.id, before.id])  # last
    # The server's default (learning.diary.neighbour_limit) applies when the field is unset.
    default = await stub.RecallNotes(pb.RecallNotesRequest(company="acme", seat="ana", query=query, recency_limit=0))
    assert after.id in {c.note.id for c in default.candidates}


async def test_no_topical_hit_means_no_neighbours(diary, clock):
    _, stub = diary
    for f in FACTS:
        await write(stub, f, clock=clock)
    resp = await recall(stub, "quarterly tax filing for the EU subsidiary", recency_limit=0, neighbour_limit=5)
    assert list(resp.candidates) == []


# ------------------------------------------------------------------------------------ lexical ranking


async def test_the_lexical_half_ranks_by_idf_over_the_matched_notes_and_breaks_ties_newest_first(diary, clock):
    """The reference here: a note matches when it holds any of the query's lexemes; its rank is the
    sum over those lexemes of ln(1 + (N - df + 0.5) / (df + 0.5)), N the seat's matched notes, df
    those holding the lexeme; ties newest first; top K. The seat repeats texts (equal ranks) so that
    K cuts through a tie, which only the time order decides."""
    app, stub = diary
    texts = [
        "Bob prefers weekly status digests",
        "Bob reviews the staging database",
        "weekly digests go out on Monday",
        "the staging database is rebuilt on Sunday",
        "Carla owns the weekly digest pipeline",
        "nothing in common here",
    ]
    for i in range(24):
        await write(stub, texts[i % len(texts)], clock=clock)
        await write(stub, texts[i % len(texts)], seat="other", clock=clock)  # other seats change nothing
    pool = app.infra.pool
    for query, k in (("Bob weekly digests", 7), ("staging database on Sunday", 5), ("weekly Bob", 50)):
        lexemes = set(await pool.fetchval("SELECT tsvector_to_array(to_tsvector('english', $1))", query))
        rows = await pool.fetch(
            "SELECT id, create_time, tsvector_to_array(tsv) AS lx FROM agent_diary"
            " WHERE company = 'acme' AND seat = 'ana'"
        )
        matched = [(r["id"], r["create_time"], set(r["lx"]) & lexemes) for r in rows if set(r["lx"]) & lexemes]
        n = len(matched)
        df = {lx: sum(lx in m for _, _, m in matched) for lx in lexemes}
        idf = {lx: math.log(1 + (n - d + 0.5) / (d + 0.5)) for lx, d in df.items()}
        ranked = sorted(
            ((sum(idf[lx] for lx in sorted(m)), t, i) for i, t, m in matched),
            key=lambda x: (-round(x[0], 9), -x[1].timestamp()),
        )[:k]
        resp = await recall(stub, query, vector_limit=0, recency_limit=0, lexical_limit=k)
        assert [c.note.id for c in resp.candidates] == [str(i) for _, _, i in ranked]
        assert [c.lexical_rank for c in resp.candidates] == pytest.approx([r for r, _, _ in ranked], rel=1e-5)
        assert len({round(r, 6) for r, _, _ in ranked}) < len(ranked)  # the seat has ties to break


async def test_the_one_statement_reads_answer_exactly_as_the_separate_ones(diary, clock):
    """The store's merged reads (lexical + recency halves in one statement; the vector hits' re-read
    + the unreachable count in one) return what the separate statements return, each half's
    order included, with the seat, expiry and model rules of each."""
    import uuid

    from services.diary.store import PostgresNoteStore

    app, stub = diary
    store = PostgresNoteStore(app.infra.pool)
    ids = []
    for i in range(30):
        ids.append((await write(stub, f"{FACTS[i % len(FACTS)]} (take {i})", clock=clock)).id)
        await write(stub, FACTS[i % len(FACTS)], seat="other", clock=clock)
    short = await write(stub, "Bob's weekly digest moves to Friday", tier=pb.NOTE_TIER_SHORT, ttl=1, clock=clock)
    # A note without a vector: unreachable by any model.
    await app.infra.pool.execute(
        "UPDATE agent_diary SET embedding = NULL, embedding_model = NULL, embedding_dims = NULL WHERE id = $1",
        uuid.UUID(ids[3]),
    )
    # A note whose vector the index does not hold yet (and another seat's, which is not counted).
    await app.infra.pool.execute("UPDATE agent_diary SET indexed = false WHERE id = $1", uuid.UUID(ids[5]))
    await app.infra.pool.execute("UPDATE agent_diary SET indexed = false WHERE seat = 'other'")
    for advance in (0, 2):  # before and after the SHORT note expires
        clock.advance(days=advance)
        now = clock.now()
        for query, k_lex, k_rec in (("Bob weekly digests", 7, 5), ("staging database Sunday", 50, 50), ("zzz", 3, 4)):
            lexical, recent = await store.lexical_recent("acme", "ana", now, query, k_lex, k_rec)
            assert [(n.id, r) for n, r in lexical] == [
                (n.id, r) for n, r in await store.lexical("acme", "ana", now, query, k_lex)
            ]
            assert [n.id for n in recent] == [n.id for n in await store.recent("acme", "ana", now, k_rec)]
            assert len(recent) == min(k_rec, 31 if not advance else 30)  # the expired note takes no slot
            assert (uuid.UUID(short.id) in {n.id for n, _ in lexical}) == (query.startswith("Bob") and not advance)
        want = [uuid.UUID(i) for i in (ids[0], ids[3], short.id)] + [uuid.uuid4()]
        for model, dims in (("bogus-model", 384), (app.infra.embedder.model, 384), (app.infra.embedder.model, 7)):
            for asked in (want, []):
                notes, unreachable, unindexed = await store.hydrate_unreachable("acme", "ana", asked, now, model, dims)
                assert notes == await store.hydrate("acme", "ana", asked, now)
                assert unreachable == await store.unreachable_by_vector("acme", "ana", now, model, dims)
                assert unindexed == (1 if (model, dims) == (app.infra.embedder.model, 384) else 0)
        notes, unreachable, _ = await store.hydrate_unreachable("acme", "ana", want, now, app.infra.embedder.model, 384)
        assert set(notes) == {uuid.UUID(ids[0]), uuid.UUID(ids[3])} | (set() if advance else {uuid.UUID(short.id)})
        assert unreachable == 1  # the note without a vector; the other seat's are not counted
