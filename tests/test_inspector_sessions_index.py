"""ListSessions, the sessions' index the inspector reads before a session's receipts (which need the
owner): a company's sessions most recently active first, with owner, workspace, seat and the checks
by count and newest state, filtered by seat, owner and id text, paged; never an event's text; and a
credential bound to a seat or a user lists only its own."""

from __future__ import annotations

import grpc
import pytest

from agentlearn.sessions.v1 import session_service_pb2 as pb
from tests.support.grpc_errors import error_info
from tests.support.sessions import open_sessions, result, user, verification


@pytest.fixture
async def env(make_settings, dsn, edge_index, clock):
    async with open_sessions(make_settings(), dsn, clock=clock, embedder=None, index=edge_index) as e:
        yield e


async def _start(env, clock, session: str, owner: str, seat: str):  # type: ignore[no-untyped-def]
    clock.advance(minutes=1)
    t = clock.now()
    await env.append(
        session,
        user(f"{session}-u", f"SECRET-WORDS-{session}", t),
        result(f"{session}-r", "make", "RAW-TOOL-OUTPUT", t),
        verification(f"{session}-v", "pytest", "12 passed", t),
        user=owner,
        seat=seat,
    )


async def refused(call) -> tuple:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    return error_info(err.value)


async def test_sessions_are_listed_newest_activity_first_with_their_checks_and_filters(env, clock):
    await _start(env, clock, "s-1", "dana", "ana")
    await _start(env, clock, "s-2", "erin", "bo")
    await _start(env, clock, "other-3", "dana", "ana")
    await env.manual("s-1", user="dana")
    await env.drain()
    clock.advance(minutes=1)
    await env.manual("s-1", user="dana")  # queued, newest
    clock.advance(minutes=1)
    # s-2 records something again: it becomes the most recently active.
    await env.append("s-2", user("s-2-u2", "more", clock.now()), user="erin", seat="bo")

    resp = await env.stub.ListSessions(pb.ListSessionsRequest(company="acme"))
    assert [s.session_id for s in resp.sessions] == ["s-2", "other-3", "s-1"]
    one = resp.sessions[2]
    assert (one.user, one.seat, one.workspace, one.event_count, one.check_count) == ("dana", "ana", "default", 3, 2)
    assert one.last_check_state == pb.CHECK_STATE_QUEUED and one.last_check_outcome == pb.CHECK_OUTCOME_UNSPECIFIED
    assert resp.sessions[0].check_count == 0 and resp.sessions[0].last_check_state == pb.CHECK_STATE_UNSPECIFIED
    assert resp.sessions[0].update_time.ToDatetime() > one.update_time.ToDatetime()
    assert "SECRET-WORDS" not in str(resp) and "RAW-TOOL-OUTPUT" not in str(resp)  # never evidence

    by_seat = await env.stub.ListSessions(pb.ListSessionsRequest(company="acme", seat="ana"))
    assert [s.session_id for s in by_seat.sessions] == ["other-3", "s-1"]
    by_owner = await env.stub.ListSessions(pb.ListSessionsRequest(company="acme", user="erin"))
    assert [s.session_id for s in by_owner.sessions] == ["s-2"]
    by_text = await env.stub.ListSessions(pb.ListSessionsRequest(company="acme", query="S-"))
    assert [s.session_id for s in by_text.sessions] == ["s-2", "s-1"]
    elsewhere = await env.stub.ListSessions(pb.ListSessionsRequest(company="globex"))
    assert list(elsewhere.sessions) == []

    seen, token = [], ""
    while True:
        page = await env.stub.ListSessions(pb.ListSessionsRequest(company="acme", page_size=2, page_token=token))
        seen += [s.session_id for s in page.sessions]
        token = page.next_page_token
        if not token:
            break
    assert seen == ["s-2", "other-3", "s-1"]
    first = await env.stub.ListSessions(pb.ListSessionsRequest(company="acme", page_size=1))
    code, info, _ = await refused(
        env.stub.ListSessions(pb.ListSessionsRequest(company="acme", seat="bo", page_token=first.next_page_token))
    )
    assert (code, info.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "PAGE_TOKEN_INVALID")
    code, info, bad = await refused(env.stub.ListSessions(pb.ListSessionsRequest(seat="ana")))
    assert info.reason == "FIELD_REQUIRED" and [v.field for v in bad.field_violations] == ["company"]


async def test_only_inspect_of_the_company_lists_and_a_bound_credential_lists_only_its_own(
    make_settings, dsn, edge_index, clock
):
    async with open_sessions(make_settings(), dsn, clock=clock, embedder=None, index=edge_index) as trusted:
        await _start(trusted, clock, "s-1", "dana", "ana")
        await _start(trusted, clock, "s-2", "erin", "bo")
    async with open_sessions(
        make_settings(), dsn, clock=clock, embedder=None, index=edge_index, auth_mode="tokens"
    ) as env:
        tokens = env.app.infra.tokens

        async def bearer(*scopes: str, **bound: str) -> tuple:
            token, _ = await tokens.issue(bound.pop("company", "acme"), list(scopes), **bound)
            return (("authorization", f"Bearer {token}"),)

        inspect = await bearer("inspect")
        listed = await env.stub.ListSessions(pb.ListSessionsRequest(company="acme"), metadata=inspect)
        assert {s.session_id for s in listed.sessions} == {"s-1", "s-2"}
        code, info, _ = await refused(env.stub.ListSessions(pb.ListSessionsRequest(company="globex"), metadata=inspect))
        assert (code, info.reason) == (grpc.StatusCode.PERMISSION_DENIED, "CREDENTIAL_SCOPE_MISMATCH")
        chat = await bearer("chat", user="dana")
        code, info, _ = await refused(env.stub.ListSessions(pb.ListSessionsRequest(company="acme"), metadata=chat))
        assert (code, info.reason) == (grpc.StatusCode.PERMISSION_DENIED, "SCOPE_MISSING")
        # A credential bound to a seat or a user lists its own: naming none is naming its own,
        # naming another is refused.
        ana = await bearer("inspect", seat="ana")
        for request in (pb.ListSessionsRequest(company="acme"), pb.ListSessionsRequest(company="acme", seat="ana")):
            mine = await env.stub.ListSessions(request, metadata=ana)
            assert [s.session_id for s in mine.sessions] == ["s-1"]
        code, info, _ = await refused(
            env.stub.ListSessions(pb.ListSessionsRequest(company="acme", seat="bo"), metadata=ana)
        )
        assert (code, info.reason) == (grpc.StatusCode.PERMISSION_DENIED, "CREDENTIAL_SCOPE_MISMATCH")
        dana = await bearer("inspect", user="dana")
        theirs = await env.stub.ListSessions(pb.ListSessionsRequest(company="acme"), metadata=dana)
        assert [s.session_id for s in theirs.sessions] == ["s-1"]
        code, info, _ = await refused(
            env.stub.ListSessions(pb.ListSessionsRequest(company="acme", user="erin"), metadata=dana)
        )
        assert info.reason == "CREDENTIAL_SCOPE_MISMATCH"
