"""KnowledgeService over gRPC: protobuf in, domain calls, protobuf out. No rules live here."""

from __future__ import annotations

import grpc

from agentlearn.prefetch.v1 import knowledge_service_pb2 as pb
from agentlearn.prefetch.v1 import knowledge_service_pb2_grpc as pb_grpc
from agentlearn.prefetch.v1 import prefetch_service_pb2
from libs.common.grpcserver import Registration
from libs.common.protoconv import timestamp
from services.prefetch.knowledge.domain import KnowledgeHit, Page, SearchOutcome
from services.prefetch.knowledge.service import KnowledgeService

__all__ = [
    "SERVICE_NAME",
    "KnowledgeServicer",
    "hit_to_pb",
    "knowledge_registration",
    "page_to_pb",
    "status_to_pb",
]

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["KnowledgeService"].full_name

_STATUS = {
    "searched": prefetch_service_pb2.SEARCH_STATUS_SEARCHED,
    "unconfigured": prefetch_service_pb2.SEARCH_STATUS_UNCONFIGURED,
    "scoped_to_nothing": prefetch_service_pb2.SEARCH_STATUS_SCOPED_TO_NOTHING,
    "unreachable": prefetch_service_pb2.SEARCH_STATUS_UNREACHABLE,
}


def page_to_pb(page: Page) -> pb.Page:
    return pb.Page(
        id=str(page.id),
        company=page.company,
        container=page.container,
        title=page.title,
        body=page.body,
        parent_titles=list(page.parent_titles),
        update_time=timestamp(page.update_time),
        embedding_model=page.embedding_model or "",
    )


def hit_to_pb(hit: KnowledgeHit) -> prefetch_service_pb2.KnowledgeHit:
    """For SearchKnowledgeResponse.hits (the body stays out: the text carries what is shown)."""
    return prefetch_service_pb2.KnowledgeHit(
        page_id=hit.page_id, title=hit.title, container=hit.container, snippet=hit.snippet
    )


def status_to_pb(outcome: SearchOutcome) -> int:
    """For SearchKnowledgeResponse.status."""
    return _STATUS[outcome.status]


class KnowledgeServicer(pb_grpc.KnowledgeServiceServicer):
    def __init__(self, service: KnowledgeService):
        self._service = service

    async def UpsertPage(
        self, request: pb.UpsertPageRequest, context: grpc.aio.ServicerContext
    ) -> pb.UpsertPageResponse:
        page, created, _skipped = await self._service.upsert_page(
            request.company, request.container, request.title, request.body, list(request.parent_titles)
        )
        return pb.UpsertPageResponse(page=page_to_pb(page), created=created)

    async def GetPage(self, request: pb.GetPageRequest, context: grpc.aio.ServicerContext) -> pb.GetPageResponse:
        page = await self._service.get_page(request.company, request.page_id)
        return pb.GetPageResponse(page=page_to_pb(page))


def knowledge_registration(service: KnowledgeService) -> Registration:
    return Registration(SERVICE_NAME, pb_grpc.add_KnowledgeServiceServicer_to_server, KnowledgeServicer(service))
