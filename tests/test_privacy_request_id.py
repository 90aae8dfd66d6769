"""An erasure's ``request_id`` names one request (docs/privacy.md, Erasing): a retry gets its
erasure back, and a key reused for another request is refused rather than answered with the
earlier erasure (a receipt for an erasure that never ran). A key is scoped to what the erasure is
of, its kind and its seat: one ticket may name a person, a seat and the company, and a seat-bound
token's key never finds another seat's erasure. Real privacy service on loopback, real Postgres."""

from __future__ import annotations

import grpc
import pytest

from agentlearn.common.v1 import erasure_pb2 as er
from agentlearn.privacy.v1 import privacy_service_pb2 as pv
from agentlearn.privacy.v1 import privacy_service_pb2_grpc as pv_grpc
from tests.support.app import open_app
from tests.support.grpc_errors import error_info

pytestmark = pytest.mark.timeout(300)


def _bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


def _subject(handle: str, names: tuple[str, ...] = (), key: str = "dsr-2026-17") -> pv.EraseSubjectRequest:
    subject = er.ErasureSubject(handle=handle, platform="slack")
    return pv.EraseSubjectRequest(company="acme", subject=subject, names=list(names), request_id=key)


async def _refused(call) -> tuple:  # type: ignore[no-untyped-def]
    """(code, reason, metadata, BadRequest fields, message) of a call that must fail."""
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    code, info, bad = error_info(err.value)
    fields = [v.field for v in bad.field_violations] if bad else []
    return code, info.reason, dict(info.metadata), fields, err.value.details() or ""


async def test_a_key_reused_for_another_person_is_refused_and_one_ticket_may_name_a_person_a_seat_and_the_company(
    make_settings, dsn, clock, edge_index
):
    async with open_app(make_settings(), dsn, names=["privacy"], clock=clock, embedder=None, index=edge_index) as app:
        stub = pv_grpc.PrivacyServiceStub(app.channel)
        carla = (await stub.EraseSubject(_subject("carla", ("Carla Moreno",)))).erasure

        # A retry (the names as a set, matched case-insensitively as the owners match them) is
        # the same request: the same erasure.
        again = (await stub.EraseSubject(_subject("carla", ("carla  moreno", "Carla Moreno")))).erasure
        assert again.id == carla.id

        # Another person, or the same person with other names, under the key: refused, and the
        # refusal names no erasure. It used to answer with carla's erasure, and dan was never erased.
        for other in (_subject("dan"), _subject("carla", ("Carla Moreno", "Carlita")), _subject("carla")):
            code, reason, metadata, fields, message = await _refused(stub.EraseSubject(other))
            assert (code, reason, fields) == (grpc.StatusCode.FAILED_PRECONDITION, "REQUEST_ID_REUSED", ["request_id"])
            assert metadata == {"field": "request_id", "request_id": "dsr-2026-17"}
            assert carla.id not in message and carla.id not in str(metadata)

        # A seat and the company under the same ticket: erasures of their own, queued.
        seat = (await stub.EraseSeat(pv.EraseSeatRequest(company="acme", seat="ana", request_id="dsr-2026-17"))).erasure
        company = (await stub.EraseCompany(pv.EraseCompanyRequest(company="acme", request_id="dsr-2026-17"))).erasure
        assert (seat.kind, seat.seat) == (er.ERASURE_KIND_SEAT, "ana") and company.kind == er.ERASURE_KIND_COMPANY
        assert len({carla.id, seat.id, company.id}) == 3
        seat_again = await stub.EraseSeat(pv.EraseSeatRequest(company="acme", seat="ana", request_id="dsr-2026-17"))
        assert seat_again.erasure.id == seat.id

        # A fresh key for dan: his own erasure.
        dan = (await stub.EraseSubject(_subject("dan", key="dsr-2026-18"))).erasure
        assert dan.id != carla.id and dan.subject_digest != carla.subject_digest

        listed = await stub.ListErasures(pv.ListErasuresRequest(company="acme"))
        assert sorted(e.id for e in listed.erasures) == sorted([carla.id, seat.id, company.id, dan.id])


async def test_a_seat_bound_token_reusing_another_seats_key_gets_its_own_erasure_and_never_sees_the_other(
    make_settings, dsn, clock, edge_index
):
    async with open_app(
        make_settings(), dsn, names=["privacy"], clock=clock, embedder=None, index=edge_index, auth_mode="tokens"
    ) as app:
        stub = pv_grpc.PrivacyServiceStub(app.channel)
        bob, _ = await app.infra.tokens.issue("acme", ["admin"], seat="bob")
        ana, _ = await app.infra.tokens.issue("acme", ["admin"], seat="ana")
        request = pv.EraseSeatRequest(company="acme", seat="bob", request_id="offboard-1")
        of_bob = (await stub.EraseSeat(request, metadata=_bearer(bob))).erasure

        # Seat ana's token under bob's key: ana's own erasure, queued. It used to look up bob's,
        # answer NOT_FOUND naming bob's erasure id, and queue nothing for ana.
        request = pv.EraseSeatRequest(company="acme", seat="ana", request_id="offboard-1")
        of_ana = (await stub.EraseSeat(request, metadata=_bearer(ana))).erasure
        assert of_ana.id != of_bob.id and (of_ana.seat, of_ana.state) == ("ana", pv.ERASURE_STATE_QUEUED)
        assert (await stub.EraseSeat(request, metadata=_bearer(ana))).erasure.id == of_ana.id

        listed = await stub.ListErasures(pv.ListErasuresRequest(company="acme"), metadata=_bearer(ana))
        assert [e.id for e in listed.erasures] == [of_ana.id]
        listed = await stub.ListErasures(pv.ListErasuresRequest(company="acme"), metadata=_bearer(bob))
        assert [e.id for e in listed.erasures] == [of_bob.id]


async def test_a_key_the_previous_release_recorded_is_still_a_retry_of_its_own_request(
    make_settings, dsn, clock, edge_index
):
    """The previous release kept a key in ``request_id`` (and no request digest): a retry of that
    request still gets its erasure, another person under the key is still refused, and a seat's
    erasure under it is a new one (migration 0003)."""
    import uuid

    import asyncpg

    from libs.common.erasure import Kind, Target
    from services.privacy.domain import subject_digest

    async with open_app(make_settings(), dsn, names=["privacy"], clock=clock, embedder=None, index=edge_index) as app:
        stub = pv_grpc.PrivacyServiceStub(app.channel)
        legacy = uuid.uuid4()
        digest = subject_digest(Target(legacy, "acme", Kind.SUBJECT, handle="carla", platform="slack"))
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(
                "INSERT INTO erasures (id, company, kind, seat, subject_digest, request_id, requested_by, state,"
                " create_time, finish_time) VALUES ($1, 'acme', 'subject', '', $2, 'dsr-2026-17', 'local',"
                " 'succeeded', now(), now())",
                legacy,
                digest,
            )
        finally:
            await conn.close()

        again = (await stub.EraseSubject(_subject("carla", ("Carla Moreno",)))).erasure
        assert again.id == str(legacy) and again.state == pv.ERASURE_STATE_SUCCEEDED
        code, reason, _, fields, message = await _refused(stub.EraseSubject(_subject("dan")))
        assert (code, reason, fields) == (grpc.StatusCode.FAILED_PRECONDITION, "REQUEST_ID_REUSED", ["request_id"])
        assert str(legacy) not in message
        seat = (await stub.EraseSeat(pv.EraseSeatRequest(company="acme", seat="ana", request_id="dsr-2026-17"))).erasure
        assert seat.id != str(legacy) and seat.seat == "ana"
