"""The shipped ``agentlearn.prefetch.v1.KnowledgeService``, kept as a deprecated alias.

It shipped inside the prefetch; its proto and RPCs stay (callers built against it keep working),
served by the knowledge component and delegating to :class:`KnowledgeService`:

- ``UpsertPage`` writes the same native page as ``agentlearn.knowledge.v1`` does.
- ``GetPage`` names no reader, so it is an operator's read: it needs the ``inspect`` scope (the
  services' own calls and local mode have it), and it now records ``knowledge_read``. It used to
  hand any page of the company — drafts and every container — to any ``memory:read`` caller; a
  seat reads through ``agentlearn.knowledge.v1.KnowledgeService.GetPage`` naming itself.
"""

from __future__ import annotations

from agentlearn.prefetch.v1 import knowledge_service_pb2 as pb
from agentlearn.prefetch.v1 import knowledge_service_pb2_grpc as pb_grpc
from libs.common.field_copy import to_pb
from libs.common.grpcserver import Registration
from libs.common.rpctypes import ServicerContext
from services.knowledge.domain import Page, ReadContext, Reader, ReadSource
from services.knowledge.service import KnowledgeService
from services.knowledge.servicer import PAGE_FIELDS, upsert_page

__all__ = ["LegacyKnowledgeServicer", "legacy_registration"]


def _page_to_pb(page: Page) -> pb.Page:
    return to_pb(pb.Page, page, PAGE_FIELDS)


class LegacyKnowledgeServicer(pb_grpc.KnowledgeServiceServicer):
    def __init__(self, service: KnowledgeService):
        self._service = service

    async def UpsertPage(self, request: pb.UpsertPageRequest, context: ServicerContext) -> pb.UpsertPageResponse:
        page, created = await upsert_page(self._service, request)
        return pb.UpsertPageResponse(page=_page_to_pb(page), created=created)

    async def GetPage(self, request: pb.GetPageRequest, context: ServicerContext) -> pb.GetPageResponse:
        page = await self._service.get_page(
            Reader(company=request.company), request.page_id, ReadContext(ReadSource.GET_PAGE)
        )
        return pb.GetPageResponse(page=_page_to_pb(page))


def legacy_registration(service: KnowledgeService) -> Registration:
    return Registration.of(LegacyKnowledgeServicer(service))
