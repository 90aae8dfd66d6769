"""How a turn ended, defined once (issue 13): one enum and the one table that converts it to and
from every proto enum that carries it.

``agentlearn.common.v1.TurnOutcome`` is the contract's definition, for new fields. Three enums
shipped before it and stay (a shipped field's type never changes): sessions' (SUCCEEDED, FAILED,
CANCELLED), the reflector's and the episodes' (DONE, FAILED, SELF_ITERATE, SKIPPED). Each is a
subset of the common one. Python code converts through :func:`to_proto` / :func:`from_proto`, never
through a table of its own; tests/unit/test_outcomes.py checks that every value of every one of
these enums maps, both ways.
"""

from __future__ import annotations

from enum import StrEnum
from types import MappingProxyType
from typing import Literal

from agentlearn.common.v1 import turn_pb2
from agentlearn.episodes.v1 import episode_service_pb2 as episodes_pb
from agentlearn.reflector.v1 import reflector_service_pb2 as reflector_pb
from agentlearn.sessions.v1 import session_service_pb2 as sessions_pb

__all__ = ["PROTO_VALUES", "Family", "TurnOutcome", "from_proto", "to_proto"]


class TurnOutcome(StrEnum):
    UNSPECIFIED = "unspecified"
    DONE = "done"
    FAILED = "failed"
    SELF_ITERATE = "self_iterate"
    SKIPPED = "skipped"
    CANCELLED = "cancelled"

    @property
    def settled(self) -> bool:
        """Done or failed: the turn's work is finished (a self_iterate round is not)."""
        return self in (TurnOutcome.DONE, TurnOutcome.FAILED)


Family = Literal["common", "sessions", "reflector", "episodes"]

_T = TurnOutcome
PROTO_VALUES: MappingProxyType[str, MappingProxyType[int, TurnOutcome]] = MappingProxyType(
    {
        "common": MappingProxyType(
            {
                turn_pb2.TURN_OUTCOME_UNSPECIFIED: _T.UNSPECIFIED,
                turn_pb2.TURN_OUTCOME_DONE: _T.DONE,
                turn_pb2.TURN_OUTCOME_FAILED: _T.FAILED,
                turn_pb2.TURN_OUTCOME_SELF_ITERATE: _T.SELF_ITERATE,
                turn_pb2.TURN_OUTCOME_SKIPPED: _T.SKIPPED,
                turn_pb2.TURN_OUTCOME_CANCELLED: _T.CANCELLED,
            }
        ),
        "sessions": MappingProxyType(
            {
                sessions_pb.TURN_OUTCOME_UNSPECIFIED: _T.UNSPECIFIED,
                sessions_pb.TURN_OUTCOME_SUCCEEDED: _T.DONE,
                sessions_pb.TURN_OUTCOME_FAILED: _T.FAILED,
                sessions_pb.TURN_OUTCOME_CANCELLED: _T.CANCELLED,
            }
        ),
        "reflector": MappingProxyType(
            {
                reflector_pb.TURN_OUTCOME_UNSPECIFIED: _T.UNSPECIFIED,
                reflector_pb.TURN_OUTCOME_DONE: _T.DONE,
                reflector_pb.TURN_OUTCOME_FAILED: _T.FAILED,
                reflector_pb.TURN_OUTCOME_SELF_ITERATE: _T.SELF_ITERATE,
                reflector_pb.TURN_OUTCOME_SKIPPED: _T.SKIPPED,
            }
        ),
        "episodes": MappingProxyType(
            {
                episodes_pb.TURN_OUTCOME_UNSPECIFIED: _T.UNSPECIFIED,
                episodes_pb.TURN_OUTCOME_DONE: _T.DONE,
                episodes_pb.TURN_OUTCOME_FAILED: _T.FAILED,
                episodes_pb.TURN_OUTCOME_SELF_ITERATE: _T.SELF_ITERATE,
                episodes_pb.TURN_OUTCOME_SKIPPED: _T.SKIPPED,
            }
        ),
    }
)
"""Per proto enum, its number → the outcome. Every number of every enum is here (tested)."""

_TO_PROTO = {family: {outcome: number for number, outcome in table.items()} for family, table in PROTO_VALUES.items()}


def from_proto(family: Family, value: int) -> TurnOutcome:
    """The outcome a proto enum's number stands for; ValueError for a number the enum lacks."""
    try:
        return PROTO_VALUES[family][value]
    except KeyError:
        raise ValueError(f"{value} is not a {family} TurnOutcome") from None


def to_proto(family: Family, outcome: TurnOutcome) -> int:
    """The number ``family``'s enum gives ``outcome``; ValueError when that enum cannot say it
    (sessions have no SKIPPED, the reflector and the episodes no CANCELLED)."""
    try:
        return _TO_PROTO[family][outcome]
    except KeyError:
        raise ValueError(f"the {family} TurnOutcome has no {outcome}") from None
