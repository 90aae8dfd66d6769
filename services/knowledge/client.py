"""The ``Searcher`` seam as the knowledge service's callers hold it: a typed gRPC client.

The prefetch (the ``## Relevant knowledge`` block, ``search_knowledge``, the onboarding block, the
Tool Skills registry behind GetGuidance) reads knowledge through this, like every other owner's
rows. Every call carries the caller's deadline. A search or an onboarding read never raises: an
RPC that failed is an outcome that did not run (``UNREACHABLE``, naming the status code), which the
block renders as "could not be searched" — never as "nothing matched". ``can_search`` answers
True when the service cannot be asked: unknown is not "no", and the search that follows then says
it did not run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Protocol

import grpc

from agentlearn.common.v1 import embedding_pb2
from agentlearn.knowledge.v1 import knowledge_service_pb2 as pb
from agentlearn.knowledge.v1 import knowledge_service_pb2_grpc as pb_grpc
from services.knowledge.domain import Page, ReadContext, Reader, SearchOutcome, UnsearchedReason
from services.knowledge.servicer import (
    context_to_pb,
    hit_from_pb,
    outcome_from_pb,
    page_from_pb,
    reader_to_pb,
)

__all__ = ["GrpcKnowledgeClient", "KnowledgeUnreadable", "Searcher"]

_log = logging.getLogger(__name__)


class KnowledgeUnreadable(Exception):
    """A listing that could not be read (the caller degrades: e.g. the bundled guidance answers)."""


class Searcher(Protocol):
    """The knowledge-search seam its callers hold (spec: ``knowledge.Searcher``)."""

    async def can_search(self, reader: Reader) -> bool:
        """Whether a search by ``reader`` could return anything (no I/O on the service's side)."""
        ...

    async def search(
        self,
        reader: Reader,
        query: str,
        limit: int,
        context: ReadContext,
        *,
        vector: embedding_pb2.Embedding | None = None,
    ) -> SearchOutcome:
        """Best effort, never raises: the outcome says whether the search ran. ``vector``: one the
        caller already has (the turn's ask): the native backend ranks by it rather than embed the
        query again, when it is of its model."""
        ...

    async def onboarding_pages(self, reader: Reader, unit_chain: Sequence[str], context: ReadContext) -> SearchOutcome:
        """The Onboarding pages of the unit chain (own unit first); never raises."""
        ...

    async def list_pages(
        self, reader: Reader, container: str, context: ReadContext, *, full: bool = True
    ) -> list[Page]:
        """Every page of ``container`` the reader may read (drafts never). Raises
        :class:`KnowledgeUnreadable` when the listing cannot be read."""
        ...


def _why(err: BaseException) -> str:
    if isinstance(err, grpc.aio.AioRpcError):
        return f"knowledge: {err.code().name}"
    if isinstance(err, TimeoutError):
        return "knowledge: DEADLINE_EXCEEDED"
    return f"knowledge: {type(err).__name__}"


class GrpcKnowledgeClient:
    """``agentlearn.knowledge.v1.KnowledgeService`` behind the seam. The channel is asked for on
    every call (the all-in-one points the name at its own port only once the server is bound)."""

    def __init__(self, channel: Callable[[], grpc.aio.Channel], timeout: float, *, max_list_pages: int = 10):
        self._channel = channel
        self.timeout = timeout
        self.max_list_pages = max_list_pages

    def _stub(self) -> pb_grpc.KnowledgeServiceStub:
        return pb_grpc.KnowledgeServiceStub(self._channel())

    async def can_search(self, reader: Reader) -> bool:
        try:
            resp = await self._stub().CanSearch(pb.CanSearchRequest(reader=reader_to_pb(reader)), timeout=self.timeout)
        except (grpc.aio.AioRpcError, TimeoutError) as err:
            _log.warning("CanSearch for %s not answered (%s): searching anyway", reader, _why(err))
            return True
        return resp.can_search

    async def search(
        self,
        reader: Reader,
        query: str,
        limit: int,
        context: ReadContext,
        *,
        vector: embedding_pb2.Embedding | None = None,
    ) -> SearchOutcome:
        request = pb.SearchPagesRequest(
            reader=reader_to_pb(reader), query=query, limit=limit, context=context_to_pb(context)
        )
        if vector is not None:
            request.query_embedding.CopyFrom(vector)
        try:
            resp = await self._stub().SearchPages(request, timeout=self.timeout)
        except (grpc.aio.AioRpcError, TimeoutError) as err:
            _log.warning("knowledge search for %s did not run: %s", reader, _why(err))
            return SearchOutcome.did_not_run(UnsearchedReason.UNREACHABLE, _why(err))
        return outcome_from_pb(
            resp.served_mode, resp.unsearched_reason, [hit_from_pb(h) for h in resp.hits], resp.detail
        )

    async def onboarding_pages(self, reader: Reader, unit_chain: Sequence[str], context: ReadContext) -> SearchOutcome:
        request = pb.ListOnboardingPagesRequest(
            reader=reader_to_pb(reader), unit_chain=list(unit_chain), context=context_to_pb(context)
        )
        try:
            resp = await self._stub().ListOnboardingPages(request, timeout=self.timeout)
        except (grpc.aio.AioRpcError, TimeoutError) as err:
            _log.warning("onboarding pages for %s unreadable: %s", reader, _why(err))
            return SearchOutcome.did_not_run(UnsearchedReason.UNREACHABLE, _why(err))
        return outcome_from_pb(resp.served_mode, resp.unsearched_reason, [hit_from_pb(h) for h in resp.pages])

    async def list_pages(
        self, reader: Reader, container: str, context: ReadContext, *, full: bool = True
    ) -> list[Page]:
        pages: list[Page] = []
        token = ""
        for _ in range(self.max_list_pages):
            request = pb.ListPagesRequest(
                reader=reader_to_pb(reader),
                container=container,
                view=pb.PAGE_VIEW_FULL if full else pb.PAGE_VIEW_BASIC,
                page_token=token,
                context=context_to_pb(context),
            )
            try:
                resp = await self._stub().ListPages(request, timeout=self.timeout)
            except (grpc.aio.AioRpcError, TimeoutError) as err:
                raise KnowledgeUnreadable(_why(err)) from err
            pages += [page_from_pb(p) for p in resp.pages]
            token = resp.next_page_token
            if not token:
                break
        return pages
