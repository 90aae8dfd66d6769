"""TurnCompleted (protobuf) → Turn (domain)."""

from __future__ import annotations

from datetime import UTC, datetime

from google.protobuf.message import Message

from agentlearn.reflector.v1 import reflector_service_pb2 as pb
from services.reflector.domain import Interaction, OfferedSkill, Outcome, Sender, Trigger, Turn

__all__ = ["OUTCOME", "TRIGGER", "turn_from_pb"]

OUTCOME = {
    pb.TURN_OUTCOME_DONE: Outcome.DONE,
    pb.TURN_OUTCOME_FAILED: Outcome.FAILED,
    pb.TURN_OUTCOME_SELF_ITERATE: Outcome.SELF_ITERATE,
    pb.TURN_OUTCOME_SKIPPED: Outcome.SKIPPED,
}
TRIGGER = {
    pb.TRIGGER_KIND_UNSPECIFIED: Trigger.MESSAGE,
    pb.TRIGGER_KIND_MESSAGE: Trigger.MESSAGE,
    pb.TRIGGER_KIND_AGENT_ASK: Trigger.AGENT_ASK,
    pb.TRIGGER_KIND_SCHEDULE: Trigger.SCHEDULE,
    pb.TRIGGER_KIND_SANDBOX: Trigger.SANDBOX,
    pb.TRIGGER_KIND_TASK: Trigger.TASK,
}


def _time(msg: Message, field: str) -> datetime | None:
    value: datetime | None = getattr(msg, field).ToDatetime(tzinfo=UTC) if msg.HasField(field) else None
    return value


def turn_from_pb(t: pb.TurnCompleted) -> Turn:
    return Turn(
        turn_id=t.turn_id,
        work_key=t.work_key,
        company=t.company,
        seat=t.seat,
        role=t.role,
        label=t.label,
        ask=t.ask,
        what_it_did=t.what_it_did,
        outcome=OUTCOME[t.outcome],
        review_outcome=t.review_outcome,
        tool_sequence=tuple(t.tool_sequence),
        tools_called=tuple(t.tools_called),
        offered_skills=tuple(OfferedSkill(s.id, s.name) for s in t.offered_skills),
        interactions=tuple(
            Interaction(
                Sender(i.sender.handle, i.sender.external_id, i.sender.platform, i.sender.display_name),
                i.body,
                _time(i, "send_time"),
            )
            for i in t.interactions
        ),
        self_persisted=t.self_persisted,
        trigger=TRIGGER.get(t.trigger_kind, Trigger.MESSAGE),
        start_time=_time(t, "start_time"),
        end_time=_time(t, "end_time"),
        conversation_id=t.conversation_id,
        work_item=t.work_item,
        learning_enabled=t.learning_enabled if t.HasField("learning_enabled") else None,
    )
