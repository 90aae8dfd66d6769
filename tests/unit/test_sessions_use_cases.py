"""The session use cases on in-memory fakes of their ports: ownership answered as absence, a
refused append leaving nothing behind, duplicates counted, the triggers (a substantial turn, plan
steps done, a plan completed, a manual check that never piles up), and paging."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from libs.common.clock import ManualClock
from libs.common.config import Settings
from libs.common.errors import FailedPrecondition, InvalidArgument, NotFound
from services.sessions.domain import (
    CheckState,
    CheckTrigger,
    Event,
    EventKind,
    PlanStep,
    StepStatus,
    TurnOutcome,
)
from services.sessions.service import SessionService
from tests.unit.fakes.reflector import FakeEvents
from tests.unit.fakes.sessions import FakeSessionStore

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def _service() -> tuple[SessionService, FakeSessionStore, FakeEvents, ManualClock]:
    store, events, clock = FakeSessionStore(), FakeEvents(), ManualClock(T0)
    return SessionService(store, store.queue, Settings(), clock, events), store, events, clock


def _msg(event_id: str, text: str = "hello") -> Event:
    return Event(event_id, EventKind.USER_MESSAGE, text, T0)


def _turn(turn_id: str, tools: int, minutes: float, outcome: TurnOutcome = TurnOutcome.DONE) -> list[Event]:
    """A turn of ``tools`` tool results over ``minutes``, then its end."""
    events = [Event(f"{turn_id}-ask", EventKind.USER_MESSAGE, "do it", T0, turn_id=turn_id)]
    events += [Event(f"{turn_id}-r{i}", EventKind.TOOL_RESULT, "ok", T0, turn_id=turn_id) for i in range(tools)]
    end = T0 + timedelta(minutes=minutes)
    return [*events, Event(f"{turn_id}-end", EventKind.TURN_END, "", end, turn_id=turn_id, turn_outcome=outcome)]


def _steps(*statuses: StepStatus) -> list[PlanStep]:
    return [PlanStep(f"s{i}", f"step {i}", st) for i, st in enumerate(statuses)]


async def test_a_session_belongs_to_its_first_appender_and_a_stranger_sees_none() -> None:
    svc, store, _, _ = _service()
    result = await svc.append_events("acme", "sess-1", "ann", "", "agent-1", "", [_msg("e1")])
    assert (result.appended, result.workspace) == (1, "default")
    assert (await svc.owned("acme", "sess-1", "ann")).seat == "agent-1"
    with pytest.raises(NotFound) as stranger:
        await svc.append_events("acme", "sess-1", "bob", "", "", "", [_msg("e2")])
    with pytest.raises(NotFound) as absent:
        await svc.owned("acme", "sess-404", "bob")
    assert stranger.value.reason == absent.value.reason == "SESSION_NOT_FOUND"
    assert [e.event_id for e in store.state.events[("acme", "sess-1")]] == ["e1"]


async def test_a_first_append_needs_a_seat_and_a_refused_append_records_nothing() -> None:
    svc, store, _, _ = _service()
    with pytest.raises(InvalidArgument) as no_seat:
        await svc.append_events("acme", "sess-1", "ann", "", "", "", [_msg("e1")])
    assert no_seat.value.reason == "FIELD_REQUIRED" and store.state.sessions == {}
    await svc.append_events("acme", "sess-1", "ann", "ws-a", "agent-1", "", [_msg("e1")])
    with pytest.raises(FailedPrecondition) as moved:
        await svc.append_events("acme", "sess-1", "ann", "ws-b", "", "", [_msg("e2")])
    assert moved.value.reason == "SESSION_WORKSPACE_MISMATCH"
    assert [e.event_id for e in store.state.events[("acme", "sess-1")]] == ["e1"]
    assert store.state.sessions[("acme", "sess-1")].last_seq == 1


async def test_repeated_event_ids_are_counted_as_duplicates_not_stored_twice() -> None:
    svc, store, _, _ = _service()
    await svc.append_events("acme", "sess-1", "ann", "", "agent-1", "", [_msg("e1")])
    result = await svc.append_events("acme", "sess-1", "ann", "", "", "", [_msg("e1"), _msg("e2"), _msg("e2")])
    assert (result.appended, result.duplicates) == (1, 2)
    assert [e.seq for e in store.state.events[("acme", "sess-1")]] == [1, 2]


async def test_a_substantial_successful_turn_queues_one_check_and_its_job() -> None:
    svc, store, events, _ = _service()
    result = await svc.append_events("acme", "sess-1", "ann", "", "agent-1", "", _turn("t1", tools=6, minutes=3))
    [check] = result.queued
    assert check.trigger is CheckTrigger.SUBSTANTIAL_TURN and check.turn_id == "t1"
    assert check.trigger_event_id == "t1-end" and check.state is CheckState.QUEUED
    job = store.job().job
    assert (job.kind, job.key) == ("learning", f"turn:sess-1:{check.trigger_seq}")
    assert events.kinds() == ["learning_check_queued"]


@pytest.mark.parametrize(
    ("tools", "minutes", "outcome"),
    [(5, 1, TurnOutcome.DONE), (0, 5, TurnOutcome.DONE), (6, 3, TurnOutcome.FAILED)],
    ids=["few-tools-and-short", "long-but-no-result", "failed"],
)
async def test_a_turn_short_of_the_rule_or_unsuccessful_queues_nothing(
    tools: int, minutes: float, outcome: TurnOutcome
) -> None:
    svc, store, events, _ = _service()
    result = await svc.append_events("acme", "sess-1", "ann", "", "agent-1", "", _turn("t1", tools, minutes, outcome))
    assert result.queued == [] and store.queue.jobs == {} and events.kinds() == []


async def test_a_long_turn_with_one_result_is_substantial_too() -> None:
    svc, _, _, _ = _service()
    result = await svc.append_events("acme", "sess-1", "ann", "", "agent-1", "", _turn("t1", tools=1, minutes=3))
    assert [c.trigger for c in result.queued] == [CheckTrigger.SUBSTANTIAL_TURN]


async def test_a_turns_work_is_counted_once_a_check_covered_it() -> None:
    svc, _, _, _ = _service()
    first = _turn("t1", tools=6, minutes=3)
    await svc.append_events("acme", "sess-1", "ann", "", "agent-1", "", first[:-1])
    assert (await svc.check_recent_work("acme", "sess-1", "ann"))[1] is False  # covers the work so far
    result = await svc.append_events("acme", "sess-1", "ann", "", "", "", first[-1:])
    assert result.queued == []


async def test_plan_revisions_queue_steps_done_then_completion_and_refuse_a_stale_one() -> None:
    svc, store, _, _ = _service()
    await svc.append_events("acme", "sess-1", "ann", "", "agent-1", "", [_msg("e1")])
    first = await svc.save_plan("acme", "sess-1", "ann", 1, _steps(StepStatus.DONE, StepStatus.PENDING))
    assert first.check is not None and first.check.trigger is CheckTrigger.PLAN_STEPS_DONE
    assert first.newly_done == ("s0",) and not first.complete
    again = await svc.save_plan("acme", "sess-1", "ann", 1, _steps(StepStatus.DONE, StepStatus.PENDING))
    assert again.already_saved and again.check is None
    with pytest.raises(FailedPrecondition) as stale:
        await svc.save_plan("acme", "sess-1", "ann", 1, _steps(StepStatus.DONE, StepStatus.DONE))
    assert stale.value.reason == "STALE_PLAN_REVISION"
    done = await svc.save_plan("acme", "sess-1", "ann", 2, _steps(StepStatus.DONE, StepStatus.DONE))
    assert done.check is not None and done.check.trigger is CheckTrigger.PLAN_COMPLETED and done.complete
    assert [j.job.key for j in store.queue.jobs.values()] == ["plan:sess-1:1", "plan:sess-1:2"]


async def test_a_manual_check_while_one_is_active_returns_that_one() -> None:
    svc, store, _, clock = _service()
    await svc.append_events("acme", "sess-1", "ann", "", "agent-1", "", [_msg("e1")])
    check, reused = await svc.check_recent_work("acme", "sess-1", "ann")
    assert (check.trigger, reused) == (CheckTrigger.MANUAL, False)
    same, reused = await svc.check_recent_work("acme", "sess-1", "ann")
    assert (same.id, reused) == (check.id, True)
    store.finish(check.id, CheckState.COMPLETED, clock.advance(minutes=1))
    fresh, reused = await svc.check_recent_work("acme", "sess-1", "ann")
    assert fresh.id != check.id and not reused
    assert len(store.queue.jobs) == 2


async def test_checks_are_paged_newest_first_and_the_away_digest_counts_finished_ones() -> None:
    svc, store, _, clock = _service()
    await svc.append_events("acme", "sess-1", "ann", "", "agent-1", "", [_msg("e1")])
    ids = []
    for state in (CheckState.COMPLETED, CheckState.FAILED, CheckState.COMPLETED):
        check, _ = await svc.check_recent_work("acme", "sess-1", "ann")
        ids.append(check.id)
        store.finish(check.id, state, clock.advance(minutes=1))
    page, token = await svc.list_checks("acme", "sess-1", "ann", 2, "")
    assert [c.id for c in page] == ids[:0:-1] and token
    rest, last = await svc.list_checks("acme", "sess-1", "ann", 2, token)
    assert [c.id for c in rest] == ids[:1] and last == ""
    digest = await svc.away_digest("acme", "ann", T0, 10, "")
    assert (digest.completed, digest.failed, digest.interrupted) == (2, 1, 0)
    assert [c.id for c in digest.checks] == ids[::-1]
