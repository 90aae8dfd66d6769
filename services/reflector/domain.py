"""The reflector's domain: the turn as the workers read it, gates, worker outcomes."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

__all__ = [
    "DOMAIN",
    "JOB_KIND",
    "Gate",
    "Interaction",
    "OfferedSkill",
    "Outcome",
    "Sender",
    "Trigger",
    "Turn",
    "WorkerOutcome",
    "WorkerStatus",
]

DOMAIN = "reflector.agentlearn.dev"
JOB_KIND = "reflection"


class Outcome(StrEnum):
    DONE = "done"
    FAILED = "failed"
    SELF_ITERATE = "self_iterate"
    SKIPPED = "skipped"

    @property
    def settled(self) -> bool:
        return self in (Outcome.DONE, Outcome.FAILED)


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


@dataclass(frozen=True)
class Sender:
    handle: str
    external_id: str
    platform: str
    display_name: str = ""

    @property
    def key(self) -> str:
        return f"{self.platform}/{self.handle or self.external_id}"

    @property
    def name(self) -> str:
        return self.display_name or self.handle or self.external_id


@dataclass(frozen=True)
class Interaction:
    sender: Sender
    body: str
    send_time: datetime | None = None


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
    outcome: Outcome
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
    def asked(self) -> str:
        """What the turn was asked: the interactions' bodies in order, or the ``ask`` it carries."""
        if self.interactions:
            return "\n".join(i.body for i in self.interactions if i.body)
        return self.ask

    @property
    def engaged(self) -> bool:
        """Spec gate 6: a skipped turn, or one done with no tool called, processed nothing."""
        if self.outcome is Outcome.SKIPPED or self.review_outcome.strip().lower() == "skipped":
            return False
        return not (self.outcome is Outcome.DONE and not self.tools_called)


class WorkerStatus(StrEnum):
    WROTE = "wrote"
    NOTHING = "nothing"
    SKIPPED = "skipped"
    FAILED = "failed"


@dataclass
class WorkerOutcome:
    worker: str
    status: WorkerStatus
    gate: str = ""
    failure: str = ""
    written: list[str] = field(default_factory=list)
    detail: str = ""
    duration_ms: int = 0

    def to_json(self) -> dict:
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
    def from_json(cls, data: dict) -> WorkerOutcome:
        return cls(
            worker=data["worker"],
            status=WorkerStatus(data["status"]),
            gate=data.get("gate", ""),
            failure=data.get("failure", ""),
            written=list(data.get("written", [])),
            detail=data.get("detail", ""),
            duration_ms=int(data.get("duration_ms", 0)),
        )
