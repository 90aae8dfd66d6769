"""Uses, reads, pages, deletes, the retention sweep and the index rebuild."""

from __future__ import annotations

import asyncio
import uuid

import grpc
import pytest

from agentlearn.diary.v1 import diary_service_pb2 as pb
from agentlearn.diary.v1 import diary_service_pb2_grpc as pb_grpc
from libs.common.vectorindex import collection_name
from services.diary import passes
from tests.support.app import open_app
from tests.support.grpc_errors import error_info
from tests.support.rebuild import rebuilt_index
from tests.support.scripted_openai import openai_provider


@pytest.fixture
async def diary(make_settings, dsn, clock, local_embedder, vector_index):
    async with open_app(
        make_settings(learning={"diary": {"long_cap_per_seat": 5}}),
        dsn,
        names=["diary"],
        clock=clock,
        embedder=local_embedder,
        index=vector_index,
    ) as app:
        yield app, pb_grpc.DiaryServiceStub(app.channel)


async def write(stub, content, *, seat="ana", tier=pb.NOTE_TIER_LONG, ttl=0, clock=None):  # type: ignore[no-untyped-def]
    if clock is not None:
        clock.advance(seconds=1)
    return (
        await stub.WriteNote(pb.WriteNoteRequest(company="acme", seat=seat, content=content, tier=tier, ttl_days=ttl))
    ).note


async def get(stub, note_id, seat="ana"):  # type: ignore[no-untyped-def]
    return (await stub.GetNote(pb.GetNoteRequest(company="acme", seat=seat, note_id=note_id))).note


async def get_or_none(stub, note_id, seat="ana"):  # type: ignore[no-untyped-def]
    try:
        return await get(stub, note_id, seat)
    except grpc.aio.AioRpcError as err:
        assert err.code() == grpc.StatusCode.NOT_FOUND
        return None


# ------------------------------------------------------------------------------------------ uses


async def test_mark_used_counts_a_use_and_stamps_it(diary, clock):
    _, stub = diary
    note = await write(stub, "Bob prefers digests", clock=clock)
    clock.advance(hours=1)
    resp = await stub.MarkNotesUsed(pb.MarkNotesUsedRequest(company="acme", seat="ana", note_ids=[note.id, note.id]))
    assert resp.marked_count == 1
    got = await get(stub, note.id)
    assert got.use_count == 1
    assert got.last_used_time.ToDatetime().replace(tzinfo=clock.now().tzinfo) == clock.now()


async def test_recall_alone_never_counts_a_use(diary, clock):
    _, stub = diary
    note = await write(stub, "Bob prefers digests", clock=clock)
    await stub.RecallNotes(pb.RecallNotesRequest(company="acme", seat="ana", query="Bob digests"))
    assert (await get(stub, note.id)).use_count == 0


async def test_mark_used_ignores_another_seats_notes(diary, clock):
    _, stub = diary
    theirs = await write(stub, "Bob's private fact", seat="bob", clock=clock)
    resp = await stub.MarkNotesUsed(pb.MarkNotesUsedRequest(company="acme", seat="ana", note_ids=[theirs.id]))
    assert resp.marked_count == 0
    assert (await get(stub, theirs.id, seat="bob")).use_count == 0


async def test_mark_used_refuses_a_malformed_id_naming_its_position(diary):
    _, stub = diary
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await stub.MarkNotesUsed(
            pb.MarkNotesUsedRequest(company="acme", seat="ana", note_ids=[str(uuid.uuid4()), "nope"])
        )
    code, _, bad = error_info(exc.value)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert bad.field_violations[0].field == "note_ids[1]"


async def test_a_use_is_recorded_even_when_the_caller_goes_away(diary, clock):
    """The write is detached from the caller: cancelling the call does not cancel the update."""
    app, _ = diary
    service = app.components["diary"].service
    note = await write(pb_grpc.DiaryServiceStub(app.channel), "Bob prefers digests", clock=clock)
    task = asyncio.create_task(service.mark_used("acme", "ana", [note.id]))
    await asyncio.sleep(0)  # let the call start its update
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    async with asyncio.timeout(5):
        while await app.infra.pool.fetchval("SELECT use_count FROM agent_diary WHERE id = $1::uuid", note.id) != 1:
            await asyncio.sleep(0.01)


# ----------------------------------------------------------------------------------- reads, pages


async def test_get_of_another_seats_note_is_not_found(diary, clock):
    _, stub = diary
    theirs = await write(stub, "Bob's private fact", seat="bob", clock=clock)
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await get(stub, theirs.id, seat="ana")
    code, info, _ = error_info(exc.value)
    assert code == grpc.StatusCode.NOT_FOUND and info.reason == "NOTE_NOT_FOUND"
    assert info.metadata["note_id"] == theirs.id


async def test_list_pages_newest_first_with_total_size(diary, clock):
    _, stub = diary
    notes = [await write(stub, f"fact {i}", clock=clock) for i in range(7)]
    await write(stub, "state", tier=pb.NOTE_TIER_SHORT, ttl=1, clock=clock)
    seen, token = [], ""
    while True:
        page = await stub.ListNotes(
            pb.ListNotesRequest(company="acme", seat="ana", page_size=3, page_token=token, tier=pb.NOTE_TIER_LONG)
        )
        assert page.total_size == 7
        seen += [n.id for n in page.notes]
        token = page.next_page_token
        if not token:
            break
    assert seen == [n.id for n in reversed(notes)]
    everything = await stub.ListNotes(pb.ListNotesRequest(company="acme", seat="ana"))
    assert everything.total_size == 8 and everything.next_page_token == ""


async def test_page_tokens_are_checked(diary, clock):
    _, stub = diary
    for i in range(3):
        await write(stub, f"fact {i}", clock=clock)
    page = await stub.ListNotes(pb.ListNotesRequest(company="acme", seat="ana", page_size=1))
    for bad_request in (
        pb.ListNotesRequest(company="acme", seat="ana", page_token="garbage"),
        pb.ListNotesRequest(company="acme", seat="bob", page_token=page.next_page_token),  # other filters
        pb.ListNotesRequest(company="acme", seat="ana", page_size=-1),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await stub.ListNotes(bad_request)
        code, info, bad = error_info(exc.value)
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert info.reason in {"PAGE_TOKEN_INVALID", "PAGE_SIZE_INVALID"}
        assert bad.field_violations[0].field in {"page_token", "page_size"}


async def test_delete_removes_the_row_and_its_vector(diary, clock):
    app, stub = diary
    note = await write(stub, "Bob prefers digests", clock=clock)
    keep = await write(stub, "Ana likes tea", clock=clock)
    coll = collection_name("diary_notes", 384)
    assert await app.infra.index.count(coll) == 2
    await stub.DeleteNote(pb.DeleteNoteRequest(company="acme", seat="ana", note_id=note.id))
    assert await app.infra.index.count(coll) == 1
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await get(stub, note.id)
    assert exc.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await stub.DeleteNote(pb.DeleteNoteRequest(company="acme", seat="ana", note_id=note.id))
    assert exc.value.code() == grpc.StatusCode.NOT_FOUND
    assert (await get(stub, keep.id)).content == "Ana likes tea"


async def test_an_expired_short_note_not_swept_yet_is_not_found_to_delete_and_still_goes(diary, clock):
    """Past its expiry a SHORT note is gone to every read before the sweep takes it: DeleteNote
    answers it as a note that does not exist (it answered OK, as if it had deleted a live note), and
    removes its row and point all the same."""
    app, stub = diary
    expired = await write(stub, "Sprint freeze through Friday", tier=pb.NOTE_TIER_SHORT, ttl=1, clock=clock)
    keep = await write(stub, "Sprint planning is on Mondays", clock=clock)
    coll = collection_name("diary_notes", 384)
    clock.advance(days=2)
    # Every read has it gone already.
    assert await get_or_none(stub, expired.id) is None
    listed = await stub.ListNotes(pb.ListNotesRequest(company="acme", seat="ana"))
    assert [n.id for n in listed.notes] == [keep.id] and listed.total_size == 1
    recalled = await stub.RecallNotes(pb.RecallNotesRequest(company="acme", seat="ana", query="Sprint freeze"))
    assert [c.note.id for c in recalled.candidates] == [keep.id]
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await stub.GetNoteProvenance(pb.GetNoteProvenanceRequest(company="acme", seat="ana", note_id=expired.id))
    code, info, _ = error_info(exc.value)
    assert (code, info.reason) == (grpc.StatusCode.NOT_FOUND, "NOTE_NOT_FOUND")
    # So is it to DeleteNote, answered as a note that never existed is ...
    answers = []
    for note_id in (expired.id, str(uuid.uuid4())):
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await stub.DeleteNote(pb.DeleteNoteRequest(company="acme", seat="ana", note_id=note_id))
        code, info, _ = error_info(exc.value)
        answers.append((code, info.reason, info.metadata["note_id"] == note_id, info.metadata["seat"]))
    assert answers[0] == answers[1] == (grpc.StatusCode.NOT_FOUND, "NOTE_NOT_FOUND", True, "ana")
    # ... and its row and its point are gone now, not at the next sweep; the live note stays.
    assert [str(r["id"]) for r in await app.infra.pool.fetch("SELECT id FROM agent_diary")] == [keep.id]
    assert await app.infra.index.count(coll) == 1
    assert (await passes.sweep(app.components["diary"].service)).expired_deleted == 0


# ------------------------------------------------------------------------------------------ sweep


async def test_sweep_deletes_expired_short_notes_and_their_vectors(diary, clock):
    app, stub = diary
    await write(stub, "Sprint freeze through Friday", tier=pb.NOTE_TIER_SHORT, ttl=1, clock=clock)
    alive = await write(stub, "On call this week", tier=pb.NOTE_TIER_SHORT, ttl=10, clock=clock)
    long = await write(stub, "Bob prefers digests", clock=clock)
    service = app.components["diary"].service
    clock.advance(days=2)
    report = await passes.sweep(service)
    assert report.expired_deleted == 1
    rows = {r["id"] for r in await app.infra.pool.fetch("SELECT id FROM agent_diary")}
    assert {str(i) for i in rows} == {alive.id, long.id}
    assert await app.infra.index.count(collection_name("diary_notes", 384)) == 2


async def test_sweep_evicts_least_used_then_least_recently_used_then_oldest(diary, clock):
    """Cap 5 (configured). Seven LONG notes: the two that go are the never-used oldest."""
    app, stub = diary
    service = app.components["diary"].service
    notes = [await write(stub, f"fact {i}", clock=clock) for i in range(7)]

    async def use(note, times):  # type: ignore[no-untyped-def]
        for _ in range(times):
            clock.advance(seconds=1)
            await stub.MarkNotesUsed(pb.MarkNotesUsedRequest(company="acme", seat="ana", note_ids=[note.id]))

    await use(notes[0], 3)  # oldest, but used most: survives
    await use(notes[1], 1)  # used once, long ago
    await use(notes[2], 1)  # used once, recently: beats notes[1]
    # notes[3..6] never used: the two oldest of them (3, 4) go first; then, with ties, ...
    report = await passes.sweep(service)
    assert report.evicted_over_cap == 2
    left = {str(r["id"]) for r in await app.infra.pool.fetch("SELECT id FROM agent_diary")}
    assert left == {notes[i].id for i in (0, 1, 2, 5, 6)}
    # Tighten: one more eviction takes the never-used oldest (5); then use beats recency.
    await write(stub, "fact 7", clock=clock)
    await passes.sweep(service)
    left = {str(r["id"]) for r in await app.infra.pool.fetch("SELECT id FROM agent_diary")}
    assert notes[5].id not in left and notes[1].id in left
    assert await app.infra.index.count(collection_name("diary_notes", 384)) == 5


async def test_a_note_evicted_over_the_cap_frees_its_key_a_deleted_one_keeps_it(diary, clock):
    """Evicted for disuse, a fact may be learned again (its key goes with it); deleted by someone,
    a retry of its write does not bring it back (the key stays)."""
    app, stub = diary
    service = app.components["diary"].service

    async def keyed(content: str, key: str) -> pb.WriteNoteResponse:
        clock.advance(seconds=1)
        request = pb.WriteNoteRequest(
            company="acme", seat="ana", content=content, tier=pb.NOTE_TIER_LONG, request_id=key
        )
        return await stub.WriteNote(request)

    evicted = (await keyed("fact 0", "k-0")).note  # the oldest, never used: the cap takes it
    deleted = (await keyed("fact 1", "k-1")).note
    for i in range(2, 7):
        await write(stub, f"fact {i}", clock=clock)
    await stub.DeleteNote(pb.DeleteNoteRequest(company="acme", seat="ana", note_id=deleted.id))
    report = await passes.sweep(service)
    assert report.evicted_over_cap == 1
    assert (await get_or_none(stub, evicted.id)) is None
    again = await keyed("fact 0", "k-0")
    assert again.created and again.note.id != evicted.id
    retried = await keyed("fact 1", "k-1")
    assert retried.note_removed and not retried.created


async def test_sweep_cap_ignores_short_notes_and_other_seats(diary, clock):
    app, stub = diary
    service = app.components["diary"].service
    for i in range(5):
        await write(stub, f"fact {i}", clock=clock)
        await write(stub, f"bob fact {i}", seat="bob", clock=clock)
    for i in range(3):
        await write(stub, f"state {i}", tier=pb.NOTE_TIER_SHORT, ttl=5, clock=clock)
    report = await passes.sweep(service)
    assert report.evicted_over_cap == 0 and report.expired_deleted == 0


# -------------------------------------------------------------------------------------- rebuild


async def test_rebuild_index_restores_every_vector_without_one_embedding_call(
    make_settings, dsn, clock, scripted_openai, tmp_path
):
    recall = pb.RecallNotesRequest(company="acme", seat="ana", query="fact number 3", recency_limit=0, lexical_limit=0)

    async def write_twelve(app):  # type: ignore[no-untyped-def]
        stub = pb_grpc.DiaryServiceStub(app.channel)
        ids = [(await write(stub, f"fact number {i}", clock=clock)).id for i in range(12)]
        return ids, await stub.RecallNotes(recall)

    settings = make_settings(providers={"embeddings": openai_provider(scripted_openai, "scripted-embed")})
    async with rebuilt_index(settings, dsn, clock, scripted_openai, tmp_path, "diary", write_twelve) as rebuilt:
        app, second, restored, (ids, before) = rebuilt
        assert restored == 12
        assert await second.count(collection_name("diary_notes", 64)) == 12
        after = await pb_grpc.DiaryServiceStub(app.channel).RecallNotes(recall)
        assert after.vector_source == before.vector_source
        assert [c.note.id for c in after.candidates] == [c.note.id for c in before.candidates]
        assert set(ids) == {c.note.id for c in after.candidates}


async def test_notes_written_while_the_index_was_down_are_indexed_by_the_fill_pass(
    make_settings, dsn, clock, local_embedder, tmp_path
):
    from libs.common.vectorindex.qdrant_edge_index import QdrantEdgeIndex

    settings = make_settings()
    down = QdrantEdgeIndex(tmp_path / "idx")
    async with open_app(settings, dsn, names=["diary"], clock=clock, embedder=local_embedder, index=down) as app:
        await down.close()  # the index is unreachable while these are written
        stub = pb_grpc.DiaryServiceStub(app.channel)
        pending = [await write(stub, f"while down {i}", clock=clock) for i in range(3)]
    back = QdrantEdgeIndex(tmp_path / "idx")  # the index is back (same data directory)
    async with open_app(settings, dsn, names=["diary"], clock=clock, embedder=local_embedder, index=back) as app:
        service = app.components["diary"].service
        assert await passes.index_pending(service) == 3
        stub = pb_grpc.DiaryServiceStub(app.channel)
        resp = await stub.RecallNotes(
            pb.RecallNotesRequest(company="acme", seat="ana", query="while down 1", recency_limit=0, lexical_limit=0)
        )
        assert resp.vector_source == 1 and {c.note.id for c in resp.candidates} == {n.id for n in pending}
    await back.close()
