"""A domain enum's proto values, by the AIP naming rule instead of a hand-written table.

Every servicer mapped its ``StrEnum`` onto the proto enum member by member
(``SkillState.ACTIVE: pb.SKILL_STATE_ACTIVE``, ...). The proto values are named
``<ENUM PREFIX>_<MEMBER NAME>`` (buf lint's ENUM_VALUE_PREFIX), so the table is a function of the
two enums: built here once per pair. A domain member without a proto value fails when the module
loads, not on the first request that meets it.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum
from typing import Any, TypeVar

__all__ = ["enum_to_pb"]

E = TypeVar("E", bound=Enum)
V = TypeVar("V")


def enum_to_pb(members: Iterable[E], pb_enum: type[V], prefix: str) -> dict[E, V]:
    """``{member: pb_enum value named <prefix>_<member name>}`` for each of ``members`` (an enum
    class for all of them, or the ones the proto carries)."""
    # The generated pb enum is an EnumTypeWrapper at run time (its stubs type it as a class).
    wrapper: Any = pb_enum
    return {m: wrapper.Value(f"{prefix}_{m.name}") for m in members}
