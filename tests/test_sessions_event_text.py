"""A session event's text is required where the event is its text: a user or assistant message
with nothing in it is refused FIELD_REQUIRED naming ``events[i].text``, before anything of the
batch is appended. A tool request, tool result or verification may be empty (a call without
arguments, a command that printed nothing): its tool and status are the record. Real gRPC on real
Postgres."""

from __future__ import annotations

import grpc
import pytest

from tests.support.sessions import assistant, info, open_sessions, result, tool_request, user, verification


@pytest.fixture
async def env(make_settings, dsn, edge_index, clock):  # type: ignore[no-untyped-def]
    async with open_sessions(make_settings(), dsn, clock=clock, embedder=None, index=edge_index) as env:
        yield env


async def stored(env) -> list[str]:  # type: ignore[no-untyped-def]
    rows = await env.app.infra.pool.fetch("SELECT event_id FROM session_events ORDER BY event_id")
    return [r["event_id"] for r in rows]


@pytest.mark.parametrize(
    "empty",
    [
        pytest.param(lambda t: user("m", "", t, remember=True), id="remembered user message"),
        pytest.param(lambda t: user("m", "  \n ", t), id="user message of white space"),
        pytest.param(lambda t: assistant("m", "", t), id="assistant message"),
    ],
)
async def test_an_empty_message_is_refused_naming_its_text_and_nothing_is_appended(env, clock, empty):
    t = clock.now()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await env.append("s1", user("ok", "let's begin", t), empty(t))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info(err.value).reason == "FIELD_REQUIRED" and info(err.value).metadata["field"] == "events[1].text"
    assert await stored(env) == []


async def test_an_empty_tool_request_result_or_verification_is_a_record(env, clock):
    t = clock.now()
    resp = await env.append(
        "s1",
        tool_request("q", "git_status", "", t),
        result("r", "bash", "", t),
        verification("v", "make", "", t, ok=True),
    )
    assert resp.appended_count == 3
    assert await stored(env) == ["q", "r", "v"]
