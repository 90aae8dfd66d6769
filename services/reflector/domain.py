"""The reflector's domain: the turn as the workers read it, gates, worker outcomes."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, NamedTuple, Protocol

from libs.common import senders
from libs.common.outcomes import TurnOutcome

__all__ = [
    "DOMAIN",
    "JOB_KIND",
    "ORDERED_WORKERS",
    "RETRYABLE_FAILURES",
    "ROUND_SUFFIX",
    "TRANSITIONS",
    "Gate",
    "IllegalTransition",
    "Interaction",
    "OfferedSkill",
    "ReflectionState",
    "Sender",
    "Trigger",
    "Turn",
    "TurnKey",
    "WorkerOutcome",
    "WorkerStatus",
    "check_transition",
    "failure_kind_of",
    "job_key",
    "reflection_id",
    "run_id_of",
    "sources",
    "turn_fields",
    "turn_id_of",
]

DOMAIN = "reflector.agentlearn.dev"
JOB_KIND = "reflection"


def job_key(seat: str, turn_id: str) -> str:
    """The queue key of a turn: a run id is one seat's (two seats may report the same run id).
    The seat is escaped so the first ``/`` always ends it (the key is unambiguous)."""
    return seat.replace("%", "%25").replace("/", "%2F") + "/" + turn_id


ROUND_SUFFIX = "#self_iterate"
"""What files a self_iterate round's reflection apart from its run's: the engine reports a round
sent back for more work (self_iterate) and, later, the settled turn, under the same run id (the
turn-start context is frozen per run id, and a round reuses it). Keyed by the run id alone, the
settled report found the round's reflection and was dropped as a redelivery, so a turn that
self-iterated was never reflected as settled: no note, no skill, no refinement. A run id that
itself ends so is refused (it would name another run's round)."""


def reflection_id(turn_id: str, self_iterate: bool) -> str:
    """The key of a report's reflection: the run id, or the run id and :data:`ROUND_SUFFIX` for a
    self_iterate round (every round of a run is one reflection: the first; the later rounds of the
    same run are its redeliveries)."""
    return turn_id + ROUND_SUFFIX if self_iterate else turn_id


def run_id_of(reflection_key: str) -> str:
    """The run id a reflection's key (:func:`reflection_id`) belongs to."""
    return reflection_key.removesuffix(ROUND_SUFFIX)


def turn_id_of(key: str) -> str:
    """The run id of a :func:`job_key`."""
    return key.split("/", 1)[1]


ORDERED_WORKERS = frozenset({frozenset({"episodist", "synthesizer"})})
"""Pairs of workers that never run side by side: the one wired first in
``learning.reflection.workers`` finishes before the other starts. The synthesizer stamps the turn's
episode with the skill it drafted, so it must see the episodist's outcome (wired after it, it finds
no episode and is retried: ``episode_pending``). Every other pair is independent — they write
through different services, or to different rows under the receiver's own locks — and the harness
runs them at once."""


RETRYABLE_FAILURES = frozenset(
    {
        # A service the worker writes through is down, restarting, shedding load (RESOURCE_EXHAUSTED
        # with RetryInfo; without it a limit: ``rpc_limit_reached``, final), or did not answer in
        # time. The channel's retry policy has already retried what it may within the call.
        "rpc_unavailable",
        "rpc_deadline_exceeded",
        "rpc_resource_exhausted",
        # The service cancelled the call (its process stopping mid-call): not an answer.
        "rpc_cancelled",
        # The auxiliary model's provider chain failed for a passing reason.
        "rate_limited",
        "server_error",
        "timeout",
        "connection",
        # A write waits for the turn's episode, which the episodist records on its retry.
        "episode_pending",
    }
)
"""Failure kinds that say "not now" rather than "no": the turn goes back on the queue with backoff
and the worker runs again. Everything else (``refused``, ``configuration``, ``no_model``,
``invalid_output``, ``rpc_limit_reached``, ``rpc_invalid_argument``, ...) is the worker's final
outcome: running it again would get the same answer."""


def failure_kind_of(failure: str) -> str:
    """The kind of a recorded failure (``"<kind>: <message>"``)."""
    return failure.split(":", 1)[0].strip()


class ReflectionState(StrEnum):
    """Where a turn's reflection stands: the ONE state of a reflection. The ``reflections`` row holds
    it; the queue row's state (``background_jobs.state``) is its projection (:attr:`job_state`),
    written in the same transaction by every transition (``store.py``), never set on its own."""

    QUEUED = "queued"
    RUNNING = "running"
    RETRYING = "retrying"
    DEFERRED = "deferred"
    COMPLETED = "completed"
    GATED = "gated"
    DEAD_LETTERED = "dead_lettered"
    ERASED = "erased"
    """No record's state: an erasure deletes the record and keeps the turn's job row, emptied, as
    the duplicate gate (services/reflector/erasure.py). The service answers it for a turn whose
    record is gone and whose job row is so emptied (SubmitTurn of it again, GetReflection of it),
    where a missing record used to read as "still queued"."""

    @property
    def final(self) -> bool:
        """Nothing moves it again: a redelivery of the turn is the duplicate gate."""
        return not TRANSITIONS[self]

    @property
    def waiting(self) -> bool:
        """On the queue, due at its ``next_attempt_time`` (or now)."""
        return self in (ReflectionState.QUEUED, ReflectionState.RETRYING, ReflectionState.DEFERRED)

    @property
    def job_state(self) -> str:
        """The queue row's state in this state (a :class:`libs.common.jobs.JobState` value)."""
        return _JOB_STATE[self]


_JOB_STATE = {
    ReflectionState.QUEUED: "queued",
    ReflectionState.RETRYING: "queued",
    ReflectionState.DEFERRED: "queued",
    ReflectionState.RUNNING: "running",
    ReflectionState.COMPLETED: "done",
    ReflectionState.GATED: "done",
    ReflectionState.DEAD_LETTERED: "dead",
    ReflectionState.ERASED: "done",
}

TRANSITIONS: dict[ReflectionState, frozenset[ReflectionState]] = {
    # Taken by a worker (each take counts an attempt); or given up before a take (an unreadable
    # payload, or the store failing before the take: retried).
    ReflectionState.QUEUED: frozenset(
        {ReflectionState.RUNNING, ReflectionState.RETRYING, ReflectionState.DEAD_LETTERED}
    ),
    ReflectionState.RETRYING: frozenset(
        {ReflectionState.RUNNING, ReflectionState.RETRYING, ReflectionState.DEAD_LETTERED}
    ),
    ReflectionState.DEFERRED: frozenset(
        {ReflectionState.RUNNING, ReflectionState.RETRYING, ReflectionState.DEAD_LETTERED}
    ),
    # A pass ends one of these ways; RUNNING again is a lapsed claim (a crash) taken anew, QUEUED a
    # pass handed back when its process stops.
    ReflectionState.RUNNING: frozenset(
        {
            ReflectionState.RUNNING,
            ReflectionState.COMPLETED,
            ReflectionState.GATED,
            ReflectionState.RETRYING,
            ReflectionState.DEFERRED,
            ReflectionState.DEAD_LETTERED,
            ReflectionState.QUEUED,
        }
    ),
    ReflectionState.COMPLETED: frozenset(),
    ReflectionState.GATED: frozenset(),
    # Run again only when an operator re-queues the dead letters once the cause is fixed
    # (docs/services/reflector.md): the queue row is re-queued, and its next take moves the record.
    ReflectionState.DEAD_LETTERED: frozenset({ReflectionState.RUNNING}),
    # Reached by no move (the erasure deletes the record); nothing leaves it.
    ReflectionState.ERASED: frozenset(),
}
"""Every allowed move of a reflection, in one place: the store's statements only move a row whose
state is one of :func:`sources` of the target, so an illegal move changes nothing (neither row)."""


class IllegalTransition(Exception):
    """A move the state machine does not allow (a finished turn moved again, a pass closed that
    was never taken): a bug or a stale holder, never a caller's mistake."""

    def __init__(self, turn_id: str, current: ReflectionState | None, target: ReflectionState):
        self.current = current
        self.target = target
        super().__init__(f"reflection {turn_id}: {current or 'no record'} -> {target} is not allowed")


def sources(target: ReflectionState) -> list[str]:
    """The states a reflection may move to ``target`` from (the guard of the store's statements)."""
    return sorted(str(s) for s, nexts in TRANSITIONS.items() if target in nexts)


def check_transition(turn_id: str, current: ReflectionState | None, target: ReflectionState) -> None:
    """Raise :class:`IllegalTransition` unless ``current`` may move to ``target``."""
    if current is None or target not in TRANSITIONS[current]:
        raise IllegalTransition(turn_id, current, target)


class Trigger(StrEnum):
    MESSAGE = "message"
    AGENT_ASK = "agent_ask"
    SCHEDULE = "schedule"
    SANDBOX = "sandbox"
    TASK = "task"


class Gate(StrEnum):
    """The harness's gates, in the order they are asked (spec: "Gates, in order")."""

    NO_WORKERS = "no_workers"
    NO_ROLE = "no_role"
    OPTED_OUT = "opted_out"
    NO_BUDGET = "no_budget"
    DUPLICATE = "duplicate"
    NO_ENGAGEMENT = "no_engagement"


class Sender(senders.Sender):
    """A sender of the turn's trigger, as the profiler groups and profiles them."""

    @property
    def key(self) -> str:
        """``<platform>/<handle or external id>``, each part escaped (``senders.subject_part``): the
        profiler's idempotency keys end in it, and the profiles' erasure parses it back, so a
        platform written "a/b" or a handle with a ``:`` in it cannot name another sender."""
        return senders.subject_part(self.platform, self.handle or self.external_id)

    def is_seat(self, seat: str) -> bool:
        """The sender is the observing seat itself: its key (handle, else external id) names the
        seat, compared case-insensitively on any platform — the profiles service's own rule
        (SELF_PROFILE). A seat's own messages are never a counterparty's, nor facts to note."""
        key = (self.handle or self.external_id).strip()
        return bool(key) and key.casefold() == seat.strip().casefold()


@dataclass(frozen=True)
class Interaction:
    sender: Sender
    body: str
    send_time: datetime | None = None


class TurnKey(NamedTuple):
    """A turn's reflection record: one per company, seat and run id (a run id is one seat's). A
    tuple, so a statement takes it as its first three parameters (``*key``)."""

    company: str
    seat: str
    turn_id: str


class _TurnKeyed(Protocol):
    @property
    def company(self) -> str: ...
    @property
    def seat(self) -> str: ...
    @property
    def turn_id(self) -> str: ...


def turn_fields(turn: _TurnKeyed) -> dict[str, str]:
    """What names a turn on every event the reflector emits about it (a :class:`Turn`, or the
    reported proto turn): its company, seat and run id."""
    return {"company": turn.company, "seat": turn.seat, "turn_id": turn.turn_id}


@dataclass(frozen=True)
class OfferedSkill:
    id: str
    name: str


@dataclass(frozen=True)
class Turn:
    turn_id: str
    work_key: str
    company: str
    seat: str
    role: str
    label: str
    ask: str
    what_it_did: str
    outcome: TurnOutcome
    review_outcome: str
    tool_sequence: tuple[str, ...]
    tools_called: tuple[str, ...]
    offered_skills: tuple[OfferedSkill, ...]
    interactions: tuple[Interaction, ...]
    self_persisted: bool
    trigger: Trigger
    start_time: datetime | None
    end_time: datetime | None
    conversation_id: str = ""
    work_item: str = ""
    learning_enabled: bool | None = None

    @property
    def key(self) -> TurnKey:
        """The key of this report's reflection (a self_iterate round's is its own:
        :func:`reflection_id`); the workers' writes still name the run id."""
        return TurnKey(self.company, self.seat, reflection_id(self.turn_id, self.outcome is TurnOutcome.SELF_ITERATE))

    def write_key(self, worker: str, *parts: str) -> str:
        """The idempotency key of a worker's write: per unit of WORK when the turn names one, so a
        redelivered trigger (a second run of the same work) neither counts a sender's observation
        twice nor writes a second note for what the first run noted; per run id otherwise."""
        return ":".join([self.work_key or self.turn_id, worker, *parts])

    @property
    def asked(self) -> str:
        """What the turn was asked: the interactions' bodies in order, or the ``ask`` it carries."""
        if self.interactions:
            return "\n".join(i.body for i in self.interactions if i.body)
        return self.ask

    @property
    def tool_run(self) -> tuple[str, ...]:
        """The turn's run of tools: every call it made, in order (``tools_called``), or the final
        round's sequence when the engine reported no calls. Its SET is the turn's tool set — the one
        identity every skill path compares (spec: "over the tool set, not the ordered run"). The
        whole turn rather than its final round: a final round is often the answer alone, and two
        turns that called the same tools are the same procedure however their last round ended."""
        return self.tools_called or self.tool_sequence

    @property
    def tool_set(self) -> frozenset[str]:
        """The turn's tool set: the tools of :attr:`tool_run`, order and repeats ignored."""
        return frozenset(t for t in self.tool_run if t)

    @property
    def engaged(self) -> bool:
        """Spec gate 6: a skipped turn, or one done with no tool called, processed nothing. "No
        tool called" is an empty run (:attr:`tool_run`): neither a call nor a final-round tool was
        reported — a turn whose engine reported only its final round did call that round's tools."""
        if self.outcome is TurnOutcome.SKIPPED or self.review_outcome.strip().lower() == "skipped":
            return False
        return not (self.outcome is TurnOutcome.DONE and not self.tool_run)


class WorkerStatus(StrEnum):
    WROTE = "wrote"
    NOTHING = "nothing"
    SKIPPED = "skipped"
    FAILED = "failed"
    RETRYING = "retrying"
    """Failed for a passing reason (a retryable kind); it runs again on the turn's next attempt."""


@dataclass
class WorkerOutcome:
    worker: str
    status: WorkerStatus
    gate: str = ""
    failure: str = ""
    written: list[str] = field(default_factory=list)
    detail: str = ""
    duration_ms: int = 0

    @property
    def retryable(self) -> bool:
        """A failure for a passing reason: the worker has not finished and runs again. Judged by
        the kind, so an outcome recorded FAILED before retries existed is re-run too."""
        if self.status not in (WorkerStatus.FAILED, WorkerStatus.RETRYING):
            return False
        return failure_kind_of(self.failure) in RETRYABLE_FAILURES

    def to_json(self) -> dict[str, Any]:
        return {
            "worker": self.worker,
            "status": str(self.status),
            "gate": self.gate,
            "failure": self.failure,
            "written": self.written,
            "detail": self.detail,
            "duration_ms": self.duration_ms,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WorkerOutcome:
        return cls(
            worker=data["worker"],
            status=WorkerStatus(data["status"]),
            gate=data.get("gate", ""),
            failure=data.get("failure", ""),
            written=list(data.get("written", [])),
            detail=data.get("detail", ""),
            duration_ms=int(data.get("duration_ms", 0)),
        )
