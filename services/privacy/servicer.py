"""PrivacyService over gRPC: proto <-> domain only."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

from agentlearn.common.v1 import erasure_pb2
from agentlearn.privacy.v1 import privacy_service_pb2 as pb
from agentlearn.privacy.v1 import privacy_service_pb2_grpc as pb_grpc
from libs.common import auth
from libs.common.clients import Clients
from libs.common.enum_maps import enum_to_pb
from libs.common.erasure import PROTO_OF_KIND, Kind, Target, report_to_proto
from libs.common.field_copy import to_pb
from libs.common.rpctypes import ServicerContext
from services.privacy.domain import Erasure, ErasureState
from services.privacy.export import export_seat
from services.privacy.service import PrivacyService, require_seat_credential

__all__ = ["PrivacyServicer", "erasure_to_pb"]

_STATE = enum_to_pb(ErasureState, pb.ErasureState, "ERASURE_STATE")


def erasure_to_pb(e: Erasure, *, receipt: bool = True) -> pb.Erasure:
    msg = to_pb(
        pb.Erasure,
        e,
        "id company seat subject_digest requested_by create_time finish_time verified reason pending_checks",
        kind=PROTO_OF_KIND[e.kind],
        state=_STATE[e.state],
        rounds=e.round,
    )
    if receipt:
        msg.reports.extend(report_to_proto(r) for _, r in sorted(e.receipt().items()))
        msg.residues.extend(report_to_proto(r) for _, r in sorted(e.residues.items()))
    return msg


def _subject_target(company: str, subject: erasure_pb2.ErasureSubject, names: list[str]) -> Target:
    return Target(
        erasure_id=uuid.uuid4(),
        company=company,
        kind=Kind.SUBJECT,
        handle=subject.handle,
        external_id=subject.external_id,
        platform=subject.platform,
        names=tuple(dict.fromkeys(names)),
    )


class PrivacyServicer(pb_grpc.PrivacyServiceServicer):
    def __init__(self, service: PrivacyService, clients: Clients | None = None):
        self._service = service
        self._clients = clients

    async def EraseSubject(self, request: pb.EraseSubjectRequest, context: ServicerContext) -> pb.EraseSubjectResponse:
        target = _subject_target(request.company, request.subject, list(request.names))
        erasure = await self._service.request(target, request.request_id)
        return pb.EraseSubjectResponse(erasure=erasure_to_pb(erasure))

    async def EraseSeat(self, request: pb.EraseSeatRequest, context: ServicerContext) -> pb.EraseSeatResponse:
        target = Target(erasure_id=uuid.uuid4(), company=request.company, kind=Kind.SEAT, seat=request.seat)
        erasure = await self._service.request(target, request.request_id)
        return pb.EraseSeatResponse(erasure=erasure_to_pb(erasure))

    async def EraseCompany(self, request: pb.EraseCompanyRequest, context: ServicerContext) -> pb.EraseCompanyResponse:
        target = Target(erasure_id=uuid.uuid4(), company=request.company, kind=Kind.COMPANY)
        erasure = await self._service.request(target, request.request_id)
        return pb.EraseCompanyResponse(erasure=erasure_to_pb(erasure))

    async def GetErasure(self, request: pb.GetErasureRequest, context: ServicerContext) -> pb.GetErasureResponse:
        erasure = await self._service.get(request.company, request.erasure_id)
        return pb.GetErasureResponse(erasure=erasure_to_pb(erasure))

    async def ExportSeat(
        self, request: pb.ExportSeatRequest, context: ServicerContext
    ) -> AsyncIterator[pb.ExportSeatResponse]:
        assert self._clients is not None
        require_seat_credential("exporting a seat")  # before any owner is read
        # The owners are read with this service's credential: a caller bound to a user (and its
        # seat) is given that user's sessions only, as the sessions service would show it.
        user = auth.current_principal().user
        async for lines in export_seat(self._clients, request.company, request.seat, user):
            yield pb.ExportSeatResponse(lines=lines)

    async def ListErasures(self, request: pb.ListErasuresRequest, context: ServicerContext) -> pb.ListErasuresResponse:
        rows, token = await self._service.list(request.company, request.page_size, request.page_token)
        return pb.ListErasuresResponse(erasures=[erasure_to_pb(e, receipt=False) for e in rows], next_page_token=token)
