"""A field a request leaves empty never widens what a token reaches (docs/security.md, Tokens).

The edge refuses a request that *names* another seat or user than the token is bound to; these are
the requests that name none, where the service itself must narrow or refuse: a session of another
seat, the away digest, the erasure audit and the erasures of a whole company or person, and every
seat's telemetry. Real services on loopback with tokens on, real Postgres."""

from __future__ import annotations

from datetime import timedelta

import grpc
import pytest

from agentlearn.common.v1 import erasure_pb2 as er
from agentlearn.privacy.v1 import privacy_service_pb2 as pv
from agentlearn.privacy.v1 import privacy_service_pb2_grpc as pv_grpc
from agentlearn.sessions.v1 import session_service_pb2 as ss
from agentlearn.telemetry.v1 import telemetry_service_pb2 as tm
from agentlearn.telemetry.v1 import telemetry_service_pb2_grpc as tm_grpc
from libs.common.auth import INTERNAL_HEADER
from tests.support.app import open_app
from tests.support.grpc_errors import error_info
from tests.support.sessions import open_sessions, user
from tests.support.turns import ts


def _bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


async def _refused(call) -> tuple:  # type: ignore[no-untyped-def]
    """(code, ErrorInfo reason, metadata) of a call that must fail."""
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    code, info, _ = error_info(err.value)
    return code, info.reason, dict(info.metadata)


# ------------------------------------------------------------------------------------ sessions


async def test_a_seat_bound_token_reaches_no_session_of_another_seat_by_leaving_seat_empty(
    make_settings, dsn, edge_index, clock
):
    async with open_sessions(
        make_settings(), dsn, clock=clock, embedder=None, index=edge_index, auth_mode="tokens"
    ) as env:
        internal = ((INTERNAL_HEADER, env.app.infra.internal_secret),)
        t = clock.now()
        for session_id, seat in (("s-ben", "ben"), ("s-ana", "ana")):
            await env.stub.AppendSessionEvents(
                ss.AppendSessionEventsRequest(
                    company="acme",
                    session_id=session_id,
                    user="victor",
                    seat=seat,
                    events=[user(f"{session_id}-1", "I deploy on fridays", t)],
                ),
                metadata=internal,
            )
        ana, _ = await env.app.infra.tokens.issue("acme", ["chat"], seat="ana")
        ana_victor, _ = await env.app.infra.tokens.issue("acme", ["chat"], seat="ana", user="victor")
        not_found = (grpc.StatusCode.NOT_FOUND, "SESSION_NOT_FOUND")
        for token in (ana, ana_victor):
            md = _bearer(token)
            injected = user("injected", "injected by ana's token", t)
            for seat in ("", "ana"):  # naming its own seat is no key to another's session either
                append = ss.AppendSessionEventsRequest(
                    company="acme", session_id="s-ben", user="victor", seat=seat, events=[injected]
                )
                assert (await _refused(env.stub.AppendSessionEvents(append, metadata=md)))[:2] == not_found
            calls = [
                env.stub.CheckRecentWork(
                    ss.CheckRecentWorkRequest(company="acme", session_id="s-ben", user="victor"), metadata=md
                ),
                env.stub.ListLearningChecks(
                    ss.ListLearningChecksRequest(company="acme", session_id="s-ben", user="victor"), metadata=md
                ),
                env.stub.SavePlan(
                    ss.SavePlanRequest(company="acme", session_id="s-ben", user="victor", revision=1), metadata=md
                ),
            ]
            for call in calls:
                assert (await _refused(call))[:2] == not_found
            # Its own seat's session is served.
            mine = await env.stub.CheckRecentWork(
                ss.CheckRecentWorkRequest(company="acme", session_id="s-ana", user="victor"), metadata=md
            )
            assert mine.check.seat == "ana"
        # Nothing reached ben's session: no event, no check.
        ben = await env.sessions.service.store.get_session("acme", "s-ben")
        assert ben is not None and ben.last_seq == 1
        checks = await env.stub.ListLearningChecks(
            ss.ListLearningChecksRequest(company="acme", session_id="s-ben", user="victor"), metadata=internal
        )
        assert list(checks.checks) == []


async def test_the_away_digest_of_a_seat_bound_token_holds_its_seat_only(make_settings, dsn, edge_index, clock):
    async with open_sessions(
        make_settings(), dsn, clock=clock, embedder=None, index=edge_index, auth_mode="tokens"
    ) as env:
        internal = ((INTERNAL_HEADER, env.app.infra.internal_secret),)
        since = clock.now() - timedelta(minutes=1)
        for session_id, seat in (("s-ben", "ben"), ("s-ana", "ana")):
            # No work recorded: each check fails (missing evidence) without a model.
            await env.stub.AppendSessionEvents(
                ss.AppendSessionEventsRequest(company="acme", session_id=session_id, user="victor", seat=seat),
                metadata=internal,
            )
            await env.stub.CheckRecentWork(
                ss.CheckRecentWorkRequest(company="acme", session_id=session_id, user="victor"), metadata=internal
            )
        assert await env.drain() == 2
        ask = ss.GetAwayDigestRequest(company="acme", user="victor", since_time=ts(since))
        company, _ = await env.app.infra.tokens.issue("acme", ["chat"])
        ana, _ = await env.app.infra.tokens.issue("acme", ["chat"], seat="ana")
        everything = await env.stub.GetAwayDigest(ask, metadata=_bearer(company))
        narrowed = await env.stub.GetAwayDigest(ask, metadata=_bearer(ana))
    assert sorted(c.session_id for c in everything.checks) == ["s-ana", "s-ben"]
    assert everything.failed_count == 2
    assert [(c.session_id, c.seat) for c in narrowed.checks] == [("s-ana", "ana")]
    assert narrowed.failed_count == 1


# ------------------------------------------------------------------------------------- privacy


async def test_erasing_a_company_or_a_person_and_reading_the_audit_need_a_company_wide_token(
    make_settings, dsn, clock, edge_index
):
    async with open_app(
        make_settings(), dsn, names=["privacy"], clock=clock, embedder=None, index=edge_index, auth_mode="tokens"
    ) as app:
        stub = pv_grpc.PrivacyServiceStub(app.channel)
        tokens = app.infra.tokens
        ana, _ = await tokens.issue("acme", ["admin"], seat="ana")
        carla, _ = await tokens.issue("acme", ["admin"], user="carla")
        acme, _ = await tokens.issue("acme", ["admin"])
        dave = er.ErasureSubject(handle="dave", platform="slack")
        company_wide = (grpc.StatusCode.PERMISSION_DENIED, "COMPANY_WIDE_CREDENTIAL_REQUIRED")
        for token, bound in ((ana, {"bound_seat": "ana"}), (carla, {"bound_user": "carla"})):
            md = _bearer(token)
            assert await _refused(stub.EraseCompany(pv.EraseCompanyRequest(company="acme"), metadata=md)) == (
                *company_wide,
                bound,
            )
            refused = await _refused(
                stub.EraseSubject(pv.EraseSubjectRequest(company="acme", subject=dave), metadata=md)
            )
            assert refused == (*company_wide, bound)
        # A seat-bound token still erases its own seat; the company's token erases another and a person.
        own = (await stub.EraseSeat(pv.EraseSeatRequest(company="acme", seat="ana"), metadata=_bearer(ana))).erasure
        ben = (await stub.EraseSeat(pv.EraseSeatRequest(company="acme", seat="ben"), metadata=_bearer(acme))).erasure
        person = (
            await stub.EraseSubject(pv.EraseSubjectRequest(company="acme", subject=dave), metadata=_bearer(acme))
        ).erasure
        listed = await stub.ListErasures(pv.ListErasuresRequest(company="acme"), metadata=_bearer(acme))
        assert {e.id for e in listed.erasures} == {own.id, ben.id, person.id}
        # The seat-bound token reads its own seat's erasures only; another's is not there for it.
        listed = await stub.ListErasures(pv.ListErasuresRequest(company="acme"), metadata=_bearer(ana))
        assert [e.id for e in listed.erasures] == [own.id]
        got = await stub.GetErasure(pv.GetErasureRequest(company="acme", erasure_id=own.id), metadata=_bearer(ana))
        assert got.erasure.seat == "ana"
        for other in (ben.id, person.id):
            request = pv.GetErasureRequest(company="acme", erasure_id=other)
            code, reason, _ = await _refused(stub.GetErasure(request, metadata=_bearer(ana)))
            assert (code, reason) == (grpc.StatusCode.NOT_FOUND, "ERASURE_NOT_FOUND")
        # A token bound to a user alone has no seat to narrow the audit to: refused.
        md = _bearer(carla)
        list_all = stub.ListErasures(pv.ListErasuresRequest(company="acme"), metadata=md)
        assert await _refused(list_all) == (*company_wide, {"bound_user": "carla"})
        get_one = stub.GetErasure(pv.GetErasureRequest(company="acme", erasure_id=person.id), metadata=md)
        assert await _refused(get_one) == (*company_wide, {"bound_user": "carla"})


# ----------------------------------------------------------------------------------- telemetry


async def test_a_user_bound_token_reads_no_telemetry_of_every_seat(make_settings, dsn, clock, edge_index):
    async with open_app(
        make_settings(), dsn, names=["telemetry"], clock=clock, embedder=None, index=edge_index, auth_mode="tokens"
    ) as app:
        for seat in ("ana", "ben"):
            await app.infra.events.emit_strict("prefetch_served", company="acme", seat=seat, turn_id=f"t-{seat}")
        stub = tm_grpc.TelemetryServiceStub(app.channel)
        carla, _ = await app.infra.tokens.issue("acme", ["inspect"], user="carla")
        ana, _ = await app.infra.tokens.issue("acme", ["inspect"], seat="ana")
        md = _bearer(carla)
        refused = (grpc.StatusCode.PERMISSION_DENIED, "COMPANY_WIDE_CREDENTIAL_REQUIRED", {"bound_user": "carla"})
        calls = [
            stub.ListSeatActivity(tm.ListSeatActivityRequest(company="acme"), metadata=md),
            stub.ListEvents(tm.ListEventsRequest(company="acme"), metadata=md),
            stub.GetPrefetchHitRates(tm.GetPrefetchHitRatesRequest(company="acme"), metadata=md),
            stub.GetAuxiliarySpend(tm.GetAuxiliarySpendRequest(company="acme"), metadata=md),
        ]
        for call in calls:
            assert await _refused(call) == refused
        # Naming a seat, it reads that seat (as it reads the seat's notes); a seat-bound token's
        # empty seat is its own.
        named = await stub.ListEvents(tm.ListEventsRequest(company="acme", seat="ana"), metadata=md)
        own = await stub.ListEvents(tm.ListEventsRequest(company="acme"), metadata=_bearer(ana))
        seats = await stub.ListSeatActivity(tm.ListSeatActivityRequest(company="acme"), metadata=_bearer(ana))
    assert {e.seat for e in named.events} == {"ana"} and named.events
    assert {e.seat for e in own.events} == {"ana"} and own.events
    assert [s.seat for s in seats.seats] == ["ana"]
