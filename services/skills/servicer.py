"""SkillService over gRPC: protobuf in, domain calls, protobuf out. No rules live here."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Protocol

import asyncpg

from agentlearn.common.v1.provenance_pb2 import Provenance
from agentlearn.skills.v1 import skill_service_pb2 as pb
from agentlearn.skills.v1 import skill_service_pb2_grpc as pb_grpc
from libs.common.enum_maps import enum_to_pb
from libs.common.erasure_rpcs import ErasureRpcs, pool_erasure
from libs.common.field_copy import pb_fields
from libs.common.rpctypes import ServicerContext
from services.skills import erasure as _erasure
from services.skills.domain import (
    BERLOT_ATTWELL_THRESHOLD,
    DuplicateCheck,
    Gate,
    LearningHealth,
    ObservationKind,
    ObservationSkip,
    ProposalDisposition,
    ProposalMatch,
    ProposalOrigin,
    ProposalState,
    Skill,
    SkillChange,
    SkillDraft,
    SkillKey,
    SkillProposal,
    SkillState,
    SkillTrigger,
    SkillVersion,
)
from services.skills.domain import DOMAIN as _ERASURE_DOMAIN
from services.skills.proposals import ProposalService
from services.skills.service import SkillService

__all__ = ["SkillServicer", "skill_to_pb"]

_STATE = enum_to_pb(SkillState, pb.SkillState, "SKILL_STATE")
_TRIGGER = enum_to_pb(SkillTrigger, pb.SkillTrigger, "SKILL_TRIGGER")
_TRIGGER_FROM_PB = {v: k for k, v in _TRIGGER.items()}
_GATE = enum_to_pb(Gate, pb.CandidateGate, "CANDIDATE_GATE")
_CHANGE = enum_to_pb(SkillChange, pb.SkillChange, "SKILL_CHANGE")
_KIND_FROM_PB = {v: k for k, v in enum_to_pb(ObservationKind, pb.ObservationKind, "OBSERVATION_KIND").items()}
_SKIP = enum_to_pb(ObservationSkip, pb.ObservationSkipReason, "OBSERVATION_SKIP_REASON")


def skill_to_pb(skill: Skill, now: datetime, *, full: bool = True) -> pb.Skill:
    return pb.Skill(**_skill_fields(skill, now, full=full))


def _skill_fields(skill: Skill, now: datetime, *, full: bool = True) -> dict[str, Any]:
    """A skill's message as its fields: a response builds it in place rather than copying one built
    before (the same for the versions, proposals and matches below)."""
    return pb_fields(
        pb.Skill,
        skill,
        "id company seat name summary tool_sequence cluster_size source_turn_ids pinned version use_count"
        " last_used_time last_offered_time state_change_time create_time update_time",
        body=skill.body if full else "",
        body_chars=len(skill.body),
        trigger=_TRIGGER[skill.trigger],
        state=_STATE[skill.state],
        unused_since_time=skill.unused_since,
        days_unused=skill.days_unused(now),
    )


def _version_fields(v: SkillVersion) -> dict[str, Any]:
    return pb_fields(
        pb.SkillVersion,
        v,
        "skill_id version body reason restored_from_version create_time supersede_time current",
        change=_CHANGE[v.change],
    )


def _health_fields(h: LearningHealth) -> dict[str, Any]:
    return pb_fields(
        pb.LearningHealth,
        h,
        "company seat total_skills skills_used_at_least_once total_skill_uses avg_uses_per_skill avg_skill_age_days"
        " active_skills stale_skills archived_skills",
        most_recent_skill_use_time=h.most_recent_skill_use,
    )


_P_STATE = enum_to_pb(ProposalState, pb.ProposalState, "PROPOSAL_STATE")
_P_STATE_FROM_PB = {v: k for k, v in _P_STATE.items()}
_ORIGIN = enum_to_pb(ProposalOrigin, pb.ProposalOrigin, "PROPOSAL_ORIGIN")
_ORIGIN_FROM_PB = {v: k for k, v in _ORIGIN.items()}
_DISPOSITION = enum_to_pb(ProposalDisposition, pb.ProposalDisposition, "PROPOSAL_DISPOSITION")
_CHECK = enum_to_pb(DuplicateCheck, pb.DuplicateCheck, "DUPLICATE_CHECK")


def _proposal_fields(p: SkillProposal) -> dict[str, Any]:
    return pb_fields(
        pb.SkillProposal,
        p,
        "id company seat name summary body tool_sequence create_time decide_time decided_by decision_reason skill_id"
        " provenance",
        origin=_ORIGIN[p.origin],
        source=pb_fields(pb.ProposalSource, p, "session_id check_id evidence_ids turn_id"),
        state=_P_STATE[p.state],
    )


def _match_fields(m: ProposalMatch) -> dict[str, Any]:
    return pb_fields(pb.ProposalMatch, m, "skill_id proposal_id name similarity", check=_CHECK[m.check])


class _NamesOneSkill(Protocol):
    """Every request that acts on one skill: the seat, and the skill by id or by name."""

    @property
    def company(self) -> str: ...
    @property
    def seat(self) -> str: ...
    @property
    def skill_id(self) -> str: ...
    @property
    def skill_name(self) -> str: ...


def _drafted(request: pb.CreateSkillRequest | pb.ProposeSkillRequest) -> dict[str, Any]:
    """The skill a create or a proposal drafts, as the use cases take it: name, summary, body, tools."""
    return {
        "name": request.name,
        "summary": request.summary,
        "body": request.body,
        "tool_sequence": tuple(request.tool_sequence),
    }


def _provenance(
    request: pb.CreateSkillRequest | pb.RefineSkillRequest | pb.AppendSkillObservationRequest | pb.ProposeSkillRequest,
) -> Provenance | None:
    """The request's provenance (issue 17), None when it sent none."""
    return request.provenance if request.HasField("provenance") else None


class SkillServicer(ErasureRpcs, pb_grpc.SkillServiceServicer):
    def __init__(self, service: SkillService, proposals: ProposalService | None, pool: asyncpg.Pool):
        """``pool``: the erasure and provenance RPCs read and erase across the skills' tables in one
        transaction of their own, beside the use cases' store port."""
        self._service = service
        self._proposals = proposals
        self._pool = pool
        self._erasure_calls = pool_erasure(_erasure, lambda: pool, service, domain=_ERASURE_DOMAIN, pb=pb)

    def _now(self) -> datetime:
        return self._service.clock.now()

    def _key(self, request: _NamesOneSkill) -> SkillKey:
        return self._service.key(request.company, request.seat, request.skill_id, request.skill_name)

    async def CheckSkillCandidate(
        self, request: pb.CheckSkillCandidateRequest, context: ServicerContext
    ) -> pb.CheckSkillCandidateResponse:
        verdict = await self._service.check_candidate(request.company, request.seat, list(request.tool_set))
        duplicate = None
        if verdict.duplicate is not None:  # built in place by the response, not built and copied in
            dup, sim = verdict.duplicate
            duplicate = {"id": str(dup.id), "name": dup.name, "similarity": sim, "state": _STATE[dup.state]}
        return pb.CheckSkillCandidateResponse(
            gate=_GATE[verdict.gate],
            live_skill_count=verdict.live_count,
            max_skills=verdict.max_skills,
            duplicate_threshold=verdict.threshold,
            duplicate=duplicate,
        )

    async def CreateSkill(self, request: pb.CreateSkillRequest, context: ServicerContext) -> pb.CreateSkillResponse:
        draft = SkillDraft(
            **_drafted(request),
            trigger=_TRIGGER_FROM_PB[request.trigger],  # required and defined: the contract's
            cluster_size=request.cluster_size,
            source_turn_ids=tuple(request.source_turn_ids),
        )
        skill = await self._service.create(
            request.company, request.seat, draft, archived_are_learned=True, provenance=_provenance(request)
        )
        return pb.CreateSkillResponse(skill=_skill_fields(skill, self._now()))

    async def ListSkills(self, request: pb.ListSkillsRequest, context: ServicerContext) -> pb.ListSkillsResponse:
        skills, token, total = await self._service.list_skills(
            request.company, request.seat, request.page_size, request.page_token, request.include_archived
        )
        now, full = self._now(), request.view == pb.SKILL_VIEW_FULL
        return pb.ListSkillsResponse(
            skills=[_skill_fields(s, now, full=full) for s in skills], next_page_token=token, total_size=total
        )

    async def GetSkill(self, request: pb.GetSkillRequest, context: ServicerContext) -> pb.GetSkillResponse:
        skill = await self._service.get(self._key(request))
        return pb.GetSkillResponse(skill=_skill_fields(skill, self._now()))

    async def UseSkill(self, request: pb.UseSkillRequest, context: ServicerContext) -> pb.UseSkillResponse:
        result = await self._service.use(self._key(request), request.turn_id, request.request_id)
        return pb.UseSkillResponse(
            skill=_skill_fields(result.skill, self._now()),
            revived=result.revived,
            telemetry_write_failed=result.telemetry_write_failed,
            already_applied=result.already_applied,
        )

    async def MarkSkillsOffered(
        self, request: pb.MarkSkillsOfferedRequest, context: ServicerContext
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
        self, request: pb.MarkSkillsUsedRequest, context: ServicerContext
    ) -> pb.MarkSkillsUsedResponse:
        marked, revived, already = await self._service.mark_used(
            request.company, request.seat, list(request.skill_ids), request.turn_id, request.request_id
        )
        return pb.MarkSkillsUsedResponse(marked_count=marked, revived_skill_names=revived, already_applied=already)

    async def RefineSkill(self, request: pb.RefineSkillRequest, context: ServicerContext) -> pb.RefineSkillResponse:
        skill = await self._service.refine(
            self._key(request),
            request.body,
            request.reason,
            request.turn_id,
            request.request_id,
            _provenance(request),
        )
        return pb.RefineSkillResponse(skill=_skill_fields(skill, self._now()))

    async def AppendSkillObservation(
        self, request: pb.AppendSkillObservationRequest, context: ServicerContext
    ) -> pb.AppendSkillObservationResponse:
        result = await self._service.append_observation(
            self._key(request),
            _KIND_FROM_PB[request.kind],  # required and defined: the contract's
            request.observation,
            request.turn_id,
            request.request_id,
            _provenance(request),
        )
        return pb.AppendSkillObservationResponse(
            skill=_skill_fields(result.skill, self._now()),
            skipped=result.skipped_reason is not None,
            skip_reason=(
                _SKIP[result.skipped_reason]
                if result.skipped_reason is not None
                else pb.OBSERVATION_SKIP_REASON_UNSPECIFIED
            ),
        )

    async def ListSkillVersions(
        self, request: pb.ListSkillVersionsRequest, context: ServicerContext
    ) -> pb.ListSkillVersionsResponse:
        versions, token, total = await self._service.list_versions(
            self._key(request), request.page_size, request.page_token
        )
        return pb.ListSkillVersionsResponse(
            versions=[_version_fields(v) for v in versions], next_page_token=token, total_size=total
        )

    async def RollbackSkill(
        self, request: pb.RollbackSkillRequest, context: ServicerContext
    ) -> pb.RollbackSkillResponse:
        skill = await self._service.rollback(self._key(request), request.version, request.request_id)
        return pb.RollbackSkillResponse(skill=_skill_fields(skill, self._now()))

    async def PinSkill(self, request: pb.PinSkillRequest, context: ServicerContext) -> pb.PinSkillResponse:
        skill = await self._service.set_pinned(self._key(request), True)
        return pb.PinSkillResponse(skill=_skill_fields(skill, self._now(), full=False))

    async def UnpinSkill(self, request: pb.UnpinSkillRequest, context: ServicerContext) -> pb.UnpinSkillResponse:
        skill = await self._service.set_pinned(self._key(request), False)
        return pb.UnpinSkillResponse(skill=_skill_fields(skill, self._now(), full=False))

    async def ArchiveSkill(self, request: pb.ArchiveSkillRequest, context: ServicerContext) -> pb.ArchiveSkillResponse:
        skill = await self._service.archive(self._key(request))
        return pb.ArchiveSkillResponse(skill=_skill_fields(skill, self._now(), full=False))

    async def RestoreSkill(self, request: pb.RestoreSkillRequest, context: ServicerContext) -> pb.RestoreSkillResponse:
        skill = await self._service.restore(self._key(request))
        return pb.RestoreSkillResponse(skill=_skill_fields(skill, self._now(), full=False))

    async def GetLearningHealth(
        self, request: pb.GetLearningHealthRequest, context: ServicerContext
    ) -> pb.GetLearningHealthResponse:
        health = await self._service.health(request.company, request.seat)
        return pb.GetLearningHealthResponse(
            health=_health_fields(health),
            berlot_attwell_threshold=BERLOT_ATTWELL_THRESHOLD,
            below_berlot_attwell_threshold=health.below_threshold,
        )

    # ------------------------------------------------------------------ proposals

    def _props(self) -> ProposalService:
        if self._proposals is None:
            raise NotImplementedError("skill proposals are not wired in this process")
        return self._proposals

    async def ProposeSkill(self, request: pb.ProposeSkillRequest, context: ServicerContext) -> pb.ProposeSkillResponse:
        result = await self._props().propose(
            request.company,
            request.seat,
            **_drafted(request),
            origin=_ORIGIN_FROM_PB[request.origin],  # required and defined: the contract's
            session_id=request.source.session_id,
            check_id=request.source.check_id,
            evidence_ids=list(request.source.evidence_ids),
            turn_id=request.source.turn_id,
            request_id=request.request_id,
            provenance=_provenance(request),
        )
        return pb.ProposeSkillResponse(
            disposition=_DISPOSITION[result.disposition],
            proposal=_proposal_fields(result.proposal) if result.proposal else None,
            match=_match_fields(result.match) if result.match else None,
            checks_run=[_CHECK[c] for c in result.checks_run],
        )

    async def ListSkillProposals(
        self, request: pb.ListSkillProposalsRequest, context: ServicerContext
    ) -> pb.ListSkillProposalsResponse:
        found, token = await self._props().list(
            request.company, request.seat, _P_STATE_FROM_PB.get(request.state), request.page_size, request.page_token
        )
        return pb.ListSkillProposalsResponse(proposals=[_proposal_fields(p) for p in found], next_page_token=token)

    async def ApproveSkillProposal(
        self, request: pb.ApproveSkillProposalRequest, context: ServicerContext
    ) -> pb.ApproveSkillProposalResponse:
        proposal, skill = await self._props().approve(
            request.company, request.seat, request.proposal_id, request.reviewer, request.reason
        )
        return pb.ApproveSkillProposalResponse(
            proposal=_proposal_fields(proposal), skill=_skill_fields(skill, self._now())
        )

    async def RejectSkillProposal(
        self, request: pb.RejectSkillProposalRequest, context: ServicerContext
    ) -> pb.RejectSkillProposalResponse:
        proposal = await self._props().reject(
            request.company, request.seat, request.proposal_id, request.reviewer, request.reason
        )
        return pb.RejectSkillProposalResponse(proposal=_proposal_fields(proposal))

    # ------------------------------------------------------------------ erasure (issue 17)

    async def GetSkillProvenance(
        self, request: pb.GetSkillProvenanceRequest, context: ServicerContext
    ) -> pb.GetSkillProvenanceResponse:
        return await _erasure.provenance(self._pool, request.company, request.seat, request.skill_id)
