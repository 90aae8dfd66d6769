"""The memory judge's answer, read once (issue 13): the reflector's PersistDecider and the session
learning checks' judge (services/sessions/judge.py) ask the same question — which diary tier does
this fact belong in, and for how long — and read the model's classification and time to live by
the same rules, so an answer one accepts the other does too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from libs.common.auxmodel.answers import InvalidOutput, described

__all__ = ["MAX_TTL_DAYS", "TIERS", "read_tier", "read_ttl_days"]

MAX_TTL_DAYS = 3650
"""The longest time to live a SHORT diary note may ask for (the diary refuses a longer one)."""
TIERS = frozenset({"LONG", "SHORT", "DOC", "NOOP"})
"""LONG and SHORT are diary notes, DOC a recommendation for team documentation, NOOP nothing."""


def read_tier(answer: Mapping[str, Any]) -> str:
    """The answer's ``classification``, upper-cased; InvalidOutput when it is none of the tiers."""
    raw = str(answer.get("classification", ""))
    tier = raw.upper()
    if tier not in TIERS:
        # By length and digest: the model's own string may be anything it wrote (a sentence about
        # the person), and this message is logged where no erasure reaches.
        raise InvalidOutput(f"a classification ({described(raw)}) that is none of LONG, SHORT, DOC, NOOP")
    return tier


def read_ttl_days(answer: Mapping[str, Any], tier: str) -> int:
    """A SHORT answer's ``ttl_days`` (InvalidOutput unless a number in 1..MAX_TTL_DAYS); 0 for
    every other tier, which keeps its note until it is removed."""
    if tier != "SHORT":
        return 0
    try:
        ttl = int(answer.get("ttl_days") or 0)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an infinite number (1e999, Infinity)
        raise InvalidOutput(f"ttl_days ({described(str(answer.get('ttl_days')))}) is not a number") from None
    if not 1 <= ttl <= MAX_TTL_DAYS:
        raise InvalidOutput(f"a SHORT note needs ttl_days in 1..{MAX_TTL_DAYS}, got {ttl}")
    return ttl
