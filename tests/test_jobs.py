"""The durable queue (libs/common/jobs.py) against real PostgreSQL: what both of its families rely
on — the reflector (reclaims lapsed claims) and session learning (reports them interrupted)."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from libs.common.clock import ManualClock
from libs.common.db import connect_pool
from libs.common.jobs import Job, JobQueue, JobState, listen


@pytest.fixture
async def pool(dsn):
    pool = await connect_pool(dsn, max_size=10)
    yield pool
    await pool.close()


@pytest.fixture
def queue(pool) -> JobQueue:
    return JobQueue(pool)


async def _enqueue(pool, queue: JobQueue, clock: ManualClock, key: str, **kw) -> int | None:  # type: ignore[no-untyped-def]
    kw.setdefault("kind", "learning")
    kw.setdefault("company", "acme")
    async with pool.acquire() as conn, conn.transaction():
        return await queue.enqueue(
            conn,
            key=key,
            seat="ana",
            payload=key.encode(),
            trace_carrier={"traceparent": f"00-{key}"},
            now=clock.now(),
            **kw,
        )


async def _in_tx(pool, op):  # type: ignore[no-untyped-def]
    async with pool.acquire() as conn, conn.transaction():
        return await op(conn)


async def test_a_job_is_queued_once_per_kind_company_and_key(pool, queue, clock):
    first = await _enqueue(pool, queue, clock, "k1")
    assert isinstance(first, int)
    assert await _enqueue(pool, queue, clock, "k1") is None
    assert await _enqueue(pool, queue, clock, "k1", company="globex") not in (None, first)
    assert await _enqueue(pool, queue, clock, "k1", kind="reflection") not in (None, first)
    job, state, reason = await queue.get("learning", "acme", "k1")
    assert (job.id, job.key, job.seat, job.payload, state, reason) == (first, "k1", "ana", b"k1", JobState.QUEUED, None)
    assert job.trace_carrier == {"traceparent": "00-k1"} and job.attempts == 0 and job.create_time == clock.now()
    assert await queue.get("learning", "acme", "nope") is None
    assert await queue.pending("learning") == 2


async def test_a_job_lands_only_with_its_transaction(pool, queue, clock):
    class Rollback(Exception):
        pass

    with pytest.raises(Rollback):
        async with pool.acquire() as conn, conn.transaction():
            kw = {"company": "acme", "seat": "ana", "payload": b"", "trace_carrier": {}, "now": clock.now()}
            assert await queue.enqueue(conn, kind="learning", key="k", **kw)
            raise Rollback
    assert await queue.get("learning", "acme", "k") is None
    assert await queue.claim("learning", "w", clock.now(), 30) is None


async def test_claims_take_due_jobs_oldest_first(pool, queue, clock):
    await _enqueue(pool, queue, clock, "later", run_after=clock.now() + timedelta(minutes=5))
    clock.advance(seconds=1)
    await _enqueue(pool, queue, clock, "b")
    await _enqueue(pool, queue, clock, "c")
    b = await queue.claim("learning", "w", clock.now(), 30)
    c = await queue.claim("learning", "w", clock.now(), 30)
    assert (b.key, c.key) == ("b", "c")
    assert await queue.claim("learning", "w", clock.now(), 30) is None  # "later" is not due
    assert await queue.claim("reflection", "w", clock.now() + timedelta(hours=1), 30) is None  # another kind
    for job in (b, c):
        assert await _in_tx(pool, lambda conn, j=job: queue.finish(conn, j, "w", clock.now()))
    clock.advance(minutes=5)
    later = await queue.claim("learning", "w", clock.now(), 30)
    assert later.key == "later" and later.attempts == 1


async def test_concurrent_claims_take_each_job_exactly_once(pool, queue, clock):
    for i in range(40):
        await _enqueue(pool, queue, clock, f"k{i:02d}")
    taken: list[Job] = []

    async def worker(name: str) -> None:
        while (job := await queue.claim("learning", name, clock.now(), 30)) is not None:
            taken.append(job)
            assert await _in_tx(pool, lambda c, j=job: queue.finish(c, j, name, clock.now()))

    await asyncio.gather(*(worker(f"w{i}") for i in range(6)))
    assert sorted(j.key for j in taken) == [f"k{i:02d}" for i in range(40)]
    assert await queue.pending("learning") == 0


async def test_a_batch_claim_takes_due_jobs_oldest_first_each_its_own_claim(pool, queue, clock):
    """claim_many (the reflector's batches): up to the limit, in claim's order, each job with its
    own attempt and fence — finishing one changes nothing of another."""
    await _enqueue(pool, queue, clock, "later", run_after=clock.now() + timedelta(minutes=5))
    clock.advance(seconds=1)
    for key in ("a", "b", "c"):
        await _enqueue(pool, queue, clock, key)
    assert await queue.claim_many("learning", "w", clock.now(), 30, 0) == []
    first = await queue.claim_many("learning", "w", clock.now(), 30, 2)
    assert [j.key for j in first] == ["a", "b"] and all(j.attempts == 1 for j in first)
    rest = await queue.claim_many("learning", "w", clock.now(), 30, 10)
    assert [j.key for j in rest] == ["c"]  # "later" is not due, "a" and "b" are held
    assert await _in_tx(pool, lambda conn: queue.finish(conn, first[0], "w", clock.now()))
    assert (await queue.get("learning", "acme", "b"))[1] is JobState.RUNNING
    clock.advance(seconds=31)  # b's and c's claims lapse: taken again, each a new attempt
    again = await queue.claim_many("learning", "w2", clock.now(), 30, 10)
    assert [(j.key, j.attempts) for j in again] == [("b", 2), ("c", 2)]
    assert not await _in_tx(pool, lambda conn: queue.finish(conn, first[1], "w", clock.now()))  # stale
    assert await queue.claim_many("learning", "w3", clock.now(), 30, 10, reclaim_lapsed=False) == []


async def test_concurrent_batch_claims_take_each_job_exactly_once(pool, queue, clock):
    for i in range(40):
        await _enqueue(pool, queue, clock, f"k{i:02d}")
    taken: list[Job] = []

    async def worker(name: str) -> None:
        while jobs := await queue.claim_many("learning", name, clock.now(), 30, 3):
            taken.extend(jobs)
            for job in jobs:
                assert await _in_tx(pool, lambda c, j=job: queue.finish(c, j, name, clock.now()))

    await asyncio.gather(*(worker(f"w{i}") for i in range(6)))
    assert sorted(j.key for j in taken) == [f"k{i:02d}" for i in range(40)]
    assert await queue.pending("learning") == 0


async def test_a_renewed_claim_is_kept_and_a_lapsed_one_is_taken_again(pool, queue, clock):
    """reclaim_lapsed=True (the reflector): the lapsed claim goes to another worker, and the stale
    holder can change nothing — not renew, finish, retry, defer or dead-letter."""
    await _enqueue(pool, queue, clock, "k")
    first = await queue.claim("learning", "w1", clock.now(), 10)
    clock.advance(seconds=8)
    assert await queue.renew(first, "w1", clock.now(), 10)
    clock.advance(seconds=8)  # 16 s after the claim, 8 after the renewal: still held
    assert await queue.claim("learning", "w2", clock.now(), 10) is None
    clock.advance(seconds=3)  # the renewed lease lapsed
    second = await queue.claim("learning", "w2", clock.now(), 10)
    assert second is not None and second.id == first.id and second.attempts == 2
    now = clock.now()
    assert not await queue.renew(first, "w1", now, 10)
    assert not await _in_tx(pool, lambda c: queue.finish(c, first, "w1", now))
    assert not await _in_tx(pool, lambda c: queue.retry(c, first, "w1", now, "x"))
    assert not await _in_tx(pool, lambda c: queue.defer(c, first, "w1", now))
    assert not await _in_tx(pool, lambda c: queue.dead_letter(c, first, "w1", now, "x"))
    assert await _in_tx(pool, lambda c: queue.finish(c, second, "w2", now))
    _, state, _ = await queue.get("learning", "acme", "k")
    assert state == JobState.DONE


async def test_the_same_worker_name_cannot_act_on_an_older_claim(pool, queue, clock):
    """The fence is the claim, not only the name: a worker whose own lapsed claim was retaken under
    the same name (another task of one process) cannot finish it with the old claim."""
    await _enqueue(pool, queue, clock, "k")
    old = await queue.claim("learning", "w", clock.now(), 1)
    clock.advance(seconds=2)
    new = await queue.claim("learning", "w", clock.now(), 1)
    assert new.attempts == old.attempts + 1
    assert not await _in_tx(pool, lambda c: queue.finish(c, old, "w", clock.now()))
    assert await _in_tx(pool, lambda c: queue.finish(c, new, "w", clock.now()))


async def test_without_reclaim_a_lapsed_claim_is_reported_interrupted(pool, queue, clock):
    """reclaim_lapsed=False (session learning): a check whose worker stopped is not replayed; it is
    reported INTERRUPTED with its reason, while a live claim and queued work are left alone."""
    await _enqueue(pool, queue, clock, "crashed")
    await _enqueue(pool, queue, clock, "alive")
    crashed = await queue.claim("learning", "w1", clock.now(), 10, reclaim_lapsed=False)
    clock.advance(seconds=5)
    alive = await queue.claim("learning", "w2", clock.now(), 10, reclaim_lapsed=False)
    await _enqueue(pool, queue, clock, "queued")
    assert await queue.interrupt_lapsed("learning", clock.now()) == []  # nothing lapsed yet
    clock.advance(seconds=6)  # crashed's lease lapsed, alive's has 4 s left
    assert await queue.claim("learning", "w3", clock.now(), 10, reclaim_lapsed=False) is not None  # "queued"
    assert await queue.claim("learning", "w3", clock.now(), 10, reclaim_lapsed=False) is None  # not "crashed"
    [interrupted] = await queue.interrupt_lapsed("learning", clock.now())
    assert interrupted.key == "crashed" and interrupted.id == crashed.id
    _, state, reason = await queue.get("learning", "acme", "crashed")
    assert state == JobState.INTERRUPTED and "stopped" in reason
    assert not await queue.renew(crashed, "w1", clock.now(), 10)  # its worker, come back, stops
    assert await queue.claim("learning", "w3", clock.now() + timedelta(hours=1), 10, reclaim_lapsed=False) is None
    assert await queue.renew(alive, "w2", clock.now(), 10)
    assert (await queue.get("learning", "acme", "alive"))[1] == JobState.RUNNING


async def test_defer_gives_the_attempt_back_and_retry_keeps_it_with_its_reason(pool, queue, clock):
    await _enqueue(pool, queue, clock, "k")
    job = await queue.claim("learning", "w", clock.now(), 30)
    until = clock.now() + timedelta(minutes=1)
    assert await _in_tx(pool, lambda c: queue.defer(c, job, "w", until))
    assert await queue.claim("learning", "w", clock.now(), 30) is None  # not before its time
    clock.set(until)
    job = await queue.claim("learning", "w", clock.now(), 30)
    assert job.attempts == 1  # the deferral did not count
    until = clock.now() + timedelta(minutes=1)
    assert await _in_tx(pool, lambda c: queue.retry(c, job, "w", until, "rpc_unavailable: diary down"))
    j, state, reason = await queue.get("learning", "acme", "k")
    assert (state, reason, j.attempts) == (JobState.QUEUED, "rpc_unavailable: diary down", 1)
    assert await queue.pending("learning") == 1
    assert await queue.claim("learning", "w", clock.now(), 30) is None
    clock.set(until)
    job = await queue.claim("learning", "w", clock.now(), 30)
    assert job.attempts == 2  # the retry counted


async def test_a_dead_letter_keeps_its_reason_and_is_never_claimed_again(pool, queue, clock):
    await _enqueue(pool, queue, clock, "k")
    job = await queue.claim("learning", "w", clock.now(), 1)
    assert await _in_tx(pool, lambda c: queue.dead_letter(c, job, "w", clock.now(), "timeout after 5 attempts"))
    _, state, reason = await queue.get("learning", "acme", "k")
    assert (state, reason) == (JobState.DEAD, "timeout after 5 attempts")
    later = clock.now() + timedelta(days=1)
    assert await queue.claim("learning", "w", later, 1) is None
    assert await queue.interrupt_lapsed("learning", later) == []
    assert await queue.pending("learning") == 0
    assert await _enqueue(pool, queue, clock, "k") is None  # still the one job of that key


async def test_listen_wakes_for_its_kinds_only_and_survives_a_lost_connection(dsn, pool, queue, clock):
    wakes: list[int] = []
    woken = asyncio.Event()

    def on_wake() -> None:
        wakes.append(1)
        woken.set()

    async def next_wake() -> int:
        async with asyncio.timeout(20):
            await woken.wait()
        woken.clear()
        return len(wakes)

    task = asyncio.create_task(listen(dsn, ["learning"], on_wake, reconnect_seconds=0.1))
    try:
        assert await next_wake() == 1  # once on connect: anything queued before is looked at
        await _enqueue(pool, queue, clock, "r", kind="reflection")  # not ours
        await _enqueue(pool, queue, clock, "l1")
        # NOTIFYs arrive in commit order, so had the reflection woken us this would be 3.
        assert await next_wake() == 2
        backend = await pool.fetchval(
            """SELECT pid FROM pg_stat_activity
               WHERE datname = current_database() AND query LIKE 'LISTEN%' AND pid <> pg_backend_pid()"""
        )
        assert backend is not None
        await pool.execute("SELECT pg_terminate_backend($1)", backend)
        assert await next_wake() == 3  # reconnected: woken once more for what it may have missed
        await _enqueue(pool, queue, clock, "l2")
        assert await next_wake() == 4
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_a_queue_on_another_channel_wakes_its_own_listeners(dsn, pool, clock):
    other = JobQueue(pool, notify_channel="other_jobs")
    woken = asyncio.Event()
    task = asyncio.create_task(listen(dsn, ["learning"], woken.set, channel="other_jobs"))
    try:
        async with asyncio.timeout(20):
            await woken.wait()  # connected
        woken.clear()
        await _enqueue(pool, other, clock, "k")
        async with asyncio.timeout(20):
            await woken.wait()
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
