"""SessionService over gRPC: protobuf in, domain calls, protobuf out. No rules live here."""

from __future__ import annotations

from datetime import UTC

import asyncpg

from agentlearn.sessions.v1 import session_service_pb2 as pb
from agentlearn.sessions.v1 import session_service_pb2_grpc as pb_grpc
from libs.common import outcomes
from libs.common.erasure import report_to_proto as erasure_report
from libs.common.erasure import target_from_proto as erasure_target
from libs.common.errors import InvalidArgument
from libs.common.protoconv import timestamp, when
from libs.common.rpctypes import ServicerContext
from services.sessions import erasure as _erasure
from services.sessions.domain import (
    DOMAIN,
    CheckOutcome,
    CheckState,
    CheckTrigger,
    Disposition,
    Event,
    EventKind,
    EventStatus,
    FailureKind,
    LearningCheck,
    OutputKind,
    PlanStep,
    StepStatus,
)
from services.sessions.domain import DOMAIN as _ERASURE_DOMAIN
from services.sessions.service import SessionService
from services.sessions.writes import lesson_provenance

__all__ = ["SessionServicer", "check_to_pb"]

_KIND = {
    pb.EVENT_KIND_USER_MESSAGE: EventKind.USER_MESSAGE,
    pb.EVENT_KIND_ASSISTANT_MESSAGE: EventKind.ASSISTANT_MESSAGE,
    pb.EVENT_KIND_TOOL_REQUEST: EventKind.TOOL_REQUEST,
    pb.EVENT_KIND_TOOL_RESULT: EventKind.TOOL_RESULT,
    pb.EVENT_KIND_VERIFICATION: EventKind.VERIFICATION,
    pb.EVENT_KIND_TURN_END: EventKind.TURN_END,
}
_STATUS = {
    pb.EVENT_STATUS_UNSPECIFIED: EventStatus.UNSPECIFIED,
    pb.EVENT_STATUS_SUCCEEDED: EventStatus.SUCCEEDED,
    pb.EVENT_STATUS_FAILED: EventStatus.FAILED,
}
_TURN = outcomes.PROTO_VALUES["sessions"]
_STEP = {
    pb.STEP_STATUS_PROPOSED: StepStatus.PROPOSED,
    pb.STEP_STATUS_PENDING: StepStatus.PENDING,
    pb.STEP_STATUS_IN_PROGRESS: StepStatus.IN_PROGRESS,
    pb.STEP_STATUS_DONE: StepStatus.DONE,
    pb.STEP_STATUS_SKIPPED: StepStatus.SKIPPED,
}
_TRIGGER = {
    CheckTrigger.PLAN_STEPS_DONE: pb.CHECK_TRIGGER_PLAN_STEPS_DONE,
    CheckTrigger.PLAN_COMPLETED: pb.CHECK_TRIGGER_PLAN_COMPLETED,
    CheckTrigger.SUBSTANTIAL_TURN: pb.CHECK_TRIGGER_SUBSTANTIAL_TURN,
    CheckTrigger.MANUAL: pb.CHECK_TRIGGER_MANUAL,
}
_STATE = {
    CheckState.QUEUED: pb.CHECK_STATE_QUEUED,
    CheckState.RUNNING: pb.CHECK_STATE_RUNNING,
    CheckState.COMPLETED: pb.CHECK_STATE_COMPLETED,
    CheckState.FAILED: pb.CHECK_STATE_FAILED,
    CheckState.INTERRUPTED: pb.CHECK_STATE_INTERRUPTED,
}
_OUTCOME = {
    None: pb.CHECK_OUTCOME_UNSPECIFIED,
    CheckOutcome.COMPLETED: pb.CHECK_OUTCOME_COMPLETED,
    CheckOutcome.COMPLETED_EMPTY: pb.CHECK_OUTCOME_COMPLETED_EMPTY,
    CheckOutcome.MODEL_ERROR: pb.CHECK_OUTCOME_MODEL_ERROR,
    CheckOutcome.INVALID_OUTPUT: pb.CHECK_OUTCOME_INVALID_OUTPUT,
    CheckOutcome.TRUNCATED_OUTPUT: pb.CHECK_OUTCOME_TRUNCATED_OUTPUT,
    CheckOutcome.MISSING_EVIDENCE: pb.CHECK_OUTCOME_MISSING_EVIDENCE,
    CheckOutcome.WRITE_FAILED: pb.CHECK_OUTCOME_WRITE_FAILED,
    CheckOutcome.PERMISSION_REFUSED: pb.CHECK_OUTCOME_PERMISSION_REFUSED,
    CheckOutcome.INTERRUPTED: pb.CHECK_OUTCOME_INTERRUPTED,
}
_OUTPUT = {
    OutputKind.PROJECT_LESSON: pb.OUTPUT_KIND_PROJECT_LESSON,
    OutputKind.PERSONAL_FACT: pb.OUTPUT_KIND_PERSONAL_FACT,
    OutputKind.SKILL_PROPOSAL: pb.OUTPUT_KIND_SKILL_PROPOSAL,
}
_DISPOSITION = {Disposition.WRITTEN: pb.OUTPUT_DISPOSITION_WRITTEN, Disposition.REUSED: pb.OUTPUT_DISPOSITION_REUSED}
_FAILURE = {
    FailureKind.WRITE_FAILED: pb.FAILURE_KIND_WRITE_FAILED,
    FailureKind.PERMISSION_REFUSED: pb.FAILURE_KIND_PERMISSION_REFUSED,
    FailureKind.NOT_INDEXED: pb.FAILURE_KIND_NOT_INDEXED,
}


def check_to_pb(check: LearningCheck) -> pb.LearningCheck:
    """A receipt as the contract carries it: ids, reasons, counts — never evidence."""
    return pb.LearningCheck(
        check_id=str(check.id),
        company=check.company,
        session_id=check.session_id,
        user=check.owner,
        workspace=check.workspace,
        seat=check.seat,
        trigger=_TRIGGER[check.trigger],
        plan_revision=check.plan_revision,
        turn_id=check.turn_id,
        trigger_event_id=check.trigger_event_id,
        state=_STATE[check.state],
        outcome=_OUTCOME[check.outcome],
        reason=check.reason,
        outputs=[
            pb.LearningOutput(
                kind=_OUTPUT[o.kind],
                id=o.id,
                disposition=_DISPOSITION[o.disposition],
                evidence_ids=list(o.evidence_ids),
            )
            for o in check.outputs
        ],
        dropped=[
            pb.DroppedCandidate(kind=_OUTPUT[d.kind], reason=d.reason, evidence_ids=list(d.evidence_ids))
            for d in check.dropped
        ],
        partial_failures=[
            pb.PartialFailure(kind=_OUTPUT[p.kind], failure=_FAILURE[p.failure], output_id=p.output_id, detail=p.detail)
            for p in check.partial_failures
        ],
        counts=pb.LearningCounts(**check.counts()),
        evidence=pb.EvidenceSummary(**check.evidence),
        create_time=timestamp(check.create_time),
        start_time=timestamp(check.start_time),
        finish_time=timestamp(check.finish_time),
    )


def _event(i: int, e: pb.SessionEvent) -> Event:
    where = f"events[{i}]"
    if e.kind not in _KIND:
        raise InvalidArgument(
            f"{where}.kind must be one of the EVENT_KIND values",
            reason="FIELD_REQUIRED",
            domain=DOMAIN,
            field=f"{where}.kind",
        )
    if not e.HasField("event_time"):
        raise InvalidArgument(
            f"{where}.event_time is required", reason="FIELD_REQUIRED", domain=DOMAIN, field=f"{where}.event_time"
        )
    for name, table in (("status", _STATUS), ("turn_outcome", _TURN)):
        if getattr(e, name) not in table:
            raise InvalidArgument(
                f"{where}.{name} {getattr(e, name)} is not a known value",
                reason="FIELD_INVALID",
                domain=DOMAIN,
                field=f"{where}.{name}",
            )
    return Event(
        event_id=e.event_id,
        kind=_KIND[e.kind],
        text=e.text,
        event_time=e.event_time.ToDatetime(tzinfo=UTC),  # present: checked above
        turn_id=e.turn_id,
        tool_name=e.tool_name,
        source=e.source,
        status=_STATUS[e.status],
        turn_outcome=_TURN[e.turn_outcome],
        remember=e.remember,
    )


def _step(i: int, s: pb.PlanStep) -> PlanStep:
    if s.status not in _STEP:
        raise InvalidArgument(
            f"steps[{i}].status must be one of the STEP_STATUS values",
            reason="FIELD_REQUIRED" if s.status == pb.STEP_STATUS_UNSPECIFIED else "FIELD_INVALID",
            domain=DOMAIN,
            field=f"steps[{i}].status",
        )
    return PlanStep(s.id, s.title, _STEP[s.status])


class SessionServicer(pb_grpc.SessionServiceServicer):
    def __init__(self, service: SessionService, pool: asyncpg.Pool):
        self._service = service
        self._pool = pool  # erasure reads and deletes the service's tables directly

    async def AppendSessionEvents(
        self, request: pb.AppendSessionEventsRequest, context: ServicerContext
    ) -> pb.AppendSessionEventsResponse:
        result = await self._service.append_events(
            request.company,
            request.session_id,
            request.user,
            request.workspace,
            request.seat,
            request.role,
            [_event(i, e) for i, e in enumerate(request.events)],
        )
        return pb.AppendSessionEventsResponse(
            appended_count=result.appended,
            duplicate_count=result.duplicates,
            workspace=result.workspace,
            queued_checks=[check_to_pb(c) for c in result.queued],
        )

    async def SavePlan(self, request: pb.SavePlanRequest, context: ServicerContext) -> pb.SavePlanResponse:
        result = await self._service.save_plan(
            request.company,
            request.session_id,
            request.user,
            request.revision,
            [_step(i, s) for i, s in enumerate(request.steps)],
        )
        return pb.SavePlanResponse(
            revision=result.revision,
            newly_done_step_ids=list(result.newly_done),
            plan_complete=result.complete,
            queued_check=check_to_pb(result.check) if result.check else None,
            already_saved=result.already_saved,
        )

    async def CheckRecentWork(
        self, request: pb.CheckRecentWorkRequest, context: ServicerContext
    ) -> pb.CheckRecentWorkResponse:
        check, reused = await self._service.check_recent_work(request.company, request.session_id, request.user)
        return pb.CheckRecentWorkResponse(check=check_to_pb(check), reused=reused)

    async def ListLearningChecks(
        self, request: pb.ListLearningChecksRequest, context: ServicerContext
    ) -> pb.ListLearningChecksResponse:
        checks, token = await self._service.list_checks(
            request.company, request.session_id, request.user, request.page_size, request.page_token
        )
        return pb.ListLearningChecksResponse(checks=[check_to_pb(c) for c in checks], next_page_token=token)

    async def ListSessions(self, request: pb.ListSessionsRequest, context: ServicerContext) -> pb.ListSessionsResponse:
        rows, token = await self._service.list_sessions(
            request.company, request.seat, request.user, request.query, request.page_size, request.page_token
        )
        return pb.ListSessionsResponse(
            sessions=[
                pb.SessionSummary(
                    company=r.session.company,
                    session_id=r.session.session_id,
                    user=r.session.owner,
                    workspace=r.session.workspace,
                    seat=r.session.seat,
                    role=r.session.role,
                    event_count=r.session.last_seq,
                    plan_revision=r.session.plan_revision,
                    check_count=r.check_count,
                    last_check_state=_STATE[r.last_check_state] if r.last_check_state else pb.CHECK_STATE_UNSPECIFIED,
                    last_check_outcome=_OUTCOME[r.last_check_outcome],
                    create_time=timestamp(r.session.create_time),
                    update_time=timestamp(r.update_time),
                )
                for r in rows
            ],
            next_page_token=token,
        )

    async def GetAwayDigest(
        self, request: pb.GetAwayDigestRequest, context: ServicerContext
    ) -> pb.GetAwayDigestResponse:
        digest = await self._service.away_digest(
            request.company, request.user, when(request, "since_time"), request.page_size, request.page_token
        )
        return pb.GetAwayDigestResponse(
            checks=[check_to_pb(c) for c in digest.checks],
            next_page_token=digest.next_page_token,
            completed_count=digest.completed,
            failed_count=digest.failed,
            interrupted_count=digest.interrupted,
        )

    # ------------------------------------------------------------------ erasure (issue 17)

    async def EraseRows(self, request: pb.EraseRowsRequest, context: ServicerContext) -> pb.EraseRowsResponse:
        target = erasure_target(request.target, domain=_ERASURE_DOMAIN)
        report = await _erasure.erase(self._pool, target, self._service.clock.now())
        return pb.EraseRowsResponse(report=erasure_report(report))

    async def GetLessonProvenance(
        self, request: pb.GetLessonProvenanceRequest, context: ServicerContext
    ) -> pb.GetLessonProvenanceResponse:
        workspace, title, sources = await lesson_provenance(self._service.store, request.company, request.page_id)
        return pb.GetLessonProvenanceResponse(workspace=workspace, title=title, sources=sources)

    async def FindRows(self, request: pb.FindRowsRequest, context: ServicerContext) -> pb.FindRowsResponse:
        target = erasure_target(request.target, domain=_ERASURE_DOMAIN)
        return pb.FindRowsResponse(report=erasure_report(await _erasure.find(self._pool, target)))
