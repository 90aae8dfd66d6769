"""SkillService over gRPC: protobuf in, domain calls, protobuf out. No rules live here."""

from __future__ import annotations

from datetime import datetime

import grpc

from agentlearn.skills.v1 import skill_service_pb2 as pb
from agentlearn.skills.v1 import skill_service_pb2_grpc as pb_grpc
from libs.common.errors import InvalidArgument
from libs.common.protoconv import timestamp
from services.skills.domain import (
    BERLOT_ATTWELL_THRESHOLD,
    DOMAIN,
    Gate,
    LearningHealth,
    ObservationKind,
    Skill,
    SkillChange,
    SkillState,
    SkillTrigger,
    SkillVersion,
)
from services.skills.service import SkillService

__all__ = ["SkillServicer", "skill_to_pb"]

_STATE = {
    SkillState.ACTIVE: pb.SKILL_STATE_ACTIVE,
    SkillState.STALE: pb.SKILL_STATE_STALE,
    SkillState.ARCHIVED: pb.SKILL_STATE_ARCHIVED,
}
_TRIGGER = {SkillTrigger.SINGLE: pb.SKILL_TRIGGER_SINGLE, SkillTrigger.CLUSTERED: pb.SKILL_TRIGGER_CLUSTERED}
_TRIGGER_FROM_PB = {v: k for k, v in _TRIGGER.items()}
_GATE = {
    Gate.OPEN: pb.CANDIDATE_GATE_OPEN,
    Gate.CATALOGUE_FULL: pb.CANDIDATE_GATE_CATALOGUE_FULL,
    Gate.DUPLICATE: pb.CANDIDATE_GATE_DUPLICATE,
}
_CHANGE = {
    SkillChange.CREATED: pb.SKILL_CHANGE_CREATED,
    SkillChange.REFINED: pb.SKILL_CHANGE_REFINED,
    SkillChange.OBSERVATION_APPENDED: pb.SKILL_CHANGE_OBSERVATION_APPENDED,
    SkillChange.ROLLED_BACK: pb.SKILL_CHANGE_ROLLED_BACK,
}
_KIND_FROM_PB = {
    pb.OBSERVATION_KIND_OBSERVED: ObservationKind.OBSERVED,
    pb.OBSERVATION_KIND_COUNTER_EXAMPLE: ObservationKind.COUNTER_EXAMPLE,
}
_SKIP = {
    None: pb.OBSERVATION_SKIP_REASON_UNSPECIFIED,
    "body_cap": pb.OBSERVATION_SKIP_REASON_BODY_CAP,
    "archived": pb.OBSERVATION_SKIP_REASON_ARCHIVED,
}


def skill_to_pb(skill: Skill, now: datetime, *, full: bool = True) -> pb.Skill:
    return pb.Skill(
        id=str(skill.id),
        company=skill.company,
        seat=skill.seat,
        name=skill.name,
        summary=skill.summary,
        body=skill.body if full else "",
        body_chars=len(skill.body),
        tool_sequence=list(skill.tool_sequence),
        trigger=_TRIGGER[skill.trigger],
        cluster_size=skill.cluster_size,
        source_turn_ids=list(skill.source_turn_ids),
        state=_STATE[skill.state],
        pinned=skill.pinned,
        version=skill.version,
        use_count=skill.use_count,
        last_used_time=timestamp(skill.last_used_at),
        last_offered_time=timestamp(skill.last_offered_at),
        unused_since_time=timestamp(skill.unused_since),
        days_unused=skill.days_unused(now),
        state_change_time=timestamp(skill.state_changed_at),
        create_time=timestamp(skill.created_at),
        update_time=timestamp(skill.updated_at),
    )


def _version_to_pb(v: SkillVersion) -> pb.SkillVersion:
    return pb.SkillVersion(
        skill_id=str(v.skill_id),
        version=v.version,
        body=v.body,
        change=_CHANGE[v.change],
        reason=v.reason,
        restored_from_version=v.restored_from_version or 0,
        create_time=timestamp(v.created_at),
        supersede_time=timestamp(v.superseded_at),
        current=v.current,
    )


def _health_to_pb(h: LearningHealth) -> pb.LearningHealth:
    return pb.LearningHealth(
        company=h.company,
        seat=h.seat,
        total_skills=h.total_skills,
        skills_used_at_least_once=h.skills_used_at_least_once,
        total_skill_uses=h.total_skill_uses,
        most_recent_skill_use_time=timestamp(h.most_recent_skill_use),
        avg_uses_per_skill=h.avg_uses_per_skill,
        avg_skill_age_days=h.avg_skill_age_days,
        active_skills=h.active_skills,
        stale_skills=h.stale_skills,
        archived_skills=h.archived_skills,
    )


def _enum_known(value: int, known: set[int], field: str) -> None:
    if value not in known:
        raise InvalidArgument(f"unknown {field} {value}", reason="FIELD_INVALID", domain=DOMAIN, field=field)


class SkillServicer(pb_grpc.SkillServiceServicer):
    def __init__(self, service: SkillService):
        self._service = service

    def _now(self) -> datetime:
        return self._service.clock.now()

    def _key(self, request):  # type: ignore[no-untyped-def]
        return self._service.key(request.company, request.seat, request.skill_id, request.skill_name)

    async def CheckSkillCandidate(
        self, request: pb.CheckSkillCandidateRequest, context: grpc.aio.ServicerContext
    ) -> pb.CheckSkillCandidateResponse:
        verdict = await self._service.check_candidate(request.company, request.seat, list(request.tool_set))
        resp = pb.CheckSkillCandidateResponse(
            gate=_GATE[verdict.gate],
            live_skill_count=verdict.live_count,
            max_skills=verdict.max_skills,
            duplicate_threshold=verdict.threshold,
        )
        if verdict.duplicate is not None:
            dup, sim = verdict.duplicate
            resp.duplicate.CopyFrom(pb.SkillMatch(id=str(dup.id), name=dup.name, similarity=sim))
        return resp

    async def CreateSkill(
        self, request: pb.CreateSkillRequest, context: grpc.aio.ServicerContext
    ) -> pb.CreateSkillResponse:
        _enum_known(request.trigger, {pb.SKILL_TRIGGER_UNSPECIFIED, *_TRIGGER_FROM_PB}, "trigger")
        skill = await self._service.create(
            request.company,
            request.seat,
            name=request.name,
            summary=request.summary,
            body=request.body,
            tool_sequence=list(request.tool_sequence),
            trigger=_TRIGGER_FROM_PB.get(request.trigger),
            cluster_size=request.cluster_size,
            source_turn_ids=list(request.source_turn_ids),
        )
        return pb.CreateSkillResponse(skill=skill_to_pb(skill, self._now()))

    async def ListSkills(
        self, request: pb.ListSkillsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListSkillsResponse:
        _enum_known(request.view, {pb.SKILL_VIEW_UNSPECIFIED, pb.SKILL_VIEW_BASIC, pb.SKILL_VIEW_FULL}, "view")
        skills, token, total = await self._service.list_skills(
            request.company, request.seat, request.page_size, request.page_token, request.include_archived
        )
        now, full = self._now(), request.view == pb.SKILL_VIEW_FULL
        return pb.ListSkillsResponse(
            skills=[skill_to_pb(s, now, full=full) for s in skills], next_page_token=token, total_size=total
        )

    async def GetSkill(self, request: pb.GetSkillRequest, context: grpc.aio.ServicerContext) -> pb.GetSkillResponse:
        skill = await self._service.get(self._key(request))
        return pb.GetSkillResponse(skill=skill_to_pb(skill, self._now()))

    async def UseSkill(self, request: pb.UseSkillRequest, context: grpc.aio.ServicerContext) -> pb.UseSkillResponse:
        result = await self._service.use(self._key(request), request.turn_id)
        return pb.UseSkillResponse(
            skill=skill_to_pb(result.skill, self._now()),
            revived=result.revived,
            telemetry_write_failed=result.telemetry_write_failed,
        )

    async def MarkSkillsOffered(
        self, request: pb.MarkSkillsOfferedRequest, context: grpc.aio.ServicerContext
    ) -> pb.MarkSkillsOfferedResponse:
        result = await self._service.mark_offered(
            request.company, request.seat, list(request.skill_ids), list(request.skill_names), request.turn_id
        )
        return pb.MarkSkillsOfferedResponse(
            marked_count=result.marked,
            revived_skill_names=result.revived_names,
            telemetry_write_failed=result.failure is not None,
            telemetry_failure=result.failure or "",
        )

    async def MarkSkillsUsed(
        self, request: pb.MarkSkillsUsedRequest, context: grpc.aio.ServicerContext
    ) -> pb.MarkSkillsUsedResponse:
        marked, revived, already = await self._service.mark_used(
            request.company, request.seat, list(request.skill_ids), request.turn_id, request.request_id
        )
        return pb.MarkSkillsUsedResponse(marked_count=marked, revived_skill_names=revived, already_applied=already)

    async def RefineSkill(
        self, request: pb.RefineSkillRequest, context: grpc.aio.ServicerContext
    ) -> pb.RefineSkillResponse:
        skill = await self._service.refine(
            self._key(request), request.body, request.reason, request.turn_id, request.request_id
        )
        return pb.RefineSkillResponse(skill=skill_to_pb(skill, self._now()))

    async def AppendSkillObservation(
        self, request: pb.AppendSkillObservationRequest, context: grpc.aio.ServicerContext
    ) -> pb.AppendSkillObservationResponse:
        _enum_known(request.kind, {pb.OBSERVATION_KIND_UNSPECIFIED, *_KIND_FROM_PB}, "kind")
        result = await self._service.append_observation(
            self._key(request),
            _KIND_FROM_PB.get(request.kind),
            request.observation,
            request.turn_id,
            request.request_id,
        )
        return pb.AppendSkillObservationResponse(
            skill=skill_to_pb(result.skill, self._now()),
            skipped=result.skipped_reason is not None,
            skip_reason=_SKIP[result.skipped_reason],
        )

    async def ListSkillVersions(
        self, request: pb.ListSkillVersionsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListSkillVersionsResponse:
        versions, token, total = await self._service.list_versions(
            self._key(request), request.page_size, request.page_token
        )
        return pb.ListSkillVersionsResponse(
            versions=[_version_to_pb(v) for v in versions], next_page_token=token, total_size=total
        )

    async def RollbackSkill(
        self, request: pb.RollbackSkillRequest, context: grpc.aio.ServicerContext
    ) -> pb.RollbackSkillResponse:
        skill = await self._service.rollback(self._key(request), request.version, request.request_id)
        return pb.RollbackSkillResponse(skill=skill_to_pb(skill, self._now()))

    async def PinSkill(self, request: pb.PinSkillRequest, context: grpc.aio.ServicerContext) -> pb.PinSkillResponse:
        skill = await self._service.set_pinned(self._key(request), True)
        return pb.PinSkillResponse(skill=skill_to_pb(skill, self._now(), full=False))

    async def UnpinSkill(
        self, request: pb.UnpinSkillRequest, context: grpc.aio.ServicerContext
    ) -> pb.UnpinSkillResponse:
        skill = await self._service.set_pinned(self._key(request), False)
        return pb.UnpinSkillResponse(skill=skill_to_pb(skill, self._now(), full=False))

    async def ArchiveSkill(
        self, request: pb.ArchiveSkillRequest, context: grpc.aio.ServicerContext
    ) -> pb.ArchiveSkillResponse:
        skill = await self._service.archive(self._key(request))
        return pb.ArchiveSkillResponse(skill=skill_to_pb(skill, self._now(), full=False))

    async def RestoreSkill(
        self, request: pb.RestoreSkillRequest, context: grpc.aio.ServicerContext
    ) -> pb.RestoreSkillResponse:
        skill = await self._service.restore(self._key(request))
        return pb.RestoreSkillResponse(skill=skill_to_pb(skill, self._now(), full=False))

    async def GetLearningHealth(
        self, request: pb.GetLearningHealthRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetLearningHealthResponse:
        health = await self._service.health(request.company, request.seat)
        return pb.GetLearningHealthResponse(
            health=_health_to_pb(health),
            berlot_attwell_threshold=BERLOT_ATTWELL_THRESHOLD,
            below_berlot_attwell_threshold=health.below_threshold,
        )
