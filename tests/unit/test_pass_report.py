"""libs.common.pass_report: a pass's failure counts, one seat's counts added into the pass's, and a
report announced as its completion event with exactly the fields the event carries."""

from __future__ import annotations

from dataclasses import dataclass

from libs.common.pass_report import SeatPassReport, add_counts, emit_report
from tests.unit.fakes.events import RecordedEvents


@dataclass
class _Seat:
    dropped: int = 0
    kept: int = 0


@dataclass
class _Pass(_Seat, SeatPassReport):
    seats: int = 0
    quiet: int = 0


def test_a_failed_seat_is_counted_once_and_under_its_kind_beside_other_failures() -> None:
    report = _Pass()
    report.seat_failed("episodes:UNAVAILABLE")
    report.seat_failed("episodes:UNAVAILABLE")
    report.fail("write:OSError")  # not a seat's: seats_failed stays
    assert report.seats_failed == 2
    assert report.failures == {"episodes:UNAVAILABLE": 2, "write:OSError": 1}


def test_a_seats_counts_add_into_the_fields_of_the_same_name() -> None:
    report = _Pass(dropped=1, kept=5, seats=3)
    add_counts(report, _Seat(dropped=2, kept=4))
    add_counts(report, _Seat(dropped=3))
    assert (report.dropped, report.kept, report.seats) == (6, 9, 3)


async def test_the_event_carries_every_field_but_those_left_out() -> None:
    events = RecordedEvents()
    report = _Pass(dropped=2, seats=1)
    report.seat_failed("seat:ValueError")
    await emit_report(events, "pass_completed", report, leave_out=("quiet",), company="acme")
    [event] = events.of("pass_completed")
    assert event == {
        "kind": "pass_completed",
        "company": "acme",
        "seat": None,
        "turn_id": None,
        "seats_failed": 1,
        "failures": {"seat:ValueError": 1},
        "dropped": 2,
        "kept": 0,
        "seats": 1,
    }
    # The payload is a copy: a later count does not rewrite what was announced.
    report.fail("seat:ValueError")
    assert event["failures"] == {"seat:ValueError": 1}
