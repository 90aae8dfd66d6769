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
from typing import Any, Literal

from agentlearn.common.v1 import turn_pb2
from agentlearn.episodes.v1 import episode_service_pb2 as episodes_pb
from agentlearn.reflector.v1 import reflector_service_pb2 as reflector_pb
from agentlearn.sessions.v1 import session_service_pb2 as sessions_pb
from libs.common.enum_maps import enum_to_pb

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


def _by_name(pb_enum: Any) -> MappingProxyType[int, TurnOutcome]:
    """``{number: outcome}`` for an enum whose values are named ``TURN_OUTCOME_<outcome>`` (AIP's
    ENUM_VALUE_PREFIX): the members it carries, by the naming rule (libs.common.enum_maps)."""
    carried = [o for o in TurnOutcome if f"TURN_OUTCOME_{o.name}" in pb_enum.keys()]
    return MappingProxyType({v: o for o, v in enum_to_pb(carried, pb_enum, "TURN_OUTCOME").items()})


PROTO_VALUES: MappingProxyType[str, MappingProxyType[int, TurnOutcome]] = MappingProxyType(
    {
        "common": _by_name(turn_pb2.TurnOutcome),
        # The one enum not named like the others: SUCCEEDED is done.
        "sessions": MappingProxyType(
            {
                sessions_pb.TURN_OUTCOME_UNSPECIFIED: TurnOutcome.UNSPECIFIED,
                sessions_pb.TURN_OUTCOME_SUCCEEDED: TurnOutcome.DONE,
                sessions_pb.TURN_OUTCOME_FAILED: TurnOutcome.FAILED,
                sessions_pb.TURN_OUTCOME_CANCELLED: TurnOutcome.CANCELLED,
            }
        ),
        "reflector": _by_name(reflector_pb.TurnOutcome),
        "episodes": _by_name(episodes_pb.TurnOutcome),
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
