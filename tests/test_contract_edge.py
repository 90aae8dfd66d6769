"""No request can hurt another, at the edge: every caller-input path answers with a caller's error
(INVALID_ARGUMENT naming every bad field and its limit), never INTERNAL, never a status too big for
the caller's metadata; page tokens are signed by one deployment-wide key; health answers List."""

from __future__ import annotations

import asyncio
import base64
import json

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agentlearn.diary.v1 import diary_service_pb2 as diary_pb
from agentlearn.diary.v1 import diary_service_pb2_grpc as diary_grpc
from agentlearn.episodes.v1 import episode_service_pb2 as ep_pb
from agentlearn.episodes.v1 import episode_service_pb2_grpc as ep_grpc
from agentlearn.prefetch.v1 import prefetch_service_pb2 as pf_pb
from agentlearn.prefetch.v1 import prefetch_service_pb2_grpc as pf_grpc
from agentlearn.reflector.v1 import reflector_service_pb2 as rf_pb
from agentlearn.reflector.v1 import reflector_service_pb2_grpc as rf_grpc
from tests.support.app import open_app
from tests.support.grpc_errors import error_info


@pytest.fixture
async def app(make_settings, dsn, clock, edge_index):
    async with open_app(
        make_settings(),
        dsn,
        names=["diary", "episodes", "reflector", "knowledge", "prefetch"],
        clock=clock,
        embedder=None,
        index=edge_index,
    ) as app:
        yield app


async def _refused(call):  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await call
    return error_info(exc.value)


async def test_a_5000_character_company_is_a_rich_invalid_argument_not_a_metadata_overflow(app):
    stub = diary_grpc.DiaryServiceStub(app.channel)
    code, info, bad = await _refused(
        stub.WriteNote(diary_pb.WriteNoteRequest(company="c" * 5000, seat="ana", content="x", tier=1))
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert (info.reason, info.metadata["field"], info.metadata["limit"], info.metadata["length"]) == (
        "FIELD_TOO_LONG",
        "company",
        "200",
        "5000",
    )
    assert [v.field for v in bad.field_violations] == ["company"]
    # A value that breaks a pattern is quoted by a short prefix only.
    code, info, bad = await _refused(
        stub.WriteNote(diary_pb.WriteNoteRequest(company="not a handle " * 15, seat="ana", content="x", tier=1))
    )
    assert (code, info.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "FIELD_INVALID")
    assert "not a handle not a handle not a handle" not in bad.field_violations[0].description


async def test_the_widest_refusal_still_fits_the_callers_metadata(app):
    """Many bad fields, each quoting multi-byte input: the status arrives whole, with its details."""
    emoji = "\U0001f600" * 5000
    stub = diary_grpc.DiaryServiceStub(app.channel)
    code, info, bad = await _refused(
        stub.MarkNotesUsed(diary_pb.MarkNotesUsedRequest(company=emoji, seat=emoji, note_ids=[emoji[:500]] * 120))
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT and info.reason == "FIELD_TOO_LONG"
    assert len(bad.field_violations) == 8 and bad.field_violations[0].field == "company"
    assert info.metadata["violations"] == "100+"


async def test_every_violated_field_of_a_request_is_reported_at_once(app):
    stub = diary_grpc.DiaryServiceStub(app.channel)
    code, info, bad = await _refused(
        stub.WriteNote(diary_pb.WriteNoteRequest(company="", seat="a b", content="x" * 9000, tier=7, ttl_days=-2))
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT and info.domain == "diary.agentlearn.dev"
    assert [v.field for v in bad.field_violations] == ["company", "seat", "content", "tier", "ttl_days"]
    assert info.reason == "FIELD_REQUIRED" and info.metadata["violations"] == "5"
    assert info.metadata["fields"] == "company,seat,content,tier,ttl_days"
    assert "TTL_OUT_OF_RANGE" in bad.field_violations[4].description


async def test_list_notes_with_an_undefined_tier_is_refused_not_read_as_every_tier(app):
    stub = diary_grpc.DiaryServiceStub(app.channel)
    for tier in (1, 2):
        await stub.WriteNote(
            diary_pb.WriteNoteRequest(company="acme", seat="ana", content=f"note {tier}", tier=tier, ttl_days=tier - 1)
        )
    listed = await stub.ListNotes(diary_pb.ListNotesRequest(company="acme", seat="ana"))
    assert listed.total_size == 2
    code, info, bad = await _refused(stub.ListNotes(diary_pb.ListNotesRequest(company="acme", seat="ana", tier=99)))
    assert (code, info.reason, bad.field_violations[0].field) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "FIELD_INVALID",
        "tier",
    )


@pytest.mark.parametrize(
    ("seconds", "nanos", "field"),
    [
        (253_402_300_800, 0, "start_time.seconds"),
        (-62_135_596_801, 0, "start_time.seconds"),
        (1_700_000_000, -1, "start_time.nanos"),
        (2**62, 0, "start_time.seconds"),
    ],
)
async def test_out_of_range_timestamps_are_the_callers_mistake(app, seconds, nanos, field):
    episodes = ep_grpc.EpisodeServiceStub(app.channel)
    request = ep_pb.RecordEpisodeRequest(company="acme", seat="ana", turn_id="r1", label="Ops ping", outcome=1)
    request.start_time.seconds, request.start_time.nanos = seconds, nanos
    request.end_time.seconds = 1_700_000_100
    code, info, bad = await _refused(episodes.RecordEpisode(request))
    assert (code, info.reason, bad.field_violations[0].field) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "FIELD_INVALID",
        field,
    )

    reflector = rf_grpc.ReflectorServiceStub(app.channel)
    turn = rf_pb.TurnCompleted(turn_id="r1", company="acme", seat="ana", role="eng", outcome=1)
    turn.start_time.seconds, turn.start_time.nanos = seconds, nanos
    code, info, bad = await _refused(reflector.SubmitTurn(rf_pb.SubmitTurnRequest(turn=turn)))
    assert (code, bad.field_violations[0].field) == (grpc.StatusCode.INVALID_ARGUMENT, f"turn.{field}")


async def test_get_guidance_refuses_a_tool_list_past_its_limit_and_answers_a_large_one(app):
    stub = pf_grpc.PrefetchServiceStub(app.channel)
    code, info, bad = await _refused(
        stub.GetGuidance(pf_pb.GetGuidanceRequest(company="acme", registered_tools=[f"t{i}" for i in range(40_000)]))
    )
    assert (code, info.reason, info.metadata["limit"], bad.field_violations[0].field) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "TOO_MANY_ITEMS",
        "1000",
        "registered_tools",
    )
    tools = [f"mcp_{i}" for i in range(998)] + ["query_episodes", "query_episodes"]
    resp = await stub.GetGuidance(pf_pb.GetGuidanceRequest(company="acme", registered_tools=tools))
    [block] = [b for b in resp.blocks if b.name == "retrieval-research"]
    assert list(block.triggered_by) == ["query_episodes"]


async def test_health_list_answers_every_service(app):
    health = health_pb2_grpc.HealthStub(app.channel)
    resp = await health.List(health_pb2.HealthListRequest())
    assert resp.statuses[""].status == health_pb2.HealthCheckResponse.SERVING
    assert resp.statuses["agentlearn.diary.v1.DiaryService"].status == health_pb2.HealthCheckResponse.SERVING
    assert "agentlearn.prefetch.v1.PrefetchService" in resp.statuses


async def test_health_watch_streams_the_status_through_every_interceptor(app):
    """Watch is the stock servicer's: a coroutine that writes its answers rather than yielding
    them. Every stream wrapper (errors, auth, call tracking) iterated it, and Watch answered UNKNOWN;
    an orchestrator or a client library that watches health must get the status."""
    health = health_pb2_grpc.HealthStub(app.channel)
    call = health.Watch(health_pb2.HealthCheckRequest(service="agentlearn.diary.v1.DiaryService"))
    first = await asyncio.wait_for(call.read(), timeout=10)
    assert first.status == health_pb2.HealthCheckResponse.SERVING
    call.cancel()


# ------------------------------------------------------------------------------ page tokens


def _forge(token: str, **cursor: object) -> str:
    """The token with its cursor rewritten and its signature kept (what an attacker can do)."""
    body, _, mac = token.partition(".")
    payload = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    payload["c"].update(cursor)
    forged = base64.urlsafe_b64encode(json.dumps(payload).encode()).decode().rstrip("=")
    return f"{forged}.{mac}"


async def _notes(stub, n: int) -> None:  # type: ignore[no-untyped-def]
    for i in range(n):
        await stub.WriteNote(diary_pb.WriteNoteRequest(company="acme", seat="ana", content=f"fact {i}", tier=1))


async def test_a_page_token_is_signed_and_an_edited_one_is_refused(app, clock):
    stub = diary_grpc.DiaryServiceStub(app.channel)
    await _notes(stub, 3)
    first = await stub.ListNotes(diary_pb.ListNotesRequest(company="acme", seat="ana", page_size=1))
    assert first.next_page_token and "." in first.next_page_token
    second = await stub.ListNotes(
        diary_pb.ListNotesRequest(company="acme", seat="ana", page_size=1, page_token=first.next_page_token)
    )
    assert second.notes[0].id != first.notes[0].id
    for forged in (
        _forge(first.next_page_token, t="9999-12-31T23:59:59.999999-23:59"),
        _forge(first.next_page_token, id="a\x00b"),
        first.next_page_token.split(".")[0],  # the signature dropped
        first.next_page_token[:-2] + ("AA" if not first.next_page_token.endswith("AA") else "BB"),
    ):
        code, info, bad = await _refused(
            stub.ListNotes(diary_pb.ListNotesRequest(company="acme", seat="ana", page_size=1, page_token=forged))
        )
        assert (code, info.reason, bad.field_violations[0].field) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "PAGE_TOKEN_INVALID",
            "page_token",
        )


async def test_every_replica_and_restart_verifies_the_tokens_another_minted(make_settings, dsn, clock, edge_index):
    """The key lives in Postgres: a second process on the same database (a replica, or this one
    after a restart) reads the same key and accepts the token."""
    settings = make_settings()
    async with open_app(settings, dsn, names=["diary"], clock=clock, embedder=None, index=edge_index) as one:
        stub = diary_grpc.DiaryServiceStub(one.channel)
        await _notes(stub, 2)
        token = (
            await stub.ListNotes(diary_pb.ListNotesRequest(company="acme", seat="ana", page_size=1))
        ).next_page_token
        key = await one.infra.pool.fetchval("SELECT key FROM deployment_keys WHERE name = 'page_token'")
    async with open_app(settings, dsn, names=["diary"], clock=clock, embedder=None, index=edge_index) as two:
        assert await two.infra.pool.fetchval("SELECT count(*) FROM deployment_keys") == 1
        assert await two.infra.pool.fetchval("SELECT key FROM deployment_keys WHERE name = 'page_token'") == key
        page = await diary_grpc.DiaryServiceStub(two.channel).ListNotes(
            diary_pb.ListNotesRequest(company="acme", seat="ana", page_size=1, page_token=token)
        )
        assert len(page.notes) == 1


async def test_a_configured_secret_signs_the_tokens_instead(make_settings, dsn, clock, edge_index):
    def settings(secret: str):  # type: ignore[no-untyped-def]
        return make_settings(auth={"page_token_secret": secret})

    async with open_app(
        settings("s3cret-one"), dsn, names=["diary"], clock=clock, embedder=None, index=edge_index
    ) as a:
        stub = diary_grpc.DiaryServiceStub(a.channel)
        await _notes(stub, 2)
        token = (
            await stub.ListNotes(diary_pb.ListNotesRequest(company="acme", seat="ana", page_size=1))
        ).next_page_token
        assert await a.infra.pool.fetchval("SELECT count(*) FROM deployment_keys") == 0
    async with open_app(
        settings("s3cret-one"), dsn, names=["diary"], clock=clock, embedder=None, index=edge_index
    ) as b:
        page = await diary_grpc.DiaryServiceStub(b.channel).ListNotes(
            diary_pb.ListNotesRequest(company="acme", seat="ana", page_size=1, page_token=token)
        )
        assert len(page.notes) == 1
    async with open_app(settings("rotated"), dsn, names=["diary"], clock=clock, embedder=None, index=edge_index) as c:
        code, info, _ = await _refused(
            diary_grpc.DiaryServiceStub(c.channel).ListNotes(
                diary_pb.ListNotesRequest(company="acme", seat="ana", page_size=1, page_token=token)
            )
        )
        assert (code, info.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "PAGE_TOKEN_INVALID")
