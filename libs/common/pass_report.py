"""What a background pass reports, once: the counts every pass over seats keeps when one seat's
fault must not stop the others (``seats_failed``, ``failures`` by kind), adding one seat's counts
into the pass's, and announcing a report as its completion event (every count, by its field name).

The passes' own counts stay their own dataclass fields: a report is the pass's return value and its
event's payload, so each keeps the names its readers (tests, dashboards) already know.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING

from libs.common.events import EventSink

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = ["SeatPassReport", "add_counts", "emit_report"]


@dataclass
class SeatPassReport:
    """The failure counts of a pass that goes on with the next seat (or unit) after one fails."""

    seats_failed: int = 0
    """Seats whose pass raised (logged with the seat, kind in ``failures``); the pass went on."""
    failures: dict[str, int] = field(default_factory=dict)
    """The failures by kind (an exception type, or a named cause such as ``episodes:UNAVAILABLE``)."""

    def fail(self, kind: str) -> None:
        """Count one failure of ``kind`` (a seat's, a unit's, a call's)."""
        self.failures[kind] = self.failures.get(kind, 0) + 1

    def seat_failed(self, kind: str) -> None:
        """Count one seat whose pass raised, under ``kind``."""
        self.seats_failed += 1
        self.fail(kind)


def add_counts(total: DataclassInstance, part: DataclassInstance) -> None:
    """Add every count of the dataclass ``part`` to the field of ``total`` with the same name (one
    seat's counts into the pass's)."""
    for f in fields(part):
        setattr(total, f.name, getattr(total, f.name) + getattr(part, f.name))


async def emit_report(
    events: EventSink,
    kind: str,
    report: DataclassInstance,
    *,
    leave_out: Iterable[str] = (),
    company: str | None = None,
    seat: str | None = None,
) -> None:
    """Emit the dataclass ``report`` as the event ``kind``: every field, by name, but those in
    ``leave_out`` (a field the event has never carried stays out of it)."""
    payload = asdict(report)
    for name in leave_out:
        del payload[name]
    await events.emit(kind, company=company, seat=seat, **payload)
