"""agentlearn.knowledge.v1.KnowledgeService over gRPC: protobuf in, domain calls, protobuf out."""

from __future__ import annotations

import json

from agentlearn.knowledge.v1 import knowledge_service_pb2 as pb
from agentlearn.knowledge.v1 import knowledge_service_pb2_grpc as pb_grpc
from agentlearn.prefetch.v1 import knowledge_service_pb2 as legacy_pb
from libs.common.enum_maps import enum_to_pb
from libs.common.erasure import provenance_from_json, provenance_json
from libs.common.erasure_rpcs import ErasureRpcs, indexed_erasure
from libs.common.field_copy import from_pb, to_pb
from libs.common.grpcserver import Registration
from libs.common.protoconv import query_vector, timestamp
from libs.common.rpctypes import ServicerContext
from libs.common.validation import decode_page_token, encode_page_token, page_size
from services.knowledge import erasure as _erasure
from services.knowledge.domain import (
    DOMAIN,
    KnowledgeHit,
    Page,
    PromotionDraft,
    ReadContext,
    Reader,
    ReadSource,
    SearchOutcome,
    ServedMode,
    UnsearchedReason,
)
from services.knowledge.domain import DOMAIN as _ERASURE_DOMAIN
from services.knowledge.service import KnowledgeService

__all__ = [
    "PAGE_FIELDS",
    "KnowledgeServicer",
    "context_from_pb",
    "hit_from_pb",
    "hit_to_pb",
    "knowledge_registration",
    "mode_from_pb",
    "outcome_from_pb",
    "outcome_to_pb",
    "page_from_pb",
    "page_to_pb",
    "reader_to_pb",
    "upsert_page",
]


_MODE = enum_to_pb(ServedMode, pb.ServedMode, "SERVED_MODE")
_MODE_BACK = {v: k for k, v in _MODE.items()}
_REASON = enum_to_pb(UnsearchedReason, pb.UnsearchedReason, "UNSEARCHED_REASON")
_REASON_BACK = {v: k for k, v in _REASON.items()}
# The reads a caller names (the service's own reads, GET_PAGE and the like, have no proto value).
_SOURCE = enum_to_pb(
    (
        ReadSource.RELEVANT_KNOWLEDGE,
        ReadSource.SEARCH_KNOWLEDGE,
        ReadSource.ONBOARDING,
        ReadSource.TOOL_SKILL_CATALOGUE,
        ReadSource.INSPECTOR,
    ),
    pb.ReadSource,
    "READ_SOURCE",
)
_SOURCE_BACK = {v: k for k, v in _SOURCE.items()}
PAGE_FIELDS = "id company container title body parent_titles update_time embedding_model"
"""The fields a page carries as they are (both this proto's Page and the legacy one have them)."""
_HIT_FIELDS = "page_id title container snippet body"
_READER_FIELDS = "company seat role"


def mode_to_pb(mode: ServedMode | None) -> pb.ServedMode:
    return _MODE[mode] if mode is not None else pb.SERVED_MODE_UNSPECIFIED


def mode_from_pb(value: pb.ServedMode) -> ServedMode | None:
    return _MODE_BACK.get(value)


def _reason_to_pb(reason: UnsearchedReason | None) -> pb.UnsearchedReason:
    return _REASON[reason] if reason is not None else pb.UNSEARCHED_REASON_UNSPECIFIED


def page_to_pb(page: Page) -> pb.Page:
    return to_pb(pb.Page, page, PAGE_FIELDS, draft=page.draft, backend=mode_to_pb(page.backend))


def page_from_pb(msg: pb.Page) -> Page:
    return from_pb(
        Page,
        msg,
        "id company container title body parent_titles update_time",
        backend=mode_from_pb(msg.backend) or ServedMode.NATIVE,
        embedding_model=msg.embedding_model or None,
    )


def hit_to_pb(hit: KnowledgeHit) -> pb.KnowledgeHit:
    return to_pb(pb.KnowledgeHit, hit, _HIT_FIELDS)


def hit_from_pb(msg: pb.KnowledgeHit) -> KnowledgeHit:
    return from_pb(KnowledgeHit, msg, _HIT_FIELDS)


def outcome_to_pb(outcome: SearchOutcome) -> pb.SearchPagesResponse:
    return pb.SearchPagesResponse(
        served_mode=mode_to_pb(outcome.served),
        unsearched_reason=_reason_to_pb(outcome.unsearched),
        hits=[hit_to_pb(h) for h in outcome.hits],
        detail=outcome.detail,
    )


def outcome_from_pb(
    served: pb.ServedMode, reason: pb.UnsearchedReason, hits: list[KnowledgeHit], detail: str = ""
) -> SearchOutcome:
    """An answer as the seam's outcome; one that names neither a mode nor a reason did not run."""
    mode = mode_from_pb(served)
    if mode is not None:
        return SearchOutcome(mode, None, tuple(hits))
    return SearchOutcome.did_not_run(_REASON_BACK.get(reason, UnsearchedReason.UNREACHABLE), detail)


def reader_from_pb(msg: pb.Reader) -> Reader:
    return from_pb(Reader, msg, _READER_FIELDS)


def reader_to_pb(reader: Reader) -> pb.Reader:
    return to_pb(pb.Reader, reader, _READER_FIELDS)


def context_from_pb(msg: pb.ReadContext, default: ReadSource) -> ReadContext:
    return ReadContext(_SOURCE_BACK.get(msg.source, default), msg.turn_id)


def context_to_pb(context: ReadContext) -> pb.ReadContext:
    return pb.ReadContext(source=_SOURCE.get(context.source, pb.READ_SOURCE_UNSPECIFIED), turn_id=context.turn_id)


async def upsert_page(
    service: KnowledgeService, request: pb.UpsertPageRequest | legacy_pb.UpsertPageRequest
) -> tuple[Page, bool]:
    """An UpsertPage of this proto or of the legacy one (the same fields, but ``page_id``, which the
    legacy one lacks): the page, and whether it is new."""
    page, created, _skipped = await service.upsert_page(
        request.company,
        request.container,
        request.title,
        request.body,
        list(request.parent_titles),
        page_id=request.page_id if isinstance(request, pb.UpsertPageRequest) else "",
    )
    return page, created


class KnowledgeServicer(ErasureRpcs, pb_grpc.KnowledgeServiceServicer):
    def __init__(self, service: KnowledgeService):
        self._service = service
        self._erasure_calls = indexed_erasure(_erasure, lambda: service.pages, domain=_ERASURE_DOMAIN, pb=pb)

    async def UpsertPage(self, request: pb.UpsertPageRequest, context: ServicerContext) -> pb.UpsertPageResponse:
        page, created = await upsert_page(self._service, request)
        return pb.UpsertPageResponse(page=page_to_pb(page), created=created)

    async def GetPage(self, request: pb.GetPageRequest, context: ServicerContext) -> pb.GetPageResponse:
        page = await self._service.get_page(
            reader_from_pb(request.reader), request.page_id, context_from_pb(request.context, ReadSource.GET_PAGE)
        )
        return pb.GetPageResponse(page=page_to_pb(page))

    async def ListPages(self, request: pb.ListPagesRequest, context: ServicerContext) -> pb.ListPagesResponse:
        limits = self._service.limits
        full = request.view == pb.PAGE_VIEW_FULL
        size = page_size(
            request.page_size,
            default=limits.full_page_size if full else limits.list_page_size,
            maximum=limits.full_page_max if full else limits.list_page_max,
            domain=DOMAIN,
        )
        reader = reader_from_pb(request.reader)
        scope = {
            "company": reader.company,
            "seat": reader.seat,
            "role": reader.role,
            "container": request.container,
            "parent": request.parent_title,
            "drafts": request.include_drafts,
        }
        cursor = decode_page_token(request.page_token, scope, domain=DOMAIN)
        listing = await self._service.list_pages(
            reader,
            request.container,
            request.parent_title,
            request.include_drafts,
            full,
            size,
            cursor,
            context_from_pb(request.context, ReadSource.LIST_PAGES),
        )
        token = encode_page_token(listing.next_cursor, scope) if listing.next_cursor is not None else ""
        return pb.ListPagesResponse(pages=[page_to_pb(p) for p in listing.pages], next_page_token=token)

    async def SearchPages(self, request: pb.SearchPagesRequest, context: ServicerContext) -> pb.SearchPagesResponse:
        outcome = await self._service.search(
            reader_from_pb(request.reader),
            request.query,
            request.limit,
            context_from_pb(request.context, ReadSource.SEARCH_PAGES),
            vector=query_vector(request.query_embedding, domain=DOMAIN),
        )
        return outcome_to_pb(outcome)

    async def CanSearch(self, request: pb.CanSearchRequest, context: ServicerContext) -> pb.CanSearchResponse:
        can, access = self._service.can_search(reader_from_pb(request.reader))
        return pb.CanSearchResponse(can_search=can, containers=list(access.containers), unscoped=access.unscoped)

    async def ListOnboardingPages(
        self, request: pb.ListOnboardingPagesRequest, context: ServicerContext
    ) -> pb.ListOnboardingPagesResponse:
        outcome = await self._service.onboarding(
            reader_from_pb(request.reader),
            list(request.unit_chain),
            context_from_pb(request.context, ReadSource.ONBOARDING),
        )
        return pb.ListOnboardingPagesResponse(
            pages=[hit_to_pb(h) for h in outcome.hits],
            served_mode=mode_to_pb(outcome.served),
            unsearched_reason=_reason_to_pb(outcome.unsearched),
        )

    async def WritePromotionDraft(
        self, request: pb.WritePromotionDraftRequest, context: ServicerContext
    ) -> pb.WritePromotionDraftResponse:
        result = await self._service.write_promotion_draft(
            from_pb(
                PromotionDraft,
                request,
                "company unit container_key title body tool_sequence sibling_count distinct_agents",
            ),
            sources=[(s.seat, s.turn_id) for s in request.sources],
            provenance=json.loads(provenance_json(request.provenance)) if request.HasField("provenance") else None,
        )
        return pb.WritePromotionDraftResponse(
            page_id=result.page_id,
            page_title=result.page_title,
            created=result.created,
            backend=mode_to_pb(result.backend),
        )

    # ------------------------------------------------------------------ erasure (issue 17)

    async def GetDraftProvenance(
        self, request: pb.GetDraftProvenanceRequest, context: ServicerContext
    ) -> pb.GetDraftProvenanceResponse:
        origin = await self._service.draft_provenance(request.company, request.page_id)
        return pb.GetDraftProvenanceResponse(
            page_id=origin.page_id,
            title=origin.title,
            container_key=origin.container,
            unit=origin.unit,
            sources=[pb.DraftSource(seat=seat, turn_id=turn) for seat, turn in origin.sources],
            seats=sorted({seat for seat, _ in origin.sources}),
            provenance=provenance_from_json(origin.provenance),
            record_time=timestamp(origin.record_time),
        )


def knowledge_registration(service: KnowledgeService) -> Registration:
    return Registration.of(KnowledgeServicer(service))
