"""TurnCompleted (protobuf) → Turn (domain)."""

from __future__ import annotations

from agentlearn.reflector.v1 import reflector_service_pb2 as pb
from libs.common import outcomes
from libs.common.field_copy import enum_from_pb, from_pb
from services.reflector.domain import Interaction, OfferedSkill, Sender, Trigger, Turn

__all__ = ["OUTCOME", "TRIGGER", "turn_from_pb"]

OUTCOME = outcomes.PROTO_VALUES["reflector"]
TRIGGER = {pb.TRIGGER_KIND_UNSPECIFIED: Trigger.MESSAGE, **enum_from_pb(Trigger, pb.TriggerKind, "TRIGGER_KIND")}
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
