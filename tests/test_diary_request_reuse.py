"""WriteNote's ``request_id`` is a retry's key (AIP-155): the same request again answers the first
note; a different request under a used key is refused (REQUEST_ID_REUSED), never answered with the
first note while its own content is dropped (a provider reusing tool-call ids lost writes while the
model was told "Saved"). The request is checked before its key is looked up."""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest

from agentlearn.diary.v1 import diary_service_pb2 as pb
from agentlearn.prefetch.v1 import prefetch_service_pb2 as prefetch_pb
from tests.support.grpc_errors import error_info
from tests.test_prefetch_support import default_settings, open_env


def req(content: str, key: str = "call_0", **kw: object) -> pb.WriteNoteRequest:
    fields: dict[str, object] = {"company": "acme", "seat": "ana", "tier": pb.NOTE_TIER_LONG, "request_id": key}
    fields.update(kw)
    return pb.WriteNoteRequest(content=content, **fields)


async def refused(call):  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await call
    return error_info(exc.value)


async def contents(stub) -> list[str]:  # type: ignore[no-untyped-def]
    listed = await stub.ListNotes(pb.ListNotesRequest(company="acme", seat="ana"))
    return sorted(n.content for n in listed.notes)


def reused(code, info, bad) -> bool:  # type: ignore[no-untyped-def]
    return (
        code == grpc.StatusCode.FAILED_PRECONDITION
        and info.reason == "REQUEST_ID_REUSED"
        and info.metadata["field"] == "request_id"
        and info.metadata["request_id"] == "call_0"
        and bad.field_violations[0].field == "request_id"
    )


async def test_a_used_key_with_a_different_request_is_refused_and_a_true_retry_still_answers(diary):
    app, stub = diary
    first = await stub.WriteNote(req("Dana approves prod deploys in #releases.", turn_id="run-1"))
    assert first.created
    # Each field the note is made of makes it another request: content, tier and ttl, source, turn.
    for other in (
        req("Bob is on vacation until Friday.", turn_id="run-1"),
        req("Dana approves prod deploys in #releases.", tier=pb.NOTE_TIER_SHORT, ttl_days=3, turn_id="run-1"),
        req("Dana approves prod deploys in #releases.", turn_id="run-2"),
        req("Dana approves prod deploys in #releases.", turn_id="run-1", source=pb.NOTE_SOURCE_OPERATOR),
    ):
        assert reused(*await refused(stub.WriteNote(other))), other
    assert await contents(stub) == ["Dana approves prod deploys in #releases."]
    again = await stub.WriteNote(req("Dana approves prod deploys in #releases.", turn_id="run-1"))
    assert not again.created and again.note.id == first.note.id
    # The key table keeps a digest of the request, never its text.
    row = await app.infra.pool.fetchrow("SELECT request_digest FROM diary_requests WHERE request_id = 'call_0'")
    assert len(row["request_digest"]) == 32 and b"Dana" not in row["request_digest"]


async def test_an_invalid_request_is_refused_even_with_a_used_key(diary):
    _, stub = diary
    first = await stub.WriteNote(req("fact A"))
    code, info, bad = await refused(stub.WriteNote(req("fact B" * 500, tier=pb.NOTE_TIER_SHORT, ttl_days=0)))
    assert (code, info.reason, bad.field_violations[0].field) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "NOTE_TOO_LONG",
        "content",
    )
    code, info, bad = await refused(stub.WriteNote(req("fact A", tier=pb.NOTE_TIER_SHORT, ttl_days=0)))
    assert (code, info.reason, bad.field_violations[0].field) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "TTL_OUT_OF_RANGE",
        "ttl_days",
    )
    assert (await stub.WriteNote(req("fact A"))).note.id == first.note.id


async def test_a_deleted_notes_key_answers_its_retry_removed_and_refuses_another_request(diary):
    _, stub = diary
    first = await stub.WriteNote(req("Bob wants digests"))
    await stub.DeleteNote(pb.DeleteNoteRequest(company="acme", seat="ana", note_id=first.note.id))
    assert (await stub.WriteNote(req("Bob wants digests"))).note_removed
    assert reused(*await refused(stub.WriteNote(req("Bob wants PDFs"))))
    assert await contents(stub) == []


async def test_concurrent_writes_of_one_key_store_one_note_and_refuse_the_other_request(diary):
    """The writes wait together and go in one statement (the batch path): the first claims the key,
    the same request gets its note, a different one is refused."""
    _, stub = diary
    answers = await asyncio.gather(
        stub.WriteNote(req("tea at four")),
        stub.WriteNote(req("tea at four")),
        stub.WriteNote(req("coffee at nine")),
        stub.WriteNote(req("coffee at nine")),
        return_exceptions=True,
    )
    written = [a for a in answers if isinstance(a, pb.WriteNoteResponse)]
    failed = [a for a in answers if isinstance(a, grpc.aio.AioRpcError)]
    assert len(written) == 2 and len(failed) == 2
    assert sum(a.created for a in written) == 1 and len({a.note.id for a in written}) == 1
    assert all(reused(*error_info(err)) for err in failed)
    assert await contents(stub) == [written[0].note.content]


async def test_a_key_claimed_before_digests_were_kept_answers_any_request_as_its_retry(diary):
    """Its write's request is unknown, so the key keeps answering as it did."""
    app, stub = diary
    first = await stub.WriteNote(req("fact A"))
    await app.infra.pool.execute("UPDATE diary_requests SET request_digest = NULL")
    again = await stub.WriteNote(req("fact B"))
    assert not again.created and again.note.id == first.note.id


async def test_a_work_keyed_writer_gets_its_first_note_whatever_the_body(diary):
    """The persist decider keys a unit of work: its redelivery asks the model again and counts a
    SHORT note's days from the turn, so the body may differ; the work wrote its note once."""
    _, stub = diary
    decider = {"source": pb.NOTE_SOURCE_PERSIST_DECIDER, "turn_id": "run-1"}
    first = await stub.WriteNote(
        req("Freeze until Friday", "w1:persist", tier=pb.NOTE_TIER_SHORT, ttl_days=3, **decider)
    )
    again = await stub.WriteNote(req("Freeze till Fri", "w1:persist", tier=pb.NOTE_TIER_SHORT, ttl_days=2, **decider))
    assert not again.created and again.note.id == first.note.id
    # Another writer's request under that key is not the decider's redelivery.
    code, info, _ = await refused(stub.WriteNote(req("Freeze till Fri", "w1:persist", turn_id="run-1")))
    assert (code, info.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "REQUEST_ID_REUSED")


@pytest.fixture
async def builtins(make_settings, dsn, clock, local_embedder, edge_index):
    async with open_env(default_settings(make_settings), dsn, clock, embedder=local_embedder, index=edge_index) as e:
        yield e


def persist(env, arguments: dict[str, object], turn_id: str):  # type: ignore[no-untyped-def]
    return env.builtins.CallTool(
        prefetch_pb.CallToolRequest(
            name="reflect_and_persist",
            arguments_json=json.dumps(arguments),
            role="swe",
            company="acme",
            seat="ana",
            turn_id=turn_id,
            request_id="call_0",
        )
    )


async def test_reflect_and_persist_with_a_reused_tool_call_id_is_not_told_saved(builtins):
    """A provider reusing tool-call ids across turns ("call_0"): the second note was dropped while
    the model was told "Saved" with the first note's id."""
    env = builtins
    first = await persist(env, {"content": "Dana approves prod deploys in #releases."}, "run-1")
    assert first.text.startswith("Saved")
    retry = await persist(env, {"content": "Dana approves prod deploys in #releases."}, "run-1")
    assert retry.text.startswith("Saved") and json.loads(retry.result_json) == json.loads(first.result_json)
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await persist(env, {"content": "Bob is on vacation until Friday.", "tier": "short", "ttl_days": 3}, "run-2")
    code, info, _ = error_info(exc.value)
    assert (code, info.reason, info.metadata["field"]) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "REQUEST_ID_REUSED",
        "request_id",
    )
    assert await contents(env.diary) == ["Dana approves prod deploys in #releases."]
