"""TurnOutcome defined once: every value of each proto enum that carries a turn's outcome (the common
one and the three shipped mirrors) converts to the one Python enum and back, and nothing is missing."""

from __future__ import annotations

import pytest

from agentlearn.common.v1 import turn_pb2
from agentlearn.episodes.v1 import episode_service_pb2 as episodes_pb
from agentlearn.reflector.v1 import reflector_service_pb2 as reflector_pb
from agentlearn.sessions.v1 import session_service_pb2 as sessions_pb
from libs.common.outcomes import PROTO_VALUES, TurnOutcome, from_proto, to_proto

ENUMS = {
    "common": turn_pb2.TurnOutcome,
    "sessions": sessions_pb.TurnOutcome,
    "reflector": reflector_pb.TurnOutcome,
    "episodes": episodes_pb.TurnOutcome,
}


@pytest.mark.parametrize("family", sorted(ENUMS))
def test_every_value_of_each_proto_enum_maps_and_back(family) -> None:
    numbers = set(ENUMS[family].values())
    assert set(PROTO_VALUES[family]) == numbers, "a proto value without a mapping, or a mapping without a value"
    for number in numbers:
        assert to_proto(family, from_proto(family, number)) == number


@pytest.mark.parametrize("family", sorted(ENUMS))
def test_a_value_maps_to_the_common_value_of_the_same_meaning(family) -> None:
    enum = ENUMS[family]
    for name, number in enum.items():
        meaning = "TURN_OUTCOME_DONE" if name == "TURN_OUTCOME_SUCCEEDED" else name
        assert to_proto("common", from_proto(family, number)) == turn_pb2.TurnOutcome.Value(meaning)


def test_the_python_enum_is_exactly_the_common_protos() -> None:
    names = {n.removeprefix("TURN_OUTCOME_").lower() for n in turn_pb2.TurnOutcome.keys()}
    assert {str(o) for o in TurnOutcome} == names


def test_a_value_an_enum_cannot_say_is_refused_not_guessed() -> None:
    with pytest.raises(ValueError, match="sessions TurnOutcome has no skipped"):
        to_proto("sessions", TurnOutcome.SKIPPED)
    with pytest.raises(ValueError, match="episodes TurnOutcome has no cancelled"):
        to_proto("episodes", TurnOutcome.CANCELLED)
    with pytest.raises(ValueError):
        from_proto("reflector", 99)
