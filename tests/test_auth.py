"""Caller authentication and authorization over real gRPC with real Postgres: bearer tokens bound to
a company (and a seat or user) with scopes, refusals that never say whether a row exists, the scope
each RPC declares in its proto, calls between services that outsiders cannot forge, and the
mutual-TLS internal listener."""

from __future__ import annotations

import importlib
import pkgutil
import uuid
from datetime import UTC, datetime, timedelta

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agentlearn.common.v1 import auth_pb2
from agentlearn.diary.v1 import diary_service_pb2 as diary_pb
from agentlearn.diary.v1 import diary_service_pb2_grpc as diary_grpc
from agentlearn.episodes.v1 import episode_service_pb2 as ep_pb
from agentlearn.episodes.v1 import episode_service_pb2_grpc as ep_grpc
from agentlearn.prefetch.v1 import prefetch_service_pb2 as pf_pb
from agentlearn.prefetch.v1 import prefetch_service_pb2_grpc as pf_grpc
from agentlearn.reflector.v1 import reflector_service_pb2 as rf_pb
from agentlearn.reflector.v1 import reflector_service_pb2_grpc as rf_grpc
from agentlearn.sessions.v1 import session_service_pb2 as ss_pb
from agentlearn.sessions.v1 import session_service_pb2_grpc as ss_grpc
from agentlearn.telemetry.v1 import telemetry_service_pb2 as tm_pb
from agentlearn.telemetry.v1 import telemetry_service_pb2_grpc as tm_grpc
from libs.common.auth import INTERNAL_HEADER, SCOPES, SERVICE_HEADER, Authenticator, TokenStore, digest_of
from libs.common.grpcserver import Listener, bind_server, start_server
from tests.support.app import open_app
from tests.support.certs import Authority
from tests.support.grpc_errors import error_info
from tests.support.turns import raw_episode


@pytest.fixture
async def app(make_settings, dsn, clock, local_embedder, edge_index):
    async with open_app(
        make_settings(), dsn, clock=clock, embedder=local_embedder, index=edge_index, auth_mode="tokens"
    ) as a:
        yield a


async def issue(app, company: str = "acme", scopes=("memory:read", "memory:write"), **kw) -> str:  # type: ignore[no-untyped-def]
    token, _ = await app.infra.tokens.issue(company, list(scopes), **kw)
    return token


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


def write(
    company: str = "acme", seat: str = "ana", content: str = "Bob prefers weekly digests"
) -> diary_pb.WriteNoteRequest:
    return diary_pb.WriteNoteRequest(company=company, seat=seat, content=content, tier=diary_pb.NOTE_TIER_LONG)


async def refused(call) -> tuple:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    return error_info(err.value)


# ------------------------------------------------------------------------------------ tokens


async def test_a_token_is_stored_only_as_its_digest_and_revocation_is_recorded(dsn, clock):
    import asyncpg

    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
    try:
        store = TokenStore(pool, clock)
        token, record = await store.issue("acme", ["memory:read"], seat="ana", name="engine")
        assert token.startswith("agl_") and len(token) > 40
        rows = await pool.fetch("SELECT * FROM api_tokens")
        assert len(rows) == 1
        assert all(token not in str(v) for v in dict(rows[0]).values())
        assert rows[0]["digest"] == digest_of(token)
        assert (await store.by_token(token)).principal().seat == "ana"
        assert await store.revoke(record.id) is True
        assert await store.revoke(record.id) is False  # once
        listed = await store.list("acme")
        assert [r.id for r in listed] == [record.id] and listed[0].revoke_time is not None
        with pytest.raises(Exception, match="unknown: nope"):
            await store.issue("acme", ["memory:read", "nope"])
    finally:
        await pool.close()


async def test_no_malformed_or_unknown_token_is_unauthenticated(app):
    diary = diary_grpc.DiaryServiceStub(app.channel)
    code, info, _ = await refused(diary.WriteNote(write()))
    assert code == grpc.StatusCode.UNAUTHENTICATED and info.reason == "CREDENTIAL_MISSING"
    code, info, _ = await refused(diary.WriteNote(write(), metadata=(("authorization", "Basic abc"),)))
    assert code == grpc.StatusCode.UNAUTHENTICATED and info.reason == "CREDENTIAL_MALFORMED"
    code, info, _ = await refused(diary.WriteNote(write(), metadata=bearer("agl_" + "x" * 43)))
    assert code == grpc.StatusCode.UNAUTHENTICATED and info.reason == "CREDENTIAL_INVALID"
    # Nothing was written by any of them.
    assert await app.infra.pool.fetchval("SELECT count(*) FROM agent_diary") == 0


async def test_revoked_and_expired_tokens_stop_working(app, clock):
    diary = diary_grpc.DiaryServiceStub(app.channel)
    token = await issue(app)
    await diary.WriteNote(write(), metadata=bearer(token))
    record = (await app.infra.tokens.list("acme"))[0]
    await app.infra.tokens.revoke(record.id)
    code, info, _ = await refused(diary.WriteNote(write(), metadata=bearer(token)))
    assert (code, info.reason) == (grpc.StatusCode.UNAUTHENTICATED, "CREDENTIAL_INVALID")

    short = await issue(app, ttl=timedelta(hours=1))
    await diary.ListNotes(diary_pb.ListNotesRequest(company="acme", seat="ana"), metadata=bearer(short))
    clock.advance(hours=2)
    code, info, _ = await refused(
        diary.ListNotes(diary_pb.ListNotesRequest(company="acme", seat="ana"), metadata=bearer(short))
    )
    assert (code, info.reason) == (grpc.StatusCode.UNAUTHENTICATED, "CREDENTIAL_INVALID")


# ------------------------------------------------------------------------------------ binding


async def test_another_company_or_seat_is_denied_without_saying_whether_the_row_exists(app):
    diary = diary_grpc.DiaryServiceStub(app.channel)
    admin_other = await issue(app, company="globex", scopes=("admin",))
    note = (await diary.WriteNote(write(company="globex", seat="ana"), metadata=bearer(admin_other))).note

    acme_ana = await issue(app, seat="ana")
    answers = []
    for note_id in (note.id, str(uuid.uuid4())):  # a row that exists, and one that does not
        code, info, bad = await refused(
            diary.GetNote(
                diary_pb.GetNoteRequest(company="globex", seat="ana", note_id=note_id), metadata=bearer(acme_ana)
            )
        )
        answers.append((code, info.reason, info.metadata.get("field"), bad))
    assert answers[0] == answers[1]
    assert answers[0][:2] == (grpc.StatusCode.PERMISSION_DENIED, "CREDENTIAL_SCOPE_MISMATCH")

    # Bound to seat ana: bob's diary in its own company is refused too; its own is served.
    code, info, _ = await refused(
        diary.ListNotes(diary_pb.ListNotesRequest(company="acme", seat="bob"), metadata=bearer(acme_ana))
    )
    assert code == grpc.StatusCode.PERMISSION_DENIED
    await diary.ListNotes(diary_pb.ListNotesRequest(company="acme", seat="ana"), metadata=bearer(acme_ana))


async def test_identities_nested_in_a_request_are_checked(app):
    """SubmitTurn names its company and seat inside ``turn``."""
    reflector = rf_grpc.ReflectorServiceStub(app.channel)
    token = await issue(app, scopes=("reflect",), seat="ana")
    turn = rf_pb.TurnCompleted(company="globex", seat="ana", turn_id="t1", role="swe", outcome=rf_pb.TURN_OUTCOME_DONE)
    code, info, _ = await refused(reflector.SubmitTurn(rf_pb.SubmitTurnRequest(turn=turn), metadata=bearer(token)))
    assert (code, info.reason) == (grpc.StatusCode.PERMISSION_DENIED, "CREDENTIAL_SCOPE_MISMATCH")
    turn.company, turn.seat = "acme", "bob"
    code, _, _ = await refused(reflector.SubmitTurn(rf_pb.SubmitTurnRequest(turn=turn), metadata=bearer(token)))
    assert code == grpc.StatusCode.PERMISSION_DENIED
    assert await app.infra.pool.fetchval("SELECT count(*) FROM reflections") == 0


async def test_the_scope_an_rpc_declares_is_required_and_admin_implies_all(app):
    diary = diary_grpc.DiaryServiceStub(app.channel)
    reader = await issue(app, scopes=("memory:read",))
    code, info, _ = await refused(diary.WriteNote(write(), metadata=bearer(reader)))
    assert (code, info.reason, info.metadata["scope"]) == (
        grpc.StatusCode.PERMISSION_DENIED,
        "SCOPE_MISSING",
        "memory:write",
    )
    await diary.ListNotes(diary_pb.ListNotesRequest(company="acme", seat="ana"), metadata=bearer(reader))
    admin = await issue(app, scopes=("admin",))
    await diary.WriteNote(write(), metadata=bearer(admin))
    # ... but only in its own company.
    code, _, _ = await refused(diary.WriteNote(write(company="globex"), metadata=bearer(admin)))
    assert code == grpc.StatusCode.PERMISSION_DENIED


async def test_listing_seats_answers_only_for_the_callers_company(app):
    episodes = ep_grpc.EpisodeServiceStub(app.channel)
    internal = ((INTERNAL_HEADER, app.infra.internal_secret),)
    for company, seat in (("acme", "ana"), ("acme", "bo"), ("globex", "zed")):
        await episodes.RecordEpisode(
            raw_episode(
                seat, f"t-{seat}", datetime.now(UTC), "deploy", "ship it", "shipped", ["ci.run"], company=company
            ),
            metadata=internal,
        )
    inspector = await issue(app, scopes=("inspect",))
    named = await episodes.ListEpisodeSeats(ep_pb.ListEpisodeSeatsRequest(company="acme"), metadata=bearer(inspector))
    # Naming no company is naming its own (proto3 sends no empty field, so the edge sees none named).
    unnamed = await episodes.ListEpisodeSeats(ep_pb.ListEpisodeSeatsRequest(), metadata=bearer(inspector))
    for resp in (named, unnamed):
        assert [(s.company, s.seat) for s in resp.seats] == [("acme", "ana"), ("acme", "bo")]
    every = await episodes.ListEpisodeSeats(ep_pb.ListEpisodeSeatsRequest(), metadata=internal)
    assert ("globex", "zed") in [(s.company, s.seat) for s in every.seats]  # the services' own passes
    # A token bound to one seat (or user) does not enumerate its company's seats.
    for bound in ({"seat": "ana"}, {"user": "carla"}):
        narrow = await issue(app, scopes=("inspect",), **bound)
        for request in (ep_pb.ListEpisodeSeatsRequest(), ep_pb.ListEpisodeSeatsRequest(company="acme")):
            code, info, _ = await refused(episodes.ListEpisodeSeats(request, metadata=bearer(narrow)))
            assert (code, info.reason) == (grpc.StatusCode.PERMISSION_DENIED, "COMPANY_WIDE_CREDENTIAL_REQUIRED")
            assert info.metadata[f"bound_{next(iter(bound))}"] == next(iter(bound.values()))
    code, _, _ = await refused(
        episodes.ListEpisodeSeats(ep_pb.ListEpisodeSeatsRequest(company="globex"), metadata=bearer(inspector))
    )
    assert code == grpc.StatusCode.PERMISSION_DENIED
    engine = await issue(app, scopes=("memory:read", "memory:write", "reflect"))
    code, info, _ = await refused(
        episodes.ListEpisodeSeats(ep_pb.ListEpisodeSeatsRequest(company="acme"), metadata=bearer(engine))
    )
    assert (code, info.reason) == (grpc.StatusCode.PERMISSION_DENIED, "SCOPE_MISSING")


async def test_seat_activity_lists_a_seat_tokens_own_seat_and_refuses_a_user_token(app):
    """ListSeatActivity lists every seat of the company: a token bound to a seat gets its own seat's
    row, one bound to a user (no seat to narrow it to) is refused as ListEpisodeSeats refuses it."""
    for seat in ("ana", "bo"):
        await app.infra.events.emit_strict("turn_completed", company="acme", seat=seat)
    telemetry = tm_grpc.TelemetryServiceStub(app.channel)
    request = tm_pb.ListSeatActivityRequest(company="acme")
    company_wide = await issue(app, scopes=("inspect",))
    every = await telemetry.ListSeatActivity(request, metadata=bearer(company_wide))
    assert [s.seat for s in every.seats] == ["ana", "bo"]
    seat_bound = await issue(app, scopes=("inspect",), seat="ana")
    own = await telemetry.ListSeatActivity(request, metadata=bearer(seat_bound))
    assert [s.seat for s in own.seats] == ["ana"]
    for scopes in (("inspect",), ("admin",)):
        user_bound = await issue(app, scopes=scopes, user="carla")
        code, info, _ = await refused(telemetry.ListSeatActivity(request, metadata=bearer(user_bound)))
        assert (code, info.reason) == (grpc.StatusCode.PERMISSION_DENIED, "COMPANY_WIDE_CREDENTIAL_REQUIRED")
        assert info.metadata["bound_user"] == "carla"


async def test_a_lessons_provenance_needs_a_token_bound_to_the_company_alone(app):
    """GetLessonProvenance names every session (of every user) that taught a workspace lesson: a
    token bound to a seat or a user is refused before anything is read."""
    sessions = ss_grpc.SessionServiceStub(app.channel)
    request = ss_pb.GetLessonProvenanceRequest(company="acme", page_id=str(uuid.uuid4()))
    for bound in ({"seat": "ana"}, {"user": "carla"}):
        token = await issue(app, scopes=("inspect",), **bound)
        code, info, _ = await refused(sessions.GetLessonProvenance(request, metadata=bearer(token)))
        assert (code, info.reason) == (grpc.StatusCode.PERMISSION_DENIED, "COMPANY_WIDE_CREDENTIAL_REQUIRED")
    company_wide = await issue(app, scopes=("inspect",))
    code, _, _ = await refused(sessions.GetLessonProvenance(request, metadata=bearer(company_wide)))
    assert code == grpc.StatusCode.NOT_FOUND  # no such lesson: read, and said so


def test_every_rpc_declares_a_known_scope():
    """A new RPC cannot ship without saying who may call it (an undeclared one would need admin)."""
    missing, unknown = [], []
    for service in _contract_services():
        for method in service.methods:
            scope = method.GetOptions().Extensions[auth_pb2.required_scope]
            if not scope:
                missing.append(method.full_name)
            elif scope not in SCOPES:
                unknown.append((method.full_name, scope))
    assert not missing and not unknown, (missing, unknown)


def _contract_services() -> list:  # type: ignore[type-arg]
    """Every service of every contract under protos/agentlearn (from the generated modules)."""
    import agentlearn

    services = []
    for info in pkgutil.walk_packages(agentlearn.__path__, "agentlearn."):
        if info.name.endswith("_pb2"):
            module = importlib.import_module(info.name)
            services += list(module.DESCRIPTOR.services_by_name.values())
    assert len(services) >= 7, services
    return services


# ------------------------------------------------------------------------------------ services


async def test_calls_between_services_carry_an_identity_outsiders_cannot_forge(app):
    """An engine token with memory:read builds a turn context: the prefetch calls the diary,
    episodes, skills and profiles as a service. An outsider naming itself a service is refused."""
    prefetch = pf_grpc.PrefetchServiceStub(app.channel)
    diary = diary_grpc.DiaryServiceStub(app.channel)
    writer = await issue(app, scopes=("memory:write",))
    await diary.WriteNote(write(content="Bob prefers weekly digests of the billing export."), metadata=bearer(writer))
    engine = await issue(app, scopes=("memory:read",), seat="ana")
    resp = await prefetch.BuildTurnContext(
        pf_pb.BuildTurnContextRequest(
            company="acme", seat="ana", role="swe", turn_id="t-1", ask="weekly digest for Bob?"
        ),
        metadata=bearer(engine),
    )
    memory = [b for b in resp.blocks if "Personal memory" in b.markdown]
    assert memory and "weekly digests" in memory[0].markdown

    forged = ((SERVICE_HEADER, "prefetch"), (INTERNAL_HEADER, "guess"))
    code, info, _ = await refused(diary.WriteNote(write(), metadata=forged))
    assert (code, info.reason) == (grpc.StatusCode.UNAUTHENTICATED, "CREDENTIAL_MISSING")
    real = ((INTERNAL_HEADER, app.infra.internal_secret),)
    await diary.WriteNote(write(company="globex"), metadata=real)  # a service acts for any company


async def test_health_and_reflection_answer_without_a_credential(app):
    health = health_pb2_grpc.HealthStub(app.channel)
    resp = await health.Check(health_pb2.HealthCheckRequest(service=""))
    assert resp.status == health_pb2.HealthCheckResponse.SERVING


async def test_the_internal_listener_takes_only_client_certificates_our_ca_signed(dsn, clock, make_settings):
    """Kubernetes: services call each other on a mutual-TLS listener; a verified client certificate
    is a service identity. No certificate, or one another CA signed, fails the handshake."""
    ca, other_ca = Authority(), Authority("someone else")
    server_cert = ca.issue("agentlearn-diary")
    client_cert = ca.issue("agentlearn-prefetch")
    stranger = other_ca.issue("agentlearn-prefetch")
    authenticator = Authenticator(None, clock, mode="tokens", cache_seconds=0)
    async with open_app(make_settings(), dsn, clock=clock, names=["diary"], embedder=None) as plain:
        bound = bind_server(
            [
                Listener("127.0.0.1:0"),
                Listener("127.0.0.1:0", cert=server_cert.cert, key=server_cert.key, client_ca=ca.pem),
            ],
            authenticator=authenticator,
        )
        authenticator.attach_store(plain.infra.tokens)
        await start_server(bound, plain.components["diary"].registrations)
        public, internal = bound.ports
        try:
            creds = grpc.ssl_channel_credentials(ca.pem, client_cert.key, client_cert.cert)
            async with grpc.aio.secure_channel(f"localhost:{internal}", creds) as chan:
                resp = await diary_grpc.DiaryServiceStub(chan).WriteNote(write(company="globex"), timeout=10)
                assert resp.note.company == "globex"
            for bad in (
                grpc.ssl_channel_credentials(ca.pem),  # no client certificate
                grpc.ssl_channel_credentials(ca.pem, stranger.key, stranger.cert),
            ):
                async with grpc.aio.secure_channel(f"localhost:{internal}", bad) as chan:
                    with pytest.raises(grpc.aio.AioRpcError) as err:
                        await diary_grpc.DiaryServiceStub(chan).WriteNote(write(), timeout=5)
                    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            # The public port asks for no certificate: the same call there needs a token.
            async with grpc.aio.insecure_channel(f"127.0.0.1:{public}") as chan:
                code, info, _ = await refused(diary_grpc.DiaryServiceStub(chan).WriteNote(write(), timeout=5))
                assert (code, info.reason) == (grpc.StatusCode.UNAUTHENTICATED, "CREDENTIAL_MISSING")
        finally:
            await bound.server.stop(None)
