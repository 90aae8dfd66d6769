"""TurnCompleted (protobuf) → Turn (domain)."""

from __future__ import annotations

from agentlearn.reflector.v1 import reflector_service_pb2 as pb
from libs.common.field_copy import from_pb
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
_SENDER_FIELDS = "handle external_id platform display_name"


def turn_from_pb(t: pb.TurnCompleted) -> Turn:
    return from_pb(
        Turn,
        t,
        "turn_id work_key company seat role label ask what_it_did review_outcome tool_sequence tools_called"
        " self_persisted start_time end_time conversation_id work_item",
        outcome=OUTCOME[t.outcome],
        offered_skills=tuple(OfferedSkill(s.id, s.name) for s in t.offered_skills),
        interactions=tuple(
            from_pb(Interaction, i, "body send_time", sender=from_pb(Sender, i.sender, _SENDER_FIELDS))
            for i in t.interactions
        ),
        trigger=TRIGGER.get(t.trigger_kind, Trigger.MESSAGE),
        learning_enabled=t.learning_enabled if t.HasField("learning_enabled") else None,
    )
