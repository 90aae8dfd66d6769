"""WriteNote under concurrent writers (issue 14): the notes that wait together are inserted in one
statement and indexed in one call, and each writer still gets its own note, its own dedupe answer
and its own fault."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime

import asyncpg
import numpy as np
import pytest

from agentlearn.diary.v1 import diary_service_pb2 as pb
from agentlearn.diary.v1 import diary_service_pb2_grpc as pb_grpc
from libs.common.coalescer import Coalescer
from libs.common.db import connect_pool
from services.diary.domain import Note, NoteProvenance, NoteSource, NoteTier
from services.diary.store import PostgresNoteStore
from tests.support.app import open_app


@pytest.fixture
async def diary(make_settings, dsn, clock, local_embedder, vector_index):
    async with open_app(
        make_settings(), dsn, names=["diary"], clock=clock, embedder=local_embedder, index=vector_index
    ) as app:
        yield app, pb_grpc.DiaryServiceStub(app.channel)


def _note(seat: str, content: str, tier: NoteTier = NoteTier.LONG, expire: datetime | None = None) -> Note:
    return Note(
        id=uuid.uuid4(),
        company="acme",
        seat=seat,
        content=content,
        tier=tier,
        source=NoteSource.OPERATOR,
        turn_id=None,
        create_time=datetime(2026, 12, 1, tzinfo=UTC),
        expire_time=expire,
        embedding_model="m",
    )


async def test_concurrent_writers_each_get_their_note_stored_indexed_and_deduped(diary):
    app, stub = diary
    reqs = [
        pb.WriteNoteRequest(
            company="acme", seat=f"s{i % 3}", content=f"note number {i} about tea", tier=pb.NOTE_TIER_LONG
        )
        for i in range(24)
    ]
    # Four writers retry one key at once: one note is created, the other three get it back.
    keyed = pb.WriteNoteRequest(
        company="acme", seat="s0", content="the keyed note", tier=pb.NOTE_TIER_LONG, request_id="run-1:persist"
    )
    answers = await asyncio.gather(*(stub.WriteNote(r) for r in [*reqs, keyed, keyed, keyed, keyed]))
    plain, retries = answers[:24], answers[24:]
    assert [a.note.content for a in plain] == [r.content for r in reqs]
    assert all(a.created and a.note.embedding_dimensions == 384 for a in plain)
    assert sum(a.created for a in retries) == 1
    assert len({a.note.id for a in retries}) == 1
    rows = await app.infra.pool.fetch("SELECT id, seat, content, indexed, embedding IS NOT NULL AS v FROM agent_diary")
    assert len(rows) == 25
    assert all(r["indexed"] and r["v"] for r in rows)
    by_id = {str(r["id"]): r for r in rows}
    for req, a in zip(reqs, plain, strict=True):
        assert by_id[a.note.id]["seat"] == req.seat and by_id[a.note.id]["content"] == req.content


async def test_a_batch_with_a_bad_note_fails_that_note_alone(dsn):
    pool = await connect_pool(dsn, max_size=2)
    try:
        store = PostgresNoteStore(pool, insert_statements=1)
        vec = np.ones(4, dtype=np.float32) / 2
        good = [_note("a", f"ok {i}") for i in range(5)]
        # A LONG note with an expiry breaks the table's CHECK: its writer gets the error, no other.
        bad = _note("a", "bad", tier=NoteTier.LONG, expire=datetime(2027, 1, 1, tzinfo=UTC))
        dup = [_note("b", "first"), _note("b", "second")]
        results = await asyncio.gather(
            store.insert(good[0], vec),  # runs alone; the rest wait and go together
            *(store.insert(n, vec) for n in good[1:]),
            store.insert(bad, None),
            store.insert(dup[0], None, "key-1"),
            store.insert(dup[1], None, "key-1"),
            return_exceptions=True,
        )
        assert [r.content if isinstance(r, Note) else r for r in results[:5]] == [n.content for n in good]
        assert isinstance(results[5], asyncpg.CheckViolationError)
        assert isinstance(results[6], Note) and results[6].content == "first"
        assert results[7] is None  # the key was taken by the note before it
        assert await pool.fetchval("SELECT count(*) FROM agent_diary") == 6
        dims = await pool.fetch("SELECT embedding_dims FROM agent_diary WHERE seat = 'a'")
        assert {r["embedding_dims"] for r in dims} == {4}
    finally:
        await pool.close()


async def test_the_coalescer_answers_each_caller_and_survives_a_cancelled_one():
    seen: list[list[int]] = []
    gate = asyncio.Event()

    async def run(items: list[int]) -> list[int | Exception]:
        seen.append(items)
        await gate.wait()
        return [ValueError(i) if i == 3 else i * 10 for i in items]

    c: Coalescer[int, int] = Coalescer(run, max_batch=3)
    tasks = [asyncio.create_task(c.submit(i)) for i in range(6)]
    await asyncio.sleep(0)
    tasks[4].cancel()  # its caller goes away: the batch still runs its item, the others are answered
    gate.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert seen == [[0], [1, 2, 3], [4, 5]]
    assert results[:3] == [0, 10, 20]
    assert isinstance(results[3], ValueError)
    assert isinstance(results[4], asyncio.CancelledError)
    assert results[5] == 50


async def test_notes_that_wait_together_go_in_one_statement_with_their_vectors(dsn):
    pool = await connect_pool(dsn, max_size=2)
    try:
        store = PostgresNoteStore(pool, insert_statements=1)
        alone: list[uuid.UUID] = []
        one = store._insert_one

        async def counted(
            note: Note,
            vector: np.ndarray | None,
            request_id: str | None,
            provenance: NoteProvenance | None,
            request_digest: bytes | None,
        ) -> Note | None:
            alone.append(note.id)
            return await one(note, vector, request_id, provenance, request_digest)

        store._insert_one = counted  # type: ignore[method-assign]  # counts the single-row path
        notes = [_note("a", f"n {i}") for i in range(6)]
        vecs = [np.arange(4, dtype=np.float32) + i for i in range(6)]
        stored = await asyncio.gather(*(store.insert(n, v) for n, v in zip(notes, vecs, strict=True)))
        assert [s.id if s else None for s in stored] == [n.id for n in notes]
        assert alone == [notes[0].id]  # the first ran alone; the five that waited went in one statement
        rows = {r["id"]: r for r in await pool.fetch("SELECT id, embedding, embedding_dims FROM agent_diary")}
        for n, v in zip(notes, vecs, strict=True):
            assert rows[n.id]["embedding_dims"] == 4
            np.testing.assert_array_equal(rows[n.id]["embedding"].to_numpy(), v)
    finally:
        await pool.close()


def _kept(subjects: list[str], turn: str) -> NoteProvenance:
    return NoteProvenance(subjects, json.dumps({"turn_ids": [turn], "subjects": [{"handle": h} for h in subjects]}))


async def test_each_note_is_stored_with_its_own_provenance_alone_or_in_a_batch(dsn):
    pool = await connect_pool(dsn, max_size=2)
    try:
        store = PostgresNoteStore(pool, insert_statements=1)
        notes = [_note("a", f"n {i}") for i in range(6)]
        # Subjects of different lengths (none, one, three), one note without provenance, and a
        # second note under a taken key: the first runs alone, the rest wait and go together.
        kept = [
            _kept([], "t0"),
            _kept(["carla"], "t1"),
            None,
            _kept(["ana", "ben", "carla"], "t3"),
            _kept(["dave"], "t4"),
        ]
        dup = _note("a", "dup")
        stored = await asyncio.gather(
            *(store.insert(n, None, f"k{i}", k) for i, (n, k) in enumerate(zip(notes[:5], kept, strict=True))),
            store.insert(dup, None, "k1", _kept(["eve"], "t9")),
        )
        assert [s.id if s else None for s in stored] == [n.id for n in notes[:5]] + [None]
        rows = {
            r["note_id"]: r for r in await pool.fetch("SELECT note_id, seat, subjects, provenance FROM note_provenance")
        }
        assert set(rows) == {notes[i].id for i in (0, 1, 3, 4)}  # none for the note without, none for the dup
        for i in (0, 1, 3, 4):
            row = rows[notes[i].id]
            assert row["seat"] == "a" and list(row["subjects"]) == kept[i].subjects  # type: ignore[union-attr]
            assert json.loads(row["provenance"])["turn_ids"] == [f"t{i}"]
    finally:
        await pool.close()


async def test_a_note_whose_provenance_cannot_be_kept_is_not_stored_either(dsn):
    """The note and its provenance are one statement: a fault in the second leaves neither (it used
    to be a second commit, which a crash between the two skipped)."""
    pool = await connect_pool(dsn, max_size=2)
    try:
        store = PostgresNoteStore(pool, insert_statements=1)
        with pytest.raises(asyncpg.InvalidTextRepresentationError):
            await store.insert(_note("a", "lonely"), None, None, NoteProvenance(["carla"], "{not json"))
        assert await pool.fetchval("SELECT count(*) FROM agent_diary") == 0
    finally:
        await pool.close()


async def test_a_retried_write_keeps_the_provenance_an_earlier_server_did_not(diary):
    from agentlearn.common.v1 import erasure_pb2, provenance_pb2

    app, stub = diary
    prov = provenance_pb2.Provenance(turn_ids=["t1"], subjects=[erasure_pb2.ErasureSubject(handle="carla")])
    req = pb.WriteNoteRequest(
        company="acme", seat="ana", content="Carla wants CSV", tier=pb.NOTE_TIER_LONG, request_id="r1", provenance=prov
    )
    first = await stub.WriteNote(req)
    assert first.created
    kept = await app.infra.pool.fetchrow(
        "SELECT subjects FROM note_provenance WHERE note_id = $1", uuid.UUID(first.note.id)
    )
    assert list(kept["subjects"]) == ["carla"]
    # A note stored by a server that kept provenance in a second statement, killed between the two.
    await app.infra.pool.execute("DELETE FROM note_provenance")
    again = await stub.WriteNote(req)
    assert not again.created and again.note.id == first.note.id
    got = await stub.GetNoteProvenance(pb.GetNoteProvenanceRequest(company="acme", seat="ana", note_id=first.note.id))
    assert [s.handle for s in got.provenance.subjects] == ["carla"] and list(got.provenance.turn_ids) == ["t1"]
