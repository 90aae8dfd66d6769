"""WriteNote: stored verbatim, refused past 2,000 characters, embedded inline under a two-second
budget, stored without a vector (never refused) when none can be had."""

from __future__ import annotations

import uuid

import grpc
import pytest

from agentlearn.diary.v1 import diary_service_pb2 as pb
from agentlearn.diary.v1 import diary_service_pb2_grpc as pb_grpc
from libs.common.embeddings.openai_compat import OpenAICompatibleEmbedder
from libs.common.erasure import Kind, Target
from services.diary import erasure
from tests.support.app import open_app
from tests.support.embedders import unloadable_local_embedder
from tests.support.grpc_errors import error_info
from tests.support.scripted_openai import Reply, openai_provider


def write(stub, content, tier=pb.NOTE_TIER_LONG, ttl=0, seat="ana", company="acme"):  # type: ignore[no-untyped-def]
    return stub.WriteNote(
        pb.WriteNoteRequest(
            company=company, seat=seat, content=content, tier=tier, ttl_days=ttl, source=pb.NOTE_SOURCE_OPERATOR
        )
    )


async def test_note_is_stored_verbatim_with_its_vector_and_model(diary):
    app, stub = diary
    content = "  Stakeholder Bob prefers weekly digests.\n\tÜnïcödé kept — exactly.  "
    resp = await write(stub, content)
    assert resp.note.content == content
    assert resp.note.embedding_model == "all-MiniLM-L6-v2"
    assert resp.note.embedding_dimensions == 384
    assert resp.embedding_skipped_reason == ""
    got = await stub.GetNote(pb.GetNoteRequest(company="acme", seat="ana", note_id=resp.note.id))
    assert got.note.content == content
    row = await app.infra.pool.fetchrow("SELECT embedding, indexed FROM agent_diary WHERE id = $1::uuid", resp.note.id)
    assert row["embedding"] is not None and row["indexed"] is True


async def test_two_thousand_characters_is_the_limit_and_past_it_is_refused_untrimmed(diary):
    app, stub = diary
    ok = await write(stub, "x" * 2000)
    assert len(ok.note.content) == 2000
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await write(stub, "y" * 2001)
    code, info, bad = error_info(exc.value)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert info.reason == "NOTE_TOO_LONG"
    assert info.metadata["limit"] == "2000" and info.metadata["length"] == "2001"
    assert "2000" in exc.value.details()
    assert bad.field_violations[0].field == "content"
    assert await app.infra.pool.fetchval("SELECT count(*) FROM agent_diary") == 1


async def test_characters_not_bytes_are_counted(diary):
    _, stub = diary
    resp = await write(stub, "é" * 2000)  # 4,000 bytes, 2,000 characters
    assert len(resp.note.content) == 2000


@pytest.mark.parametrize(
    ("request_kwargs", "field", "reason"),
    [
        ({"content": "", "tier": pb.NOTE_TIER_LONG}, "content", "FIELD_REQUIRED"),
        ({"content": "   ", "tier": pb.NOTE_TIER_LONG}, "content", "FIELD_REQUIRED"),
        ({"content": "a fact"}, "tier", "FIELD_REQUIRED"),
        ({"content": "a state", "tier": pb.NOTE_TIER_SHORT}, "ttl_days", "TTL_OUT_OF_RANGE"),
        ({"content": "a state", "tier": pb.NOTE_TIER_SHORT, "ttl_days": -1}, "ttl_days", "TTL_OUT_OF_RANGE"),
        ({"content": "a fact", "tier": pb.NOTE_TIER_LONG, "ttl_days": 3}, "ttl_days", "TTL_NOT_ALLOWED"),
        ({"content": "a fact", "tier": pb.NOTE_TIER_LONG, "seat": ""}, "seat", "FIELD_REQUIRED"),
        ({"content": "a fact", "tier": pb.NOTE_TIER_LONG, "company": "bad handle!"}, "company", "FIELD_INVALID"),
    ],
)
async def test_bad_writes_are_invalid_argument_naming_the_field(diary, request_kwargs, field, reason):
    app, stub = diary
    req = {"company": "acme", "seat": "ana", **request_kwargs}
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await stub.WriteNote(pb.WriteNoteRequest(**req))
    code, info, bad = error_info(exc.value)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert info.reason == reason
    assert info.domain == "diary.agentlearn.dev"
    assert bad.field_violations[0].field == field
    assert await app.infra.pool.fetchval("SELECT count(*) FROM agent_diary") == 0


async def test_short_note_expires_after_its_ttl(diary):
    _app, stub = diary
    resp = await write(stub, "Sprint freeze runs through Friday", tier=pb.NOTE_TIER_SHORT, ttl=3)
    created = resp.note.create_time.ToDatetime()
    assert (resp.note.expire_time.ToDatetime() - created).days == 3
    assert not (await write(stub, "Bob prefers digests")).note.HasField("expire_time")


@pytest.fixture
async def remote_diary(make_settings, dsn, clock, scripted_openai, vector_index):
    """A diary whose embedder is an OpenAI-compatible endpoint we script."""
    settings = make_settings(
        providers={"embeddings": openai_provider(scripted_openai, "scripted-embed")},
        learning={"diary": {"embed_budget_seconds": 0.5}},
    )
    embedder = OpenAICompatibleEmbedder(settings.providers.embeddings)
    async with open_app(settings, dsn, names=["diary"], clock=clock, embedder=embedder, index=vector_index) as app:
        yield app, pb_grpc.DiaryServiceStub(app.channel), scripted_openai
    await embedder.close()


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        (Reply(delay=1.5), "timeout"),
        (Reply(status=429), "rate_limited"),
        (Reply(status=503), "unavailable"),
        (Reply(status=401), "configuration"),
        (Reply(vectors=lambda inputs: [[0.0] * 64 for _ in inputs]), "unusable_vector"),
        (Reply(vectors=lambda inputs: [[float("nan")] * 64 for _ in inputs]), "unusable_vector"),
        # A proxy's page answered with 200 (the client hands it back as a string), an answer with
        # no vectors in it: the server's bad answer, not an exception that refuses the write.
        (Reply(raw=b"<html>captive portal</html>", content_type="text/html"), "unavailable"),
        (Reply(body={"object": "list"}), "unavailable"),
    ],
)
async def test_a_note_without_a_vector_is_stored_never_refused(remote_diary, reply, reason):
    app, stub, server = remote_diary
    server.push("embeddings", reply)
    resp = await write(stub, "Ana's team ships on Thursdays")
    assert resp.embedding_skipped_reason == reason
    assert resp.note.embedding_model == ""
    row = await app.infra.pool.fetchrow("SELECT content, embedding FROM agent_diary WHERE id = $1::uuid", resp.note.id)
    assert row["content"] == "Ana's team ships on Thursdays" and row["embedding"] is None


async def test_a_note_is_stored_without_a_vector_when_the_local_model_cannot_load(
    make_settings, dsn, clock, edge_index, monkeypatch, tmp_path
):
    # A text the one-piece path takes, one with a non-ASCII character and one past the model's
    # input: the last two are split first, which tokenises and so loads the model there.
    texts = ["Ana's team ships on Thursdays", "The café team deploys on Fridays", "word " * 60]
    embedder = unloadable_local_embedder(monkeypatch, tmp_path)
    async with open_app(make_settings(), dsn, names=["diary"], clock=clock, embedder=embedder, index=edge_index) as app:
        stub = pb_grpc.DiaryServiceStub(app.channel)
        for text in texts:
            resp = await write(stub, text)
            assert (resp.embedding_skipped_reason, resp.note.embedding_model) == ("configuration", "")
        rows = await app.infra.pool.fetch("SELECT content, embedding FROM agent_diary")
        assert sorted(r["content"] for r in rows) == sorted(texts)
        assert all(r["embedding"] is None for r in rows)
    await embedder.close()


async def test_the_remote_vector_is_tagged_with_its_model_and_width(remote_diary):
    _, stub, server = remote_diary
    resp = await write(stub, "Ana prefers Slack over email")
    assert (resp.note.embedding_model, resp.note.embedding_dimensions) == ("scripted-embed", 64)
    assert server.received("embeddings")[0]["input"] == ["Ana prefers Slack over email"]


async def test_a_retry_with_the_same_request_id_returns_the_first_note(diary):
    app, stub = diary
    req = pb.WriteNoteRequest(
        company="acme",
        seat="ana",
        content="Bob prefers digests",
        tier=pb.NOTE_TIER_LONG,
        request_id="run-7:persist_decider",
    )
    first = await stub.WriteNote(req)
    again = await stub.WriteNote(req)
    assert first.created and not again.created
    assert again.note.id == first.note.id
    other_seat = await stub.WriteNote(
        pb.WriteNoteRequest(
            company="acme", seat="bob", content="x", tier=pb.NOTE_TIER_LONG, request_id="run-7:persist_decider"
        )
    )
    assert other_seat.created  # keys are per seat
    assert await app.infra.pool.fetchval("SELECT count(*) FROM agent_diary") == 2


async def test_a_retry_whose_note_was_deleted_writes_nothing_and_says_the_note_is_removed(diary):
    """The key outlives its note: a redelivered write never brings back a note an operator (or an
    erasure) removed; it answers ``note_removed`` with no note, not a second note."""
    app, stub = diary
    req = pb.WriteNoteRequest(
        company="acme", seat="ana", content="Bob wants digests", tier=pb.NOTE_TIER_LONG, request_id="r2"
    )
    first = await stub.WriteNote(req)
    await stub.DeleteNote(pb.DeleteNoteRequest(company="acme", seat="ana", note_id=first.note.id))
    again = await stub.WriteNote(req)
    assert not again.created and again.note_removed and not again.HasField("note")
    assert await app.infra.pool.fetchval("SELECT count(*) FROM agent_diary") == 0
    assert not first.note_removed  # a write that stored its note says so
    # The key is the seat's: another seat's write with it is its own.
    other = await stub.WriteNote(
        pb.WriteNoteRequest(company="acme", seat="bob", content="x", tier=pb.NOTE_TIER_LONG, request_id="r2")
    )
    assert other.created and not other.note_removed


async def test_a_short_notes_key_is_spent_until_its_expiry_then_writes_a_new_note(diary, clock):
    """An expired SHORT note not yet swept is gone to every read (GetNote: NOT_FOUND): a retry with
    its key no longer answers it as if it were live. The key is spent until that expiry only (the
    note was over anyway): past it the write stores a new note, which the key then names. Deleted
    before its expiry, the note is not written again."""
    app, stub = diary

    def req(key: str) -> pb.WriteNoteRequest:
        return pb.WriteNoteRequest(
            company="acme", seat="ana", content="Sprint freeze until Friday", tier=pb.NOTE_TIER_SHORT,
            ttl_days=1, request_id=key,
        )  # fmt: skip

    first = await stub.WriteNote(req("r1"))
    again = await stub.WriteNote(req("r1"))
    assert not again.created and not again.note_removed and again.note.id == first.note.id  # live: the note
    deleted = await stub.WriteNote(req("r3"))
    await stub.DeleteNote(pb.DeleteNoteRequest(company="acme", seat="ana", note_id=deleted.note.id))
    assert (await stub.WriteNote(req("r3"))).note_removed  # deleted before its expiry: not again
    clock.advance(days=2)
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await stub.GetNote(pb.GetNoteRequest(company="acme", seat="ana", note_id=first.note.id))
    assert exc.value.code() == grpc.StatusCode.NOT_FOUND
    late = await stub.WriteNote(req("r1"))
    assert late.created and not late.note_removed and late.note.id != first.note.id
    assert (await stub.WriteNote(req("r1"))).note.id == late.note.id  # the key names the new note now
    got = await stub.GetNote(pb.GetNoteRequest(company="acme", seat="ana", note_id=late.note.id))
    assert got.note.content == "Sprint freeze until Friday"
    assert await app.infra.pool.fetchval("SELECT count(*) FROM diary_requests WHERE request_id = 'r1'") == 1


async def test_an_erasure_takes_the_keys_of_what_it_erases_and_keeps_the_others(diary, clock):
    """A key outlives its note, never its erasure: a person's erasure takes the keys of the notes it
    deletes, the keys of their turns (a note of which may be gone already) and the keys naming
    them; a seat's erasure takes the seat's keys."""
    app, stub = diary
    pool = app.infra.pool

    async def keyed(seat: str, content: str, key: str, turn_id: str = "") -> pb.WriteNoteResponse:
        return await stub.WriteNote(
            pb.WriteNoteRequest(
                company="acme", seat=seat, content=content, tier=pb.NOTE_TIER_LONG, request_id=key, turn_id=turn_id
            )
        )

    async def keys() -> set[tuple[str, str]]:
        return {(r["seat"], r["request_id"]) for r in await pool.fetch("SELECT seat, request_id FROM diary_requests")}

    await keyed("ana", "Carla wants CSV digests", "run-d:persist_decider")  # names her
    gone = await keyed("ana", "Prefers short answers", "run-c:persist_decider", turn_id="run-c")  # her turn's
    await stub.DeleteNote(pb.DeleteNoteRequest(company="acme", seat="ana", note_id=gone.note.id))
    await keyed("ana", "Dave wants PDF", "run-e:persist_decider")
    await keyed("ana", "Weekly sync moved", "tool:ask-carla-7")  # a caller's key naming her
    await keyed("ben", "Ben keeps his own", "k-ben")
    carla = Target(uuid.uuid4(), "acme", Kind.SUBJECT, handle="carla", names=("Carla Moreno",), turn_ids=("run-c",))
    assert (await erasure.find(pool, carla)).tables["diary_requests"].count == 3
    report = await erasure.erase(pool, None, carla, clock.now())
    assert report.tables["diary_requests"].count == 3
    assert "carla" not in " ".join(report.tables["diary_requests"].ids)  # digests, never the keys
    assert await keys() == {("ana", "run-e:persist_decider"), ("ben", "k-ben")}
    assert "diary_requests" not in (await erasure.find(pool, carla)).tables
    await erasure.erase(pool, None, Target(uuid.uuid4(), "acme", Kind.SEAT, seat="ana"), clock.now())
    assert await keys() == {("ben", "k-ben")}
