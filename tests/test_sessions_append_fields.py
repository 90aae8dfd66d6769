"""AppendSessionEvents names every bad field at once (docs/integrating.md, "Errors"), its events'
included, as SubmitTurn and WriteNote do: a batch with a bad session id, an empty message and a
turn end without its outcome was refused for the first, then the second, then the third. A request
with one bad field is answered as it always was. Real gRPC on real Postgres."""

from __future__ import annotations

from collections.abc import Awaitable

import grpc
import pytest
from google.rpc.error_details_pb2 import BadRequest, ErrorInfo

from agentlearn.sessions.v1 import session_service_pb2 as pb
from tests.support.grpc_errors import error_info
from tests.support.sessions import open_sessions, turn_end, user


@pytest.fixture
async def env(make_settings, dsn, edge_index, clock):  # type: ignore[no-untyped-def]
    async with open_sessions(make_settings(), dsn, clock=clock, embedder=None, index=edge_index) as env:
        yield env


async def _refused(call: Awaitable[object]) -> tuple[grpc.StatusCode, str, ErrorInfo, BadRequest]:
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await call
    code, info, bad = error_info(exc.value)
    return code, exc.value.details() or "", info, bad


async def test_every_bad_field_of_an_append_is_named_at_once(env, clock):  # type: ignore[no-untyped-def]
    t = clock.now()
    code, message, info, bad = await _refused(
        env.append(
            "s 1",
            user("m1", "", t),
            turn_end("e1", t, outcome=pb.TURN_OUTCOME_UNSPECIFIED),
            role="my role",
        )
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT and info.domain == "sessions.agentlearn.dev"
    fields = ["session_id", "role", "events[0].text", "events[1].turn_outcome"]
    assert [v.field for v in bad.field_violations] == fields
    # The first violation's reason and facts, then the count, the paths and the reasons.
    assert info.reason == "FIELD_INVALID" and info.metadata["field"] == "session_id"
    assert info.metadata["violations"] == "4" and info.metadata["fields"] == ",".join(fields)
    assert info.metadata["reasons"] == "FIELD_INVALID,FIELD_REQUIRED"
    assert bad.field_violations[1].description.startswith("role 'my role' is not a valid handle")
    assert bad.field_violations[2].description == (
        "FIELD_REQUIRED: events[0].text is required: a user message needs its text"
    )
    assert message.startswith("4 violations: session_id 's 1' is not a valid handle")
    # Nothing of the batch was appended (the session was not even opened).
    rows = await env.app.infra.pool.fetchval("SELECT count(*) FROM session_events")
    assert rows == 0


async def test_an_append_with_one_bad_field_answers_as_before(env, clock):  # type: ignore[no-untyped-def]
    t = clock.now()
    code, message, info, bad = await _refused(env.append("s1", user("m0", "hi", t), user("m1", "", t)))
    assert (code, info.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "FIELD_REQUIRED")
    assert message == "events[1].text is required: a user message needs its text"
    assert dict(info.metadata) == {"field": "events[1].text"}
    assert [(v.field, v.description) for v in bad.field_violations] == [("events[1].text", message)]

    code, message, info, bad = await _refused(env.append("s1", user("m0", "hi", t), role="my role"))
    assert (code, info.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "FIELD_INVALID")
    assert message == "role 'my role' is not a valid handle (letters, digits, . _ : @ / -, at most 200)"
    assert dict(info.metadata) == {"field": "role", "value": "my role"}
    assert "violations" not in info.metadata
