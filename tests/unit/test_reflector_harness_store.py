"""The reflection store port's promises, as the harness relies on them, on the in-memory fake
(tests/unit/fakes/reflector_store.py): a record is queued once; a take moves it to RUNNING and
counts an attempt, a final record is not taken; every move is checked against the one state machine
and a refused one raises inside the transaction, rolling back what the transaction moved before it;
a worker's final outcome is recorded once; a move of a record that is gone moves nothing.
tests/test_reflector_store_port.py runs the same checks on the Postgres store."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from libs.common.jobs import Job
from services.reflector.domain import (
    JOB_KIND,
    IllegalTransition,
    ReflectionState,
    TurnKey,
    WorkerOutcome,
    WorkerStatus,
    job_key,
)
from services.reflector.ports import ReflectionQueue, ReflectionStore
from services.reflector.store import ReflectionRecord
from tests.unit.fakes.reflector_store import FakeReflectionDb

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
KEY = TurnKey("acme", "agent-1", "run-1")
S = ReflectionState


async def _queued(store: ReflectionStore, key: tuple[str, str, str] = KEY, at: datetime = T0) -> bool:
    company, seat, turn_id = key
    return await store.queue_turn(
        turn_id, kind=JOB_KIND, key=job_key(seat, turn_id), company=company, seat=seat, payload=b"",
        trace_carrier={}, now=at,
    )  # fmt: skip


async def _claimed(queue: ReflectionQueue) -> Job:
    """The one job due, claimed by worker ``w``."""
    [job] = await queue.claim_many(JOB_KIND, "w", T0, 30, 1)
    return job


async def _state(store: ReflectionStore) -> ReflectionState:
    return (await _record(store)).state


async def _record(store: ReflectionStore, **expected: object) -> ReflectionRecord:
    """KEY's record, which holds ``expected`` (its attributes by name)."""
    record = await store.get(*KEY)
    assert record is not None
    assert {name: getattr(record, name) for name in expected} == expected
    return record


async def check_a_record_is_queued_once_and_a_take_counts_an_attempt(
    store: ReflectionStore, queue: ReflectionQueue
) -> None:
    assert await _queued(store)
    assert not await _queued(store, at=T0 + timedelta(minutes=1))  # a second one changes nothing
    await _record(store, state=S.QUEUED, attempts=0, submit_time=T0)
    before, taken = await store.take(*KEY)
    assert taken and before is not None and (before.state, before.attempts) == (S.QUEUED, 0)
    await _record(store, state=S.RUNNING, attempts=1)
    assert await store.take("acme", "agent-1", "nope") == (None, False)


async def check_a_final_record_is_not_taken_again(store: ReflectionStore, queue: ReflectionQueue) -> None:
    await _queued(store)
    await store.take(*KEY)
    job = await _claimed(queue)
    assert await store.finish_and_close(job, "w", KEY, S.COMPLETED, None, T0, [WorkerOutcome("w", WorkerStatus.WROTE)])
    assert not await store.finish_and_close(job, "w", KEY, S.COMPLETED, None, T0)  # finished: no longer held
    record, taken = await store.take(*KEY)
    assert not taken and record is not None and (record.state, record.attempts) == (S.COMPLETED, 1)
    assert await _state(store) is S.COMPLETED


async def check_a_refused_move_raises_and_rolls_back_its_transaction(
    store: ReflectionStore, queue: ReflectionQueue
) -> None:
    await _queued(store)
    job = await _claimed(queue)
    with pytest.raises(IllegalTransition):  # never taken: it cannot be closed, and its job stays claimed
        await store.finish_and_close(job, "w", KEY, S.GATED, "no_role", T0)
    assert await _state(store) is S.QUEUED
    assert not await store.finish_and_close(job, "w-2", KEY, S.GATED, "no_role", T0)  # not the holder
    await store.take(*KEY)
    with pytest.raises(IllegalTransition):
        async with store.transaction() as tx:
            assert await store.retrying(tx, KEY, "rpc_unavailable: x", T0 + timedelta(seconds=10))
            await store.defer(tx, KEY, "no_budget", T0)  # RETRYING -> DEFERRED is refused
    assert await _state(store) is S.RUNNING  # the retrying move went with it
    with pytest.raises(ValueError):
        await store.finish_and_close(job, "w", KEY, S.DEFERRED, None, T0)  # a close ends a pass, it does not defer
    assert await store.finish_and_close(job, "w", KEY, S.GATED, "no_role", T0)  # the job was held throughout
    await _record(store, state=S.GATED, gate="no_role")


async def check_retry_defer_and_dead_letter_keep_what_they_say(store: ReflectionStore, queue: ReflectionQueue) -> None:
    await _queued(store)
    await store.take(*KEY)
    until = T0 + timedelta(seconds=10)
    outcomes = [WorkerOutcome("a", WorkerStatus.WROTE), WorkerOutcome("b", WorkerStatus.RETRYING, failure="timeout: x")]
    async with store.transaction() as tx:
        assert await store.retrying(tx, KEY, "b: timeout: x", until, outcomes)
    await _record(store, state=S.RETRYING, reason="b: timeout: x", next_attempt_time=until, workers=outcomes)
    await store.take(*KEY)
    async with store.transaction() as tx:
        assert await store.defer(tx, KEY, "no_budget", until)
    await _record(store, state=S.DEFERRED, gate="no_budget", next_attempt_time=until)
    # Dead-lettered keeping the recorded outcomes (workers None).
    async with store.transaction() as tx:
        assert await store.dead_letter(tx, KEY, "gave up", None, T0)
    await _record(store, state=S.DEAD_LETTERED, reason="gave up", workers=outcomes, next_attempt_time=None)


async def check_a_final_outcome_is_recorded_once(store: ReflectionStore, queue: ReflectionQueue) -> None:
    await _queued(store)
    await store.take(*KEY)
    retry = WorkerOutcome("a", WorkerStatus.RETRYING, failure="rpc_unavailable: down")
    wrote = WorkerOutcome("a", WorkerStatus.WROTE)
    assert await store.put_workers(*KEY, [retry])
    assert await store.put_workers(*KEY, [wrote])  # the unfinished outcome is replaced in place
    assert not await store.put_workers(*KEY, [WorkerOutcome("a", WorkerStatus.NOTHING)])  # a stale late result
    assert not await store.put_workers(*KEY, [wrote])
    assert await store.put_workers(*KEY, [WorkerOutcome("b", WorkerStatus.SKIPPED, gate="g")])
    record = await _record(store)
    assert [(w.worker, w.status) for w in record.workers] == [
        ("a", WorkerStatus.WROTE),
        ("b", WorkerStatus.SKIPPED),
    ]
    assert not await store.put_workers("acme", "agent-1", "gone", [wrote])


async def check_a_handed_back_pass_waits_again_and_a_waiting_one_stays(
    store: ReflectionStore, queue: ReflectionQueue
) -> None:
    await _queued(store)
    async with store.transaction() as tx:
        assert not await store.requeued(tx, KEY)  # not taken yet: it already waits
    await store.take(*KEY)
    async with store.transaction() as tx:
        assert await store.requeued(tx, KEY)
    assert await _state(store) is S.QUEUED


async def check_a_move_of_a_record_that_is_gone_moves_nothing(store: ReflectionStore, queue: ReflectionQueue) -> None:
    gone = TurnKey("acme", "agent-1", "erased")
    await _queued(store)
    # A claimed job whose record is gone (erased, past retention) finishes alone.
    assert await store.finish_and_close(await _claimed(queue), "w", gone, S.COMPLETED, None, T0)
    await _record(store, state=S.QUEUED)
    async with store.transaction() as tx:
        assert not await store.retrying(tx, gone, "r", T0)
        assert not await store.defer(tx, gone, "no_budget", T0)
        assert not await store.dead_letter(tx, gone, "r", None, T0)
        assert not await store.requeued(tx, gone)
    assert await store.get(*gone) is None


async def check_records_page_newest_first(store: ReflectionStore, queue: ReflectionQueue) -> None:
    for i in range(3):
        await _queued(store, ("acme", "agent-1", f"run-{i}"), T0 + timedelta(minutes=i))
    await _queued(store, ("acme", "agent-2", "run-9"), T0)
    first = await store.page("acme", "agent-1", None, 2)
    assert [r.turn_id for r in first] == ["run-2", "run-1"]
    last = first[-1]
    assert last.submit_time is not None
    rest = await store.page("acme", "agent-1", (last.submit_time, last.turn_id), 2)
    assert [r.turn_id for r in rest] == ["run-0"]
    assert await store.count("acme", "agent-1") == 3


CHECKS = [
    check_a_record_is_queued_once_and_a_take_counts_an_attempt,
    check_a_final_record_is_not_taken_again,
    check_a_refused_move_raises_and_rolls_back_its_transaction,
    check_retry_defer_and_dead_letter_keep_what_they_say,
    check_a_final_outcome_is_recorded_once,
    check_a_handed_back_pass_waits_again_and_a_waiting_one_stays,
    check_a_move_of_a_record_that_is_gone_moves_nothing,
    check_records_page_newest_first,
]


@pytest.mark.parametrize("check", CHECKS, ids=[c.__name__ for c in CHECKS])
async def test_the_fake_store_keeps_the_promises(check) -> None:  # type: ignore[no-untyped-def]
    db = FakeReflectionDb()
    await check(db.store, db.queue)
