"""A service's own request checks name every bad field at once (docs/integrating.md, "Errors"),
as the edge's contract refusals do; a request with one bad field is answered as it always was."""

from __future__ import annotations

import grpc
import pytest

from agentlearn.diary.v1 import diary_service_pb2 as diary_pb
from agentlearn.diary.v1 import diary_service_pb2_grpc as diary_grpc
from agentlearn.reflector.v1 import reflector_service_pb2 as rf_pb
from agentlearn.reflector.v1 import reflector_service_pb2_grpc as rf_grpc
from libs.common.errors import InvalidArgument, InvalidFields, field_error
from tests.support.app import open_app
from tests.support.grpc_errors import error_info

SHORT = diary_pb.NOTE_TIER_SHORT
LONG = diary_pb.NOTE_TIER_LONG


@pytest.fixture
async def app(make_settings, dsn, clock, edge_index):
    async with open_app(
        make_settings(), dsn, names=["diary", "reflector"], clock=clock, embedder=None, index=edge_index
    ) as app:
        yield app


async def _refused(call):  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await call
    code, info, bad = error_info(exc.value)
    return code, exc.value.details(), info, bad


def _turn(*, role: str = "eng", times: bool = True, bodies: tuple[str, ...] = ("hi",)) -> rf_pb.SubmitTurnRequest:
    turn = rf_pb.TurnCompleted(turn_id="r1", company="acme", seat="ana", role=role, outcome=rf_pb.TURN_OUTCOME_DONE)
    if times:
        turn.start_time.seconds, turn.end_time.seconds = 1_700_000_000, 1_700_000_060
    for body in bodies:
        turn.interactions.add(body=body, sender=rf_pb.Sender(platform="slack", handle="bob"))
    return rf_pb.SubmitTurnRequest(turn=turn)


# Two bodies within the contract's 100,000 each, 120,010 characters of asked text together.
LONG_BODIES = ("a" * 60_000, "b" * 60_009)


async def test_submit_turn_names_every_bad_field_of_the_turn(app):
    stub = rf_grpc.ReflectorServiceStub(app.channel)
    code, message, info, bad = await _refused(stub.SubmitTurn(_turn(role="my role", times=False, bodies=LONG_BODIES)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and info.domain == "reflector.agentlearn.dev"
    fields = ["turn.role", "turn.start_time", "turn.end_time", "turn.interactions"]
    assert [v.field for v in bad.field_violations] == fields
    # The first violation's reason, as the contract's refusal of several fields gives it.
    assert info.reason == "FIELD_INVALID" and info.metadata["field"] == "turn.role"
    assert info.metadata["violations"] == "4" and info.metadata["fields"] == ",".join(fields)
    assert info.metadata["reasons"] == "FIELD_INVALID,FIELD_REQUIRED,FIELD_TOO_LONG"
    assert bad.field_violations[1].description.startswith("FIELD_REQUIRED: turn.start_time is required")
    assert bad.field_violations[3].description.startswith("FIELD_TOO_LONG: the turn's inbound text is 120010")
    assert message.startswith("4 violations: turn.role 'my role' is not a valid handle")

    # With a valid role, the times and the length are still all named.
    code, _, info, bad = await _refused(stub.SubmitTurn(_turn(times=False, bodies=LONG_BODIES)))
    assert [v.field for v in bad.field_violations] == ["turn.start_time", "turn.end_time", "turn.interactions"]
    assert (info.reason, info.metadata["violations"]) == ("FIELD_REQUIRED", "3")
    # A violation of the first one's reason carries its description as it is.
    assert bad.field_violations[1].description.startswith("turn.end_time is required")


async def test_submit_turn_with_one_bad_field_answers_as_before(app):
    stub = rf_grpc.ReflectorServiceStub(app.channel)
    code, message, info, bad = await _refused(stub.SubmitTurn(_turn(role="my role")))
    assert (code, info.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "FIELD_INVALID")
    assert message == "turn.role 'my role' is not a valid handle (letters, digits, . _ : @ / -, at most 200)"
    assert dict(info.metadata) == {"field": "turn.role", "value": "my role"}
    assert [(v.field, v.description) for v in bad.field_violations] == [("turn.role", message)]

    code, message, info, bad = await _refused(stub.SubmitTurn(_turn(bodies=LONG_BODIES)))
    assert (code, info.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "FIELD_TOO_LONG")
    assert message == "the turn's inbound text is 120010 characters in all; the limit is 100000"
    assert dict(info.metadata) == {"field": "turn.interactions", "limit": "100000", "length": "120010"}
    assert [v.field for v in bad.field_violations] == ["turn.interactions"]


async def test_write_note_names_every_bad_field(app):
    stub = diary_grpc.DiaryServiceStub(app.channel)
    code, message, info, bad = await _refused(
        stub.WriteNote(diary_pb.WriteNoteRequest(company="acme", seat="ana", content="x" * 2001, tier=SHORT))
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT and info.domain == "diary.agentlearn.dev"
    assert [v.field for v in bad.field_violations] == ["content", "ttl_days"]
    assert info.reason == "NOTE_TOO_LONG" and info.metadata["field"] == "content"
    assert (info.metadata["violations"], info.metadata["fields"]) == ("2", "content,ttl_days")
    assert info.metadata["reasons"] == "NOTE_TOO_LONG,TTL_OUT_OF_RANGE"
    assert bad.field_violations[1].description == (
        "TTL_OUT_OF_RANGE: a SHORT note needs ttl_days between 1 and 3650, got 0"
    )
    assert message.startswith("2 violations: ")

    # A LONG note with days to live and too long a text: both named too.
    _, _, info, bad = await _refused(
        stub.WriteNote(diary_pb.WriteNoteRequest(company="acme", seat="ana", content="x" * 2001, tier=LONG, ttl_days=3))
    )
    assert [v.field for v in bad.field_violations] == ["content", "ttl_days"]
    assert info.metadata["reasons"] == "NOTE_TOO_LONG,TTL_NOT_ALLOWED"
    # Nothing was written by either.
    listed = await stub.ListNotes(diary_pb.ListNotesRequest(company="acme", seat="ana"))
    assert listed.total_size == 0


async def test_write_note_with_one_bad_field_answers_as_before(app):
    stub = diary_grpc.DiaryServiceStub(app.channel)
    code, message, info, bad = await _refused(
        stub.WriteNote(diary_pb.WriteNoteRequest(company="acme", seat="ana", content="x", tier=SHORT))
    )
    assert (code, info.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "TTL_OUT_OF_RANGE")
    assert message == "a SHORT note needs ttl_days between 1 and 3650, got 0"
    assert dict(info.metadata) == {"field": "ttl_days", "value": "0", "maximum": "3650"}
    assert [(v.field, v.description) for v in bad.field_violations] == [("ttl_days", message)]

    code, message, info, bad = await _refused(
        stub.WriteNote(diary_pb.WriteNoteRequest(company="acme", seat="ana", content="x" * 2001, tier=LONG))
    )
    assert (code, info.reason, info.metadata["field"]) == (grpc.StatusCode.INVALID_ARGUMENT, "NOTE_TOO_LONG", "content")
    assert "violations" not in info.metadata
    assert [(v.field, v.description) for v in bad.field_violations] == [("content", message)]


async def test_recall_notes_names_every_limit_past_the_cap(app):
    stub = diary_grpc.DiaryServiceStub(app.channel)
    request = diary_pb.RecallNotesRequest(
        company="acme", seat="ana", query="deploys", vector_limit=501, lexical_limit=900, recency_limit=5
    )
    code, _, info, bad = await _refused(stub.RecallNotes(request))
    assert (code, info.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "LIMIT_OUT_OF_RANGE")
    assert [v.field for v in bad.field_violations] == ["vector_limit", "lexical_limit"]
    assert info.metadata["violations"] == "2" and "reasons" not in info.metadata

    code, message, info, bad = await _refused(
        stub.RecallNotes(diary_pb.RecallNotesRequest(company="acme", seat="ana", query="deploys", vector_limit=501))
    )
    assert message == "vector_limit must be between 0 and 500, got 501"
    assert dict(info.metadata) == {"field": "vector_limit", "value": "501", "maximum": "500"}


def test_a_thousand_bad_fields_cost_no_more_than_a_hundred():
    found = InvalidFields()
    for i in range(1000):
        found.add(field_error(f"ids[{i}]", "FIELD_INVALID", f"ids[{i}] is not an id", domain="x.agentlearn.dev"))
    assert len(found.errors) == InvalidFields.MAX_KEPT
    with pytest.raises(InvalidArgument) as exc:
        found.raise_any()
    assert exc.value.metadata["violations"] == "100+" and exc.value.message.startswith("100+ violations: ")
    assert exc.value.message.endswith("; and more (see the BadRequest)")
    InvalidFields().raise_any()  # nothing found: nothing raised


async def test_build_turn_context_names_every_bad_field_its_own_checks_find(make_settings, dsn, clock, edge_index):
    """Past the edge (the contract takes a blank role and turn id, and a blank unit), the turn
    start's own checks name each at once; one bad field is answered as it always was."""
    from agentlearn.prefetch.v1 import prefetch_service_pb2 as ppb
    from agentlearn.prefetch.v1 import prefetch_service_pb2_grpc as pgrpc

    async with open_app(make_settings(), dsn, clock=clock, embedder=None, index=edge_index) as app:
        stub = pgrpc.PrefetchServiceStub(app.channel)
        code, _, info, bad = await _refused(
            stub.BuildTurnContext(
                ppb.BuildTurnContextRequest(company="acme", seat="ana", role="  ", turn_id=" ", unit_chain=["eng", " "])
            )
        )
        assert code == grpc.StatusCode.INVALID_ARGUMENT and info.domain == "prefetch.agentlearn.dev"
        assert [v.field for v in bad.field_violations] == ["turn_id", "role", "unit_chain[1]"]
        assert info.metadata["violations"] == "3" and info.reason == "FIELD_REQUIRED"

        code, _, info, bad = await _refused(
            stub.BuildTurnContext(ppb.BuildTurnContextRequest(company="acme", seat="ana", role="  ", turn_id="r1"))
        )
        assert [v.field for v in bad.field_violations] == ["role"] and "violations" not in info.metadata
