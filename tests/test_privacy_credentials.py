"""Who may erase or export a seat (docs/privacy.md, Who may ask): a token bound to that seat, or to
the company alone. The edge compares a request's seat only with a seat-bound token's, so a token
bound to a user alone must be refused by the privacy service itself: it would otherwise erase or
read out every seat of its company, with other people's notes and profiles. Real services on
loopback with tokens on, real Postgres."""

from __future__ import annotations

import grpc
import pytest

from agentlearn.privacy.v1 import privacy_service_pb2 as pv
from agentlearn.privacy.v1 import privacy_service_pb2_grpc as pv_grpc
from tests.support.app import open_app
from tests.support.grpc_errors import error_info

pytestmark = pytest.mark.timeout(300)

# Every owner the export reads, and the privacy service.
NAMES = ["diary", "episodes", "profiles", "skills", "reflector", "knowledge", "sessions", "privacy"]


def _bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


async def _export(stub: pv_grpc.PrivacyServiceStub, seat: str, token: str) -> list[str]:
    request = pv.ExportSeatRequest(company="acme", seat=seat)
    return [line async for chunk in stub.ExportSeat(request, metadata=_bearer(token)) for line in chunk.lines]


async def _refused(call) -> tuple:  # type: ignore[no-untyped-def]
    """(code, reason, metadata, the fields its BadRequest names) of a call that must fail."""
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    code, info, bad = error_info(err.value)
    return code, info.reason, dict(info.metadata), [v.field for v in bad.field_violations] if bad else []


async def test_a_seat_is_erased_or_exported_with_a_token_of_that_seat_or_the_company_not_of_a_user(
    make_settings, dsn, clock, edge_index
):
    async with open_app(
        make_settings(), dsn, names=NAMES, clock=clock, embedder=None, index=edge_index, auth_mode="tokens"
    ) as app:
        stub = pv_grpc.PrivacyServiceStub(app.channel)
        tokens = app.infra.tokens
        carla, _ = await tokens.issue("acme", ["admin"], user="carla")
        ana, _ = await tokens.issue("acme", ["admin"], seat="ana")
        ana_ann, _ = await tokens.issue("acme", ["admin"], seat="ana", user="ann")
        acme, _ = await tokens.issue("acme", ["admin"])

        # A token bound to a user alone: refused for every seat, before anything is queued or read.
        user_alone = (
            grpc.StatusCode.PERMISSION_DENIED,
            "COMPANY_WIDE_CREDENTIAL_REQUIRED",
            {"bound_user": "carla", "field": "seat"},
            ["seat"],
        )
        for seat in ("ana", "ben"):
            erase = stub.EraseSeat(
                pv.EraseSeatRequest(company="acme", seat=seat, request_id=f"r-{seat}"), metadata=_bearer(carla)
            )
            assert await _refused(erase) == user_alone
            assert await _refused(_export(stub, seat, carla)) == user_alone

        # A seat-bound token (with a user or not): another seat is refused at the edge.
        for token in (ana, ana_ann):
            erase = stub.EraseSeat(pv.EraseSeatRequest(company="acme", seat="ben"), metadata=_bearer(token))
            assert (await _refused(erase))[:2] == (grpc.StatusCode.PERMISSION_DENIED, "CREDENTIAL_SCOPE_MISMATCH")
            exported = _export(stub, "ben", token)
            assert (await _refused(exported))[:2] == (grpc.StatusCode.PERMISSION_DENIED, "CREDENTIAL_SCOPE_MISMATCH")
        listed = await stub.ListErasures(pv.ListErasuresRequest(company="acme"), metadata=_bearer(acme))
        assert list(listed.erasures) == []  # nothing was queued by a refused call

        # Its own seat, and the company's token any seat: served.
        assert await _export(stub, "ana", ana) == []
        assert await _export(stub, "ana", ana_ann) == []
        assert await _export(stub, "ben", acme) == []
        own = await stub.EraseSeat(pv.EraseSeatRequest(company="acme", seat="ana"), metadata=_bearer(ana_ann))
        other = await stub.EraseSeat(pv.EraseSeatRequest(company="acme", seat="ben"), metadata=_bearer(acme))
        assert (own.erasure.seat, other.erasure.seat) == ("ana", "ben")
        listed = await stub.ListErasures(pv.ListErasuresRequest(company="acme"), metadata=_bearer(acme))
        assert {e.id for e in listed.erasures} == {own.erasure.id, other.erasure.id}
