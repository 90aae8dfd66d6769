"""SessionService over gRPC: protobuf in, domain calls, protobuf out. No rules live here."""

from __future__ import annotations

from datetime import UTC
from typing import Protocol

import asyncpg

from agentlearn.sessions.v1 import session_service_pb2 as pb
from agentlearn.sessions.v1 import session_service_pb2_grpc as pb_grpc
from libs.common import outcomes
from libs.common.enum_maps import enum_to_pb
from libs.common.erasure_rpcs import ErasureRpcs, pool_erasure
from libs.common.errors import InvalidArgument
from libs.common.field_copy import enum_from_pb, to_pb
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

_KIND = enum_from_pb(EventKind, pb.EventKind, "EVENT_KIND")
_STATUS = enum_from_pb(EventStatus, pb.EventStatus, "EVENT_STATUS")
_TURN = outcomes.PROTO_VALUES["sessions"]
_STEP = enum_from_pb(StepStatus, pb.StepStatus, "STEP_STATUS")
_TRIGGER = enum_to_pb(CheckTrigger, pb.CheckTrigger, "CHECK_TRIGGER")
_STATE = enum_to_pb(CheckState, pb.CheckState, "CHECK_STATE")
_OUTCOME: dict[CheckOutcome | None, pb.CheckOutcome] = {None: pb.CHECK_OUTCOME_UNSPECIFIED}
_OUTCOME.update(enum_to_pb(CheckOutcome, pb.CheckOutcome, "CHECK_OUTCOME").items())
_OUTPUT = enum_to_pb(OutputKind, pb.OutputKind, "OUTPUT_KIND")
_DISPOSITION = enum_to_pb(Disposition, pb.OutputDisposition, "OUTPUT_DISPOSITION")
_FAILURE = enum_to_pb(FailureKind, pb.FailureKind, "FAILURE_KIND")


def check_to_pb(check: LearningCheck) -> pb.LearningCheck:
    """A receipt as the contract carries it: ids, reasons, counts — never evidence."""
    return to_pb(
        pb.LearningCheck,
        check,
        "company session_id workspace seat plan_revision turn_id trigger_event_id reason create_time start_time"
        " finish_time",
        check_id=check.id,
        user=check.owner,
        trigger=_TRIGGER[check.trigger],
        state=_STATE[check.state],
        outcome=_OUTCOME[check.outcome],
        outputs=[
            to_pb(
                pb.LearningOutput, o, "id evidence_ids", kind=_OUTPUT[o.kind], disposition=_DISPOSITION[o.disposition]
            )
            for o in check.outputs
        ],
        dropped=[to_pb(pb.DroppedCandidate, d, "reason evidence_ids", kind=_OUTPUT[d.kind]) for d in check.dropped],
        partial_failures=[
            to_pb(pb.PartialFailure, p, "output_id detail", kind=_OUTPUT[p.kind], failure=_FAILURE[p.failure])
            for p in check.partial_failures
        ],
        counts=pb.LearningCounts(**check.counts()),
        evidence=pb.EvidenceSummary(**check.evidence),
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


class _NamesASession(Protocol):
    """Every request that acts on one session: its company, its id, and the user who owns it."""

    @property
    def company(self) -> str: ...
    @property
    def session_id(self) -> str: ...
    @property
    def user(self) -> str: ...


def _session(request: _NamesASession) -> tuple[str, str, str]:
    """The session a request names, as the use cases take it: company, session id, user."""
    return request.company, request.session_id, request.user


class SessionServicer(ErasureRpcs, pb_grpc.SessionServiceServicer):
    def __init__(self, service: SessionService, pool: asyncpg.Pool):
        self._service = service
        # erasure reads and deletes the service's tables directly
        self._erasure_calls = pool_erasure(_erasure, lambda: pool, service, domain=_ERASURE_DOMAIN, pb=pb)

    async def AppendSessionEvents(
        self, request: pb.AppendSessionEventsRequest, context: ServicerContext
    ) -> pb.AppendSessionEventsResponse:
        result = await self._service.append_events(
            *_session(request),
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
            *_session(request),
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
        check, reused = await self._service.check_recent_work(*_session(request))
        return pb.CheckRecentWorkResponse(check=check_to_pb(check), reused=reused)

    async def ListLearningChecks(
        self, request: pb.ListLearningChecksRequest, context: ServicerContext
    ) -> pb.ListLearningChecksResponse:
        checks, token = await self._service.list_checks(*_session(request), request.page_size, request.page_token)
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

    async def GetLessonProvenance(
        self, request: pb.GetLessonProvenanceRequest, context: ServicerContext
    ) -> pb.GetLessonProvenanceResponse:
        workspace, title, sources = await lesson_provenance(self._service.store, request.company, request.page_id)
        return pb.GetLessonProvenanceResponse(workspace=workspace, title=title, sources=sources)
