"""PrefetchService and BuiltinService over gRPC: protobuf in, use cases, protobuf out."""

from __future__ import annotations

import json
from typing import Any

from agentlearn.prefetch.v1 import prefetch_service_pb2 as pb
from agentlearn.prefetch.v1 import prefetch_service_pb2_grpc as pb_grpc
from libs.common.enum_maps import enum_to_pb
from libs.common.erasure_rpcs import ErasureRpcs, pool_erasure
from libs.common.field_copy import from_pb, to_pb
from libs.common.rpctypes import ServicerContext
from services.knowledge.domain import Reader, UnsearchedReason
from services.prefetch import erasure as _erasure
from services.prefetch.builtins import Builtins
from services.prefetch.calltool import call_tool, outcome_filter_of, tier_of
from services.prefetch.deps import Deps
from services.prefetch.domain import DOMAIN as _ERASURE_DOMAIN
from services.prefetch.domain import Block, BlockKind, Sender, TurnContext, TurnEmbedding, TurnStart
from services.prefetch.guidance import GuidanceBlock, GuidanceSource, guidance_for
from services.prefetch.turn_context import TurnContextBuilder

__all__ = ["BuiltinServicer", "PrefetchServicer", "context_to_pb"]

_BLOCK = enum_to_pb(BlockKind, pb.Block, "BLOCK")
# None: absent: no search asked for the vector (a thin trigger)
_EMBEDDING: dict[TurnEmbedding | None, pb.TurnEmbedding] = {None: pb.TURN_EMBEDDING_UNSPECIFIED}
_EMBEDDING.update(enum_to_pb(TurnEmbedding, pb.TurnEmbedding, "TURN_EMBEDDING").items())
_SEARCH_STATUS = enum_to_pb(UnsearchedReason, pb.SearchStatus, "SEARCH_STATUS")
_GUIDANCE_SOURCE = enum_to_pb(GuidanceSource, pb.GuidanceSource, "GUIDANCE_SOURCE")
_SENDER_FIELDS = "handle external_id platform display_name"


def _sender(msg: pb.Counterparty) -> Sender:
    return from_pb(Sender, msg, _SENDER_FIELDS)


def _counterparty(sender: Sender | None) -> pb.Counterparty | None:
    if sender is None:
        return None
    return to_pb(pb.Counterparty, sender, _SENDER_FIELDS)


def _block_to_pb(block: Block) -> pb.RenderedBlock:
    return to_pb(
        pb.RenderedBlock,
        block,
        "markdown hit bytes selection_count ids",
        block=_BLOCK[block.kind],
        counterparty=_counterparty(block.counterparty),
    )


def context_to_pb(ctx: TurnContext) -> pb.BuildTurnContextResponse:
    s = ctx.summary
    return pb.BuildTurnContextResponse(
        blocks=[_block_to_pb(b) for b in ctx.blocks],
        summary=pb.PrefetchSummary(
            blocks=[to_pb(pb.BlockSummary, b, "hit bytes source_error", block=_BLOCK[b.kind]) for b in s.blocks],
            knowledge_selection_count=s.knowledge_selection_count,
            trigger_requires_recon=s.trigger_requires_recon,
            turn_embedding=_EMBEDDING[s.turn_embedding],
            line=s.line,
        ),
        markdown=ctx.markdown,
    )


def _tool_to_pb(tool: Any) -> pb.Tool:
    get = tool.get if isinstance(tool, dict) else (lambda k, d=None: getattr(tool, k, d))
    parameters = get("parameters", {}) or {}
    openai = get("openai") or {
        "type": "function",
        "function": {"name": get("name"), "description": get("description"), "parameters": parameters},
    }
    return pb.Tool(
        name=get("name"),
        description=get("description"),
        parameters_json=parameters if isinstance(parameters, str) else json.dumps(parameters, sort_keys=True),
        openai_tool_json=openai if isinstance(openai, str) else json.dumps(openai, sort_keys=True),
    )


def _guidance_to_pb(block: GuidanceBlock) -> pb.GuidanceBlock:
    return to_pb(
        pb.GuidanceBlock, block, "name markdown triggered_by page_id container", source=_GUIDANCE_SOURCE[block.source]
    )


class PrefetchServicer(ErasureRpcs, pb_grpc.PrefetchServiceServicer):
    def __init__(self, deps: Deps, builder: TurnContextBuilder):
        self._deps = deps
        self._builder = builder
        self._erasure_calls = pool_erasure(
            _erasure, lambda: _erasure.pool_of(deps.store), deps, domain=_ERASURE_DOMAIN, pb=pb
        )

    async def BuildTurnContext(
        self, request: pb.BuildTurnContextRequest, context: ServicerContext
    ) -> pb.BuildTurnContextResponse:
        start = from_pb(
            TurnStart,
            request,
            "company seat role turn_id ask requires_recon unit_chain",
            senders=tuple(_sender(s) for s in request.senders),
        )
        return context_to_pb(await self._builder.build(start))

    async def ListTools(self, request: pb.ListToolsRequest, context: ServicerContext) -> pb.ListToolsResponse:
        from services.prefetch.tools import tool_schemas

        # The seat's own credential or containers count when the engine names it (turn start and
        # CallTool ask for the seat; the tool list must offer what their hints point at).
        can = await self._deps.searcher.can_search(Reader(request.company, request.seat, request.role))
        tools = tool_schemas(self._deps.settings, request.company, request.role, can)
        return pb.ListToolsResponse(tools=[_tool_to_pb(t) for t in tools])

    async def GetGuidance(self, request: pb.GetGuidanceRequest, context: ServicerContext) -> pb.GetGuidanceResponse:
        answer = await guidance_for(
            self._deps.searcher, self._deps.settings, request.company, list(request.registered_tools)
        )
        return pb.GetGuidanceResponse(
            blocks=[_guidance_to_pb(b) for b in answer.blocks], registry_unreadable=answer.registry_unreadable
        )


class BuiltinServicer(pb_grpc.BuiltinServiceServicer):
    def __init__(self, builtins: Builtins):
        self._b = builtins

    async def RefreshMemory(
        self, request: pb.RefreshMemoryRequest, context: ServicerContext
    ) -> pb.RefreshMemoryResponse:
        answer = await self._b.refresh_memory(
            request.company,
            request.seat,
            request.turn_id,
            request.context_hint,
            request.limit,
            tuple(_sender(s) for s in request.senders),
            request.role,
        )
        return to_pb(
            pb.RefreshMemoryResponse,
            answer,
            "text note_ids from_ledger",
            refreshes_spent=answer.spent,
            refreshes_allowed=answer.allowed,
        )

    async def QueryEpisodes(
        self, request: pb.QueryEpisodesRequest, context: ServicerContext
    ) -> pb.QueryEpisodesResponse:
        answer = await self._b.query_episodes(
            request.company,
            request.seat,
            request.query,
            request.conversation_id,
            outcome_filter_of(request),
            request.limit,
            request.turn_id,
            request.role,
        )
        return to_pb(pb.QueryEpisodesResponse, answer, "text episode_ids", unreachable_count=answer.unreachable)

    async def ReflectAndPersist(
        self, request: pb.ReflectAndPersistRequest, context: ServicerContext
    ) -> pb.ReflectAndPersistResponse:
        note_id, text = await self._b.reflect_and_persist(
            request.company, request.seat, request.turn_id, request.content, tier_of(request), request.ttl_days
        )
        return pb.ReflectAndPersistResponse(note_id=note_id, text=text)

    async def UseSkill(self, request: pb.UseSkillRequest, context: ServicerContext) -> pb.UseSkillResponse:
        body, skill_id = await self._b.use_skill(request.company, request.seat, request.name, request.turn_id)
        return pb.UseSkillResponse(body=body, skill_id=skill_id)

    async def RefineSkill(self, request: pb.RefineSkillRequest, context: ServicerContext) -> pb.RefineSkillResponse:
        version, text = await self._b.refine_skill(
            request.company, request.seat, request.skill_name, request.content, request.reason, request.turn_id
        )
        return pb.RefineSkillResponse(version=version, text=text)

    async def DistillSkill(self, request: pb.DistillSkillRequest, context: ServicerContext) -> pb.DistillSkillResponse:
        proposal_id, disposition, text = await self._b.distill_skill(
            request.company,
            request.seat,
            request.role,
            name=request.name,
            summary=request.summary,
            body=request.body,
            tool_sequence=list(request.tool_sequence),
            turn_id=request.turn_id,
            session_id=request.session_id,
        )
        return pb.DistillSkillResponse(proposal_id=proposal_id, disposition=disposition, text=text)

    async def SearchKnowledge(
        self, request: pb.SearchKnowledgeRequest, context: ServicerContext
    ) -> pb.SearchKnowledgeResponse:
        answer = await self._b.search_knowledge(
            request.company, request.seat, request.role, request.query, request.limit, request.turn_id
        )
        outcome = answer.outcome
        hits = [to_pb(pb.KnowledgeHit, h, "page_id title container snippet") for h in outcome.hits]
        status = pb.SEARCH_STATUS_SEARCHED if outcome.ran else _SEARCH_STATUS[outcome.unsearched]  # type: ignore[index]  # not ran means unsearched names why
        return pb.SearchKnowledgeResponse(hits=hits, status=status, text=answer.text)

    async def MarkOnboarded(
        self, request: pb.MarkOnboardedRequest, context: ServicerContext
    ) -> pb.MarkOnboardedResponse:
        digest, text = await self._b.mark_onboarded(request.company, request.seat, list(request.unit_chain))
        return pb.MarkOnboardedResponse(chain_hash=digest, text=text)

    async def CallTool(self, request: pb.CallToolRequest, context: ServicerContext) -> pb.CallToolResponse:
        return await call_tool(self, self._b.deps, request, context)
