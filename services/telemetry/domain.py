"""The telemetry service's rules that are data: its error domain, the windows it aggregates over,
the page sizes, and the rows it answers with."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Generic, TypeVar

T = TypeVar("T")

__all__ = [
    "DEFAULT_DAYS",
    "DOMAIN",
    "MAX_RANGE",
    "BlockTotal",
    "Day",
    "Event",
    "PurposeTotal",
    "SeatActivity",
    "Window",
    "day_start",
]

DOMAIN = "telemetry.agentlearn.dev"

DEFAULT_DAYS = 30
"""A window nobody named: the last 30 UTC days, today included."""
MAX_RANGE = timedelta(days=400)
"""The longest window one aggregation reads (a year and a margin): a chart's question, not an
export."""
SEATS_PAGE_DEFAULT, SEATS_PAGE_MAX = 50, 500
EVENTS_PAGE_DEFAULT, EVENTS_PAGE_MAX = 50, 500

PREFETCH_SUMMARY = "prefetch_summary"
AUXILIARY_SPEND = "auxiliary_spend"
TURN_COMPLETED = "turn_completed"


def day_start(value: datetime) -> datetime:
    """The start of ``value``'s UTC day."""
    value = value.astimezone(UTC)
    return value.replace(hour=0, minute=0, second=0, microsecond=0)


@dataclass(frozen=True)
class Window:
    """[start, end): the events an aggregation reads."""

    start: datetime
    end: datetime


@dataclass(frozen=True)
class BlockTotal:
    """A prefetch block's turns and hits over a span: one day, or the whole window."""

    block: str
    turns: int
    hits: int

    @property
    def rate(self) -> float:
        return self.hits / self.turns if self.turns else 0.0


@dataclass(frozen=True)
class PurposeTotal:
    """An auxiliary purpose's calls and tokens over a span: one day, or the whole window."""

    purpose: str
    calls: int
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class Day(Generic[T]):
    """One day's counts (a day's row and the window's total are the same counts over other spans)."""

    day: datetime
    counts: T


@dataclass(frozen=True)
class SeatActivity:
    company: str
    seat: str
    events: int
    turns: int
    prefetches: int
    auxiliary_calls: int
    auxiliary_tokens: int
    last_event_time: datetime


@dataclass(frozen=True)
class Event:
    id: int
    time: datetime
    kind: str
    company: str
    seat: str | None
    turn_id: str | None
    trace_id: str | None
    payload: dict[str, Any] = field(default_factory=dict)
    span_id: str | None = None
