"""The sessions' domain: sessions, events, plan revisions, learning checks and their receipts, and
the trigger rules (pure functions: they read what is recorded and say what to queue).

Spec: spec/session-learning.txt ("Triggers", "Evidence and cost", "Visibility").
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from libs.common.outcomes import TurnOutcome

__all__ = [
    "CLAIM_LABELS",
    "DOMAIN",
    "JOB_KIND",
    "SUPPORT_LABELS",
    "CheckOutcome",
    "CheckState",
    "CheckTrigger",
    "Disposition",
    "Dropped",
    "Event",
    "EventKind",
    "EventStatus",
    "FailureKind",
    "LearningCheck",
    "NewCheck",
    "Output",
    "OutputKind",
    "PartialFailure",
    "PlanStep",
    "PlanTrigger",
    "Session",
    "SessionFilter",
    "StepStatus",
    "TurnOutcome",
    "TurnWindow",
    "plan_complete",
    "plan_trigger",
    "substantial",
]

DOMAIN = "sessions.agentlearn.dev"
JOB_KIND = "learning"
"""The kind of the session learning checks' jobs in the shared ``background_jobs`` queue."""

MAX_EVENTS_PER_CALL = 500
MAX_EVENT_TEXT_CHARS = 100_000
MAX_PLAN_STEPS = 200
MAX_STEP_TITLE_CHARS = 2000
MAX_ID_CHARS = 200


class EventKind(StrEnum):
    USER_MESSAGE = "user_message"
    ASSISTANT_MESSAGE = "assistant_message"
    TOOL_REQUEST = "tool_request"
    TOOL_RESULT = "tool_result"
    VERIFICATION = "verification"
    TURN_END = "turn_end"


CHAT_KINDS = (EventKind.USER_MESSAGE, EventKind.ASSISTANT_MESSAGE)
EXECUTION_KINDS = (EventKind.TOOL_REQUEST, EventKind.TOOL_RESULT)
VERIFICATION_KINDS = (EventKind.VERIFICATION,)

SUPPORT_LABELS = frozenset({"user_message", "tool_result", "verification"})
"""Evidence that can support a candidate: what a person said, what a tool returned, what a
verification recorded."""
CLAIM_LABELS = frozenset({"assistant_claim", "tool_request", "plan_claim"})
"""Evidence that is a claim (what the assistant said it did or meant to do, what the plan says is
done): labelled apart, and never enough alone for a project lesson or a skill."""


class EventStatus(StrEnum):
    UNSPECIFIED = "unspecified"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class StepStatus(StrEnum):
    PROPOSED = "proposed"
    PENDING = "pending"
    IN_PROGRESS = "in_progress"
    DONE = "done"
    SKIPPED = "skipped"


class CheckTrigger(StrEnum):
    PLAN_STEPS_DONE = "plan_steps_done"
    PLAN_COMPLETED = "plan_completed"
    SUBSTANTIAL_TURN = "substantial_turn"
    MANUAL = "manual"


class CheckState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    INTERRUPTED = "interrupted"

    @property
    def active(self) -> bool:
        return self in (CheckState.QUEUED, CheckState.RUNNING)


class CheckOutcome(StrEnum):
    COMPLETED = "completed"
    COMPLETED_EMPTY = "completed_empty"
    MODEL_ERROR = "model_error"
    INVALID_OUTPUT = "invalid_output"
    TRUNCATED_OUTPUT = "truncated_output"
    MISSING_EVIDENCE = "missing_evidence"
    WRITE_FAILED = "write_failed"
    PERMISSION_REFUSED = "permission_refused"
    INTERRUPTED = "interrupted"

    @property
    def state(self) -> CheckState:
        """The state a check ending so is in."""
        if self in (CheckOutcome.COMPLETED, CheckOutcome.COMPLETED_EMPTY):
            return CheckState.COMPLETED
        if self is CheckOutcome.INTERRUPTED:
            return CheckState.INTERRUPTED
        return CheckState.FAILED


class OutputKind(StrEnum):
    PROJECT_LESSON = "project_lesson"
    PERSONAL_FACT = "personal_fact"
    SKILL_PROPOSAL = "skill_proposal"


class Disposition(StrEnum):
    WRITTEN = "written"
    REUSED = "reused"


class FailureKind(StrEnum):
    WRITE_FAILED = "write_failed"
    PERMISSION_REFUSED = "permission_refused"
    NOT_INDEXED = "not_indexed"
    NOT_DEDUPLICATED = "not_deduplicated"
    MODEL_ERROR = "model_error"
    """The memory judge (a model call the personal facts' writes need) got no answer."""
    INVALID_OUTPUT = "invalid_output"
    """The memory judge answered nothing usable."""


# ------------------------------------------------------------------------------------- records


@dataclass(frozen=True)
class Session:
    company: str
    session_id: str
    owner: str
    workspace: str
    seat: str
    role: str
    last_seq: int
    plan_revision: int
    create_time: datetime


@dataclass(frozen=True)
class SessionFilter:
    """Which of a company's sessions a listing shows: one seat's, one owner's (None: any), those
    whose id contains ``query``."""

    company: str
    seat: str | None
    owner: str | None
    query: str


@dataclass(frozen=True)
class SessionSummary:
    """A session as ListSessions lists it: the session, when it last recorded anything, and its
    checks by count and newest state (never an event's text)."""

    session: Session
    update_time: datetime
    check_count: int
    last_check_state: CheckState | None
    last_check_outcome: CheckOutcome | None


@dataclass(frozen=True)
class Event:
    """One recorded event. ``seq`` orders a session's events as they were recorded (1, 2, ...)."""

    event_id: str
    kind: EventKind
    text: str
    event_time: datetime
    turn_id: str = ""
    tool_name: str = ""
    source: str = ""
    status: EventStatus = EventStatus.UNSPECIFIED
    turn_outcome: TurnOutcome = TurnOutcome.UNSPECIFIED
    remember: bool = False
    seq: int = 0


@dataclass(frozen=True)
class PlanStep:
    id: str
    title: str
    status: StepStatus


@dataclass(frozen=True)
class Output:
    kind: OutputKind
    id: str
    disposition: Disposition
    evidence_ids: tuple[str, ...] = ()


@dataclass(frozen=True)
class Dropped:
    kind: OutputKind
    reason: str
    evidence_ids: tuple[str, ...] = ()


@dataclass(frozen=True)
class PartialFailure:
    kind: OutputKind
    failure: FailureKind
    detail: str
    output_id: str = ""


@dataclass(frozen=True)
class NewCheck:
    """What a check is queued with; the session's own fields (owner, workspace, seat, role) come
    from the transaction that queues it."""

    id: uuid.UUID
    trigger: CheckTrigger
    plan_revision: int
    turn_id: str
    trigger_seq: int
    job_key: str
    newly_done: tuple[str, ...] = ()


@dataclass
class LearningCheck:
    """The receipt of one check. Never holds raw evidence: counts, ids and reasons only."""

    id: uuid.UUID
    company: str
    session_id: str
    owner: str
    workspace: str
    seat: str
    role: str
    trigger: CheckTrigger
    plan_revision: int
    turn_id: str
    trigger_seq: int
    trigger_event_id: str
    job_key: str
    state: CheckState
    create_time: datetime
    outcome: CheckOutcome | None = None
    reason: str = ""
    newly_done: tuple[str, ...] = ()
    outputs: list[Output] = field(default_factory=list)
    dropped: list[Dropped] = field(default_factory=list)
    partial_failures: list[PartialFailure] = field(default_factory=list)
    evidence: dict[str, int] = field(default_factory=dict)
    start_time: datetime | None = None
    finish_time: datetime | None = None

    def event_fields(self) -> dict[str, Any]:
        """What every event about this check names (queued, completed): whose, which turn, which
        check of which session, and why it ran."""
        return {
            "company": self.company,
            "seat": self.seat,
            "turn_id": self.turn_id or None,
            "check_id": str(self.id),
            "session_id": self.session_id,
            "trigger": str(self.trigger),
        }

    def counts(self) -> dict[str, int]:
        def n(kind: OutputKind, disp: Disposition) -> int:
            return sum(1 for o in self.outputs if o.kind is kind and o.disposition is disp)

        return {
            "lessons_written": n(OutputKind.PROJECT_LESSON, Disposition.WRITTEN),
            "lessons_reused": n(OutputKind.PROJECT_LESSON, Disposition.REUSED),
            "facts_written": n(OutputKind.PERSONAL_FACT, Disposition.WRITTEN),
            "facts_reused": n(OutputKind.PERSONAL_FACT, Disposition.REUSED),
            "proposals_created": n(OutputKind.SKILL_PROPOSAL, Disposition.WRITTEN),
            "candidates_dropped": len(self.dropped),
        }


# ------------------------------------------------------------------------------------- triggers


def plan_complete(steps: Sequence[PlanStep]) -> bool:
    """All steps done or skipped, with at least one done (spec "Full execution-plan completion")."""
    return (
        bool(steps)
        and all(s.status in (StepStatus.DONE, StepStatus.SKIPPED) for s in steps)
        and any(s.status is StepStatus.DONE for s in steps)
    )


@dataclass(frozen=True)
class PlanTrigger:
    trigger: CheckTrigger | None
    newly_done: tuple[str, ...]
    complete: bool


def plan_trigger(previous: Sequence[PlanStep], current: Sequence[PlanStep]) -> PlanTrigger:
    """What a new revision queues, against the revision before it.

    - Steps newly done (done now, not done in the previous revision): ONE check for the revision,
      however many finished together.
    - The plan newly complete: the completion check, which replaces the final step's check (never
      a second one in the same revision). A plan completed by skipping its last open step is newly
      complete too: that is the milestone, with no step check to replace.
    - Anything else (proposed steps, a status repeated, a step moved back) queues nothing.
    """
    was_done = {s.id for s in previous if s.status is StepStatus.DONE}
    newly = tuple(s.id for s in current if s.status is StepStatus.DONE and s.id not in was_done)
    complete = plan_complete(current)
    if complete and not plan_complete(previous):
        return PlanTrigger(CheckTrigger.PLAN_COMPLETED, newly, True)
    if newly:
        return PlanTrigger(CheckTrigger.PLAN_STEPS_DONE, newly, complete)
    return PlanTrigger(None, newly, complete)


@dataclass(frozen=True)
class TurnWindow:
    """The part of a turn no check has covered yet: its events after the last check's trigger."""

    tool_results: int
    start_time: datetime | None
    end_time: datetime


def substantial(window: TurnWindow, min_tool_results: int, min_duration_seconds: float) -> bool:
    """A successful turn is substantial from ``min_tool_results`` tool-result events, or from
    ``min_duration_seconds`` with at least one recorded result, counting only work no check
    covered (spec "Successful substantial turns")."""
    if window.tool_results >= min_tool_results:
        return True
    if window.tool_results >= 1 and window.start_time is not None:
        return (window.end_time - window.start_time).total_seconds() >= min_duration_seconds
    return False
