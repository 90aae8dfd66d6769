"""EpisodeService over gRPC: protobuf in, domain calls, protobuf out. No rules live here."""

from __future__ import annotations

from typing import Any, cast

from agentlearn.episodes.v1 import episode_service_pb2 as pb
from agentlearn.episodes.v1 import episode_service_pb2_grpc as pb_grpc
from libs.common import outcomes
from libs.common.enum_maps import enum_to_pb
from libs.common.erasure_rpcs import ErasureCalls, ErasureRpcs
from libs.common.errors import InvalidArgument
from libs.common.field_copy import from_pb, pb_fields
from libs.common.protoconv import query_vector
from libs.common.rpctypes import ServicerContext
from libs.common.search_answer import hit_fields, search_path_fields
from services.episodes import erasure as _erasure
from services.episodes.domain import (
    DOMAIN,
    Episode,
    EpisodeFilter,
    EpisodeKind,
    Sender,
    TurnOutcome,
)
from services.episodes.domain import DOMAIN as _ERASURE_DOMAIN
from services.episodes.service import EpisodeService, TurnRecord

__all__ = ["EpisodeServicer", "episode_to_pb"]

_KIND_TO_PB = enum_to_pb(EpisodeKind, pb.EpisodeKind, "EPISODE_KIND")
_KIND_FROM_PB = {v: k for k, v in _KIND_TO_PB.items()}
_HALF = {"vector": pb.SEARCH_HALF_VECTOR, "lexical": pb.SEARCH_HALF_LEXICAL}


def episode_to_pb(ep: Episode) -> pb.Episode:
    return pb.Episode(**_episode_fields(ep))


def _episode_fields(ep: Episode) -> dict[str, Any]:
    """An episode's message as its fields, for a response to build in place (a search nests many)."""
    return pb_fields(
        pb.Episode,
        ep,
        "id company seat turn_id work_item label ask what_it_did review_outcome tool_sequence tools_called"
        " skills_used conversation_id start_time end_time duration_ms count common_task_pattern common_outcome"
        " success_rate done_count subjects_involved notable_patterns exemplar_turn_ids consolidated_into_skill_id"
        " embedding_model subjects role work_key",
        kind=_KIND_TO_PB[ep.kind],
        outcome=_outcome_to_pb(ep.outcome),
        embedding_dimensions=ep.embedding_dims,
    )


def _outcome_to_pb(outcome: TurnOutcome) -> pb.TurnOutcome:
    # The one table (libs.common.outcomes) holds this enum's numbers; the cast names their type.
    return cast("pb.TurnOutcome", outcomes.to_proto("episodes", outcome))


def _outcome_of(value: int) -> TurnOutcome | None:
    """The row's outcome a proto number stands for (through the one table of ``libs.common.outcomes``);
    ``None`` for UNSPECIFIED and for a number the enum lacks."""
    try:
        outcome = outcomes.from_proto("episodes", value)
    except ValueError:
        return None
    return None if outcome is TurnOutcome.UNSPECIFIED else outcome


def _outcome(value: pb.TurnOutcome, field: str) -> TurnOutcome | None:
    """The outcome, ``None`` when unset (RecordEpisode refuses that, naming the field)."""
    if value == pb.TURN_OUTCOME_UNSPECIFIED:
        return None
    outcome = _outcome_of(value)
    if outcome is None:
        raise InvalidArgument(f"unknown {field} {value}", reason="FIELD_INVALID", domain=DOMAIN, field=field)
    return outcome


def _filter(msg: pb.EpisodeFilter) -> EpisodeFilter:
    if msg.kind not in (pb.EPISODE_KIND_UNSPECIFIED, *_KIND_FROM_PB):
        raise InvalidArgument(
            f"unknown filter.kind {msg.kind}", reason="FIELD_INVALID", domain=DOMAIN, field="filter.kind"
        )
    wanted = []
    for i, value in enumerate(msg.outcomes):
        outcome = _outcome_of(value)
        if outcome is None:
            raise InvalidArgument(
                f"filter.outcomes[{i}] must name an outcome, got {value}",
                reason="FIELD_INVALID",
                domain=DOMAIN,
                field=f"filter.outcomes[{i}]",
            )
        wanted.append(outcome)
    return EpisodeFilter(
        kind=_KIND_FROM_PB.get(msg.kind),
        outcomes=tuple(sorted(set(wanted))),
        min_tool_calls=msg.min_tool_calls,
        conversation_id=msg.conversation_id or None,
        exclude_exemplars=msg.exclude_exemplars,
    )


class EpisodeServicer(ErasureRpcs, pb_grpc.EpisodeServiceServicer):
    def __init__(self, service: EpisodeService, rederive: _erasure.Rederive | None = None, prompt_version: str = ""):
        self._service = service
        # An erasure re-derives a compacted row by the lifecycle's summary (issue 17).
        self._erasure_calls = ErasureCalls.of(
            _ERASURE_DOMAIN,
            pb,
            erase=lambda target: _erasure.erase(
                service.store.pool,
                service.index,
                target,
                service.clock.now(),
                rederive=rederive,
                prompt_version=prompt_version,
            ),
            find=lambda target: _erasure.find(service.store.pool, target, service.index, service.embedder),
        )

    async def RecordEpisode(
        self, request: pb.RecordEpisodeRequest, context: ServicerContext
    ) -> pb.RecordEpisodeResponse:
        rec = from_pb(
            TurnRecord,
            request,
            "company seat turn_id start_time end_time label ask what_it_did role work_item review_outcome"
            " tool_sequence tools_called skills_used subjects conversation_id work_key",
            outcome=_outcome(request.outcome, "outcome"),
            senders=tuple(Sender(s.handle, s.external_id, s.platform) for s in request.senders),
        )
        done = await self._service.record(rec)
        return pb.RecordEpisodeResponse(
            episode=_episode_fields(done.episode),
            created=done.created,
            embedding_skipped_reason=done.skipped or "",
            collapsed=done.collapsed,
        )

    async def SearchEpisodes(
        self, request: pb.SearchEpisodesRequest, context: ServicerContext
    ) -> pb.SearchEpisodesResponse:
        search = await self._service.search(
            request.company,
            request.seat,
            request.query,
            request.limit,
            request.lexical_limit if request.HasField("lexical_limit") else None,
            _outcome(request.outcome_filter, "outcome_filter"),
            query_vector(request.query_embedding, domain=DOMAIN) if request.HasField("query_embedding") else None,
        )
        return pb.SearchEpisodesResponse(
            hits=[pb.EpisodeHit(episode=_episode_fields(h.episode), **hit_fields(h, _HALF)) for h in search.hits],
            **search_path_fields(search),
        )

    async def ListEpisodes(self, request: pb.ListEpisodesRequest, context: ServicerContext) -> pb.ListEpisodesResponse:
        rows, token, total = await self._service.list_episodes(
            request.company, request.seat, request.page_size, request.page_token, _filter(request.filter)
        )
        return pb.ListEpisodesResponse(
            episodes=[_episode_fields(e) for e in rows], next_page_token=token, total_size=total
        )

    async def GetEpisode(self, request: pb.GetEpisodeRequest, context: ServicerContext) -> pb.GetEpisodeResponse:
        ep = await self._service.get(request.company, request.seat, request.episode_id, request.turn_id)
        return pb.GetEpisodeResponse(episode=_episode_fields(ep))

    async def MarkEpisodesConsolidated(
        self, request: pb.MarkEpisodesConsolidatedRequest, context: ServicerContext
    ) -> pb.MarkEpisodesConsolidatedResponse:
        marked = await self._service.mark_consolidated(
            request.company, request.seat, list(request.turn_ids), request.skill_id
        )
        return pb.MarkEpisodesConsolidatedResponse(marked_count=marked)

    async def ListEpisodeSeats(
        self, request: pb.ListEpisodeSeatsRequest, context: ServicerContext
    ) -> pb.ListEpisodeSeatsResponse:
        seats, token = await self._service.list_seats(request.company, request.page_size, request.page_token)
        return pb.ListEpisodeSeatsResponse(
            seats=[pb.SeatRef(company=c, seat=s) for c, s in seats], next_page_token=token
        )

    # ------------------------------------------------------------------ erasure (issue 17)

    async def GetEpisodeProvenance(
        self, request: pb.GetEpisodeProvenanceRequest, context: ServicerContext
    ) -> pb.GetEpisodeProvenanceResponse:
        found = await _erasure.provenance(self._service.store.pool, request.company, request.seat, request.episode_id)
        return pb.GetEpisodeProvenanceResponse(provenance=found)
