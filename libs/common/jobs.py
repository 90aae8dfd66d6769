"""The one durable queue of background work: rows of ``background_jobs`` claimed with
``FOR UPDATE SKIP LOCKED``, woken by LISTEN/NOTIFY with polling as the backstop (the pgqueuer /
procrastinate model). Each job family is a ``kind``: ``reflection`` (a finished turn) and
``learning`` (a session learning check).

A claim is a lease: its holder renews it while it works. What becomes of a claim whose holder
stopped renewing (a crash, a SIGKILL) is the family's choice:

- ``claim(..., reclaim_lapsed=True)`` takes it again (the reflector: its receivers are idempotent,
  so a redo writes nothing twice);
- ``claim(..., reclaim_lapsed=False)`` leaves it, and ``interrupt_lapsed`` reports it as
  ``INTERRUPTED`` (session learning: an interrupted check is reported, never silently replayed).

Every transition after a claim is guarded by the holder *and* the claim's ``attempts`` (each
claim counts one), so a holder whose lease lapsed and was taken by another can change nothing: a
stale holder's ``finish`` returns False. A job is queued once per ``(kind, company, key)``: the
durable duplicate gate.

A claim can also be revoked: an erasure empties or deletes the jobs of the person it forgets,
clearing their claims, and NOTIFYs ``revoked:<kind>`` (:func:`revoked_payload`) in the same
statement. Every worker process of that kind re-checks every claim it holds at once, in one query
(:class:`HeldClaims`), and stops the work of any it no longer holds, as a claim found lost at
renewal is stopped: a pass reflecting her turn writes nothing more of hers once the erasure has
taken it, instead of going on until its next renewal (a third of the lease) and writing after the
erasure's verification. The renewal stays the backstop for a notice that reached nobody.

A claim its own worker settles (finishes, retries, defers, dead-letters) is no longer held either,
and that is no revocation: the worker says so (:meth:`HeldClaims.settling`) before its settle
statement, and neither a re-check nor a renewal then stops the rest of its work (its closing event,
its bookkeeping) after that statement committed.

Attempts bound retries: ``retry`` (a transient fault) keeps the attempt counted, ``defer`` (not
now, e.g. no budget) gives it back, and the caller dead-letters once its own limit is reached.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, ClassVar, NotRequired, Protocol, TypedDict, Unpack

import asyncpg

from libs.common.clock import Clock

__all__ = [
    "FINISHED", "HELD_FOR_UPDATE", "NOTIFY_CHANNEL", "SQL", "ClaimLeaseConfig", "ClaimManyQueue", "ClaimQueue",
    "ClaimingWorker", "EnqueueQueue", "HeldClaim", "HeldClaims", "HeldQueue", "Job", "JobQueue", "JobState", "NewJob",
    "PendingQueue", "RenewQueue", "SettleQueue", "drain_claimed", "enqueue_args", "enqueue_sql", "keep_claim",
    "listen", "revoked_payload", "run_claimed", "serve",
]  # fmt: skip

_log = logging.getLogger(__name__)

NOTIFY_CHANNEL = "background_jobs"
"""The LISTEN/NOTIFY channel; the payload is the job's kind (one was queued) or
:func:`revoked_payload` of it (claims of that kind were revoked)."""

_REVOKED = "revoked:"


def revoked_payload(kind: str) -> str:
    """The NOTIFY payload that tells the workers of ``kind`` some of its claims were revoked (an
    erasure emptied or deleted their jobs): each re-checks the claims it holds (:class:`HeldClaims`).
    A statement that revokes claims sends it with ``pg_notify`` itself, so it goes out at its commit."""
    return _REVOKED + kind


class JobState(StrEnum):
    QUEUED = "queued"
    """Waiting for its ``run_after`` (new, retried or deferred)."""
    RUNNING = "running"
    """Claimed; its holder renews the lease while it works."""
    DONE = "done"
    DEAD = "dead"
    """Dead-lettered: given up, with the reason kept."""
    INTERRUPTED = "interrupted"
    """Its holder stopped mid-run and the family reports that rather than replaying it."""


@dataclass(frozen=True)
class Job:
    id: int
    kind: str
    key: str
    company: str
    seat: str
    payload: bytes
    trace_carrier: dict[str, str]
    attempts: int
    """Claims that counted, this one included (the fence of every transition this claim makes)."""
    create_time: datetime


class NewJob(TypedDict):
    """A job to queue (``JobQueue.enqueue``'s keywords, stated once for the queue and its ports)."""

    kind: str
    key: str
    """With ``kind`` and ``company``, the durable duplicate gate."""
    company: str
    seat: str
    payload: bytes
    trace_carrier: dict[str, str]
    now: datetime
    run_after: NotRequired[datetime | None]
    """Not before (default ``now``)."""


_JOB = "id, kind, key, company, seat, payload, trace_carrier, attempts, create_time"
# Every transition of a claim: still held by this worker, under this very claim.
_HELD = "id = $1 AND locked_by = $2 AND attempts = $3 AND state = 'running'"
FINISHED = "state = 'done', finish_time = $4, locked_by = NULL, locked_until = NULL"
"""A finish's changes (``SQL["finish"]``; $4 the time)."""
HELD_FOR_UPDATE = f"SELECT id FROM background_jobs WHERE {_HELD} FOR UPDATE"
"""The claim ($1 id, $2 holder, $3 attempts), locked, when still held: with ``FINISHED``, what a
family whose own record moves with its job composes into one statement that moves both (the
reflector's ``finish_and_close``): one round trip and one commit instead of a transaction's four."""


def enqueue_sql(beside: str = "") -> str:
    """The enqueue statement (parameters: :func:`enqueue_args`): the row and its wake-up in one round
    trip, the NOTIFY sent (at commit) only when a row was inserted. ``beside``: further common table
    expressions (each starting with a comma) that read ``queued`` (the job's id; no row when it was
    queued before) to write a family's own row with its job in the same statement."""
    return f"""
        WITH queued AS (
            INSERT INTO background_jobs (kind, key, company, seat, payload, trace_carrier, run_after, create_time)
            VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7, $8)
            ON CONFLICT (kind, company, key) DO NOTHING RETURNING id){beside}
        SELECT id, pg_notify($9, $1) FROM queued"""


def enqueue_args(job: NewJob, channel: str = NOTIFY_CHANNEL) -> list[Any]:
    """:func:`enqueue_sql`'s parameters $1–$9 for ``job``, woken on ``channel``."""
    now = job["now"]
    return [
        job["kind"],
        job["key"],
        job["company"],
        job["seat"],
        job["payload"],
        json.dumps(job["trace_carrier"]),
        job.get("run_after") or now,
        now,
        channel,
    ]


SQL = {
    "enqueue": enqueue_sql(),
    "get": f"""
        SELECT {_JOB}, state, reason FROM background_jobs WHERE kind = $1 AND company = $2 AND key = $3""",
    "claim": f"""
        UPDATE background_jobs SET state = 'running', locked_by = $2, locked_until = $4, attempts = attempts + 1
        WHERE id = (
            SELECT id FROM background_jobs
            WHERE kind = $1 AND run_after <= $3
              AND (state = 'queued' OR ($5 AND state = 'running' AND locked_until < $3))
            ORDER BY run_after, id
            FOR UPDATE SKIP LOCKED LIMIT 1)
        RETURNING {_JOB}""",
    # Up to $6 due jobs in one statement (a worker with room for several turns claims them
    # together); each counts its own attempt, exactly as ``claim`` does. ``picked_after`` orders
    # them as ``claim`` would have taken them one by one.
    "claim_many": f"""
        WITH picked AS (
            SELECT id, run_after FROM background_jobs
            WHERE kind = $1 AND run_after <= $3
              AND (state = 'queued' OR ($5 AND state = 'running' AND locked_until < $3))
            ORDER BY run_after, id
            FOR UPDATE SKIP LOCKED LIMIT $6)
        UPDATE background_jobs j SET state = 'running', locked_by = $2, locked_until = $4, attempts = j.attempts + 1
        FROM picked WHERE j.id = picked.id
        RETURNING {", ".join("j." + c for c in _JOB.split(", "))}, picked.run_after AS picked_after""",
    "renew": f"UPDATE background_jobs SET locked_until = $4 WHERE {_HELD}",
    "finish": f"UPDATE background_jobs SET {FINISHED} WHERE {_HELD}",
    "defer": f"""
        UPDATE background_jobs SET state = 'queued', run_after = $4, attempts = attempts - 1,
               locked_by = NULL, locked_until = NULL
        WHERE {_HELD}""",
    "retry": f"""
        UPDATE background_jobs SET state = 'queued', run_after = $4, reason = $5, locked_by = NULL, locked_until = NULL
        WHERE {_HELD}""",
    "dead_letter": f"""
        UPDATE background_jobs SET state = 'dead', finish_time = $4, reason = $5, locked_by = NULL, locked_until = NULL
        WHERE {_HELD}""",
    "interrupt_lapsed": f"""
        UPDATE background_jobs SET state = 'interrupted', finish_time = $2, reason = $3,
               locked_by = NULL, locked_until = NULL
        WHERE kind = $1 AND state = 'running' AND locked_until < $2
        RETURNING {_JOB}""",
    "pending": "SELECT count(*) FROM background_jobs WHERE kind = $1 AND state IN ('queued', 'running')",
    # Which of a worker's claims ($2 ids, $3 their attempts) it still holds: one query for them all.
    "held": """
        SELECT j.id, j.attempts FROM background_jobs j
        JOIN unnest($2::bigint[], $3::int[]) AS h(id, attempts) ON j.id = h.id AND j.attempts = h.attempts
        WHERE j.locked_by = $1 AND j.state = 'running'""",
}

_INTERRUPTED = "its worker stopped before it finished (the claim lapsed)"


def _job(row: asyncpg.Record) -> Job:
    carrier = row["trace_carrier"]
    return Job(
        id=row["id"],
        kind=row["kind"],
        key=row["key"],
        company=row["company"],
        seat=row["seat"],
        payload=bytes(row["payload"]),
        trace_carrier=json.loads(carrier) if isinstance(carrier, str) else dict(carrier),
        attempts=row["attempts"],
        create_time=row["create_time"],
    )


def _changed(status: str) -> bool:
    return status.endswith(" 1")


class JobQueue:
    def __init__(self, pool: asyncpg.Pool, notify_channel: str = NOTIFY_CHANNEL):
        self._pool = pool
        self._channel = notify_channel

    async def enqueue(self, conn: asyncpg.Connection, **job: Unpack[NewJob]) -> int | None:
        """Queue a job inside the caller's transaction (it lands, and wakes the workers, only if
        that commits); its id, or None when ``(kind, company, key)`` is already queued or ran."""
        job_id: int | None = await conn.fetchval(SQL["enqueue"], *enqueue_args(job, self._channel))
        return job_id

    async def get(self, kind: str, company: str, key: str) -> tuple[Job, JobState, str | None] | None:
        row = await self._pool.fetchrow(SQL["get"], kind, company, key)
        if row is None:
            return None
        return _job(row), JobState(row["state"]), row["reason"]

    async def claim(
        self, kind: str, worker: str, now: datetime, lease_seconds: float, *, reclaim_lapsed: bool = True
    ) -> Job | None:
        """Take the next due job of ``kind`` (oldest ``run_after`` first) for ``lease_seconds``.
        With ``reclaim_lapsed`` a running job whose lease lapsed is taken too."""
        row = await self._pool.fetchrow(
            SQL["claim"], kind, worker, now, now + timedelta(seconds=lease_seconds), reclaim_lapsed
        )
        return _job(row) if row is not None else None

    async def claim_many(
        self, kind: str, worker: str, now: datetime, lease_seconds: float, limit: int, *, reclaim_lapsed: bool = True
    ) -> list[Job]:
        """Take up to ``limit`` due jobs of ``kind`` in one statement, in the order :meth:`claim`
        would take them one by one (oldest ``run_after`` first); each is its own claim, with its own
        attempt and fence, exactly as if claimed alone."""
        if limit < 1:
            return []
        rows = await self._pool.fetch(
            SQL["claim_many"], kind, worker, now, now + timedelta(seconds=lease_seconds), reclaim_lapsed, limit
        )
        rows = sorted(rows, key=lambda r: (r["picked_after"], r["id"]))
        return [_job(r) for r in rows]

    async def renew(self, job: Job, worker: str, now: datetime, lease_seconds: float) -> bool:
        """Extend the lease; False when this claim is no longer held (the caller stops)."""
        status = await self._pool.execute(
            SQL["renew"], job.id, worker, job.attempts, now + timedelta(seconds=lease_seconds)
        )
        return _changed(status)

    async def finish(self, conn: asyncpg.Connection, job: Job, worker: str, now: datetime) -> bool:
        """Mark it done inside the caller's transaction; False if this claim is no longer held."""
        return _changed(await conn.execute(SQL["finish"], job.id, worker, job.attempts, now))

    async def defer(self, conn: asyncpg.Connection, job: Job, worker: str, until: datetime) -> bool:
        """Back to QUEUED until ``until``, the attempt given back (not now is not a fault)."""
        return _changed(await conn.execute(SQL["defer"], job.id, worker, job.attempts, until))

    async def retry(self, conn: asyncpg.Connection, job: Job, worker: str, until: datetime, reason: str) -> bool:
        """Back to QUEUED until ``until`` after a retryable fault; the attempt stays counted and
        ``reason`` is kept."""
        return _changed(await conn.execute(SQL["retry"], job.id, worker, job.attempts, until, reason))

    async def dead_letter(self, conn: asyncpg.Connection, job: Job, worker: str, now: datetime, reason: str) -> bool:
        """Give up on it (DEAD, never claimed again), keeping ``reason``."""
        return _changed(await conn.execute(SQL["dead_letter"], job.id, worker, job.attempts, now, reason))

    async def interrupt_lapsed(self, kind: str, now: datetime) -> list[Job]:
        """Every RUNNING job of ``kind`` whose lease lapsed becomes INTERRUPTED; returns them (for a
        family that claims with ``reclaim_lapsed=False`` to report)."""
        rows = await self._pool.fetch(SQL["interrupt_lapsed"], kind, now, _INTERRUPTED)
        return [_job(r) for r in rows]

    async def pending(self, kind: str) -> int:
        """Jobs of ``kind`` not yet finished (queued, or running)."""
        return int(await self._pool.fetchval(SQL["pending"], kind))

    async def held(self, worker: str, jobs: Sequence[Job]) -> set[tuple[int, int]]:
        """Which of ``jobs`` (claims of ``worker``) are still held, as (id, attempts)."""
        rows = await self._pool.fetch(SQL["held"], worker, [j.id for j in jobs], [j.attempts for j in jobs])
        return {(r["id"], r["attempts"]) for r in rows}


# The queue's operations as ``typing.Protocol``s, stated once here: a service's port of the queue
# composes the ones its use cases need (``JobQueue`` is the adapter; tests/unit/fakes/jobs.py the
# in-memory one). ``conn`` is the caller's transaction handle, passed through and never looked into.


class RenewQueue(Protocol):
    """What keeping a claim needs of a queue (``JobQueue``, or a service's port of it)."""

    async def renew(self, job: Job, worker: str, now: datetime, lease_seconds: float) -> bool: ...


class ClaimQueue(RenewQueue, Protocol):
    """What a worker's claim loop needs of its queue."""

    async def claim(
        self, kind: str, worker: str, now: datetime, lease_seconds: float, *, reclaim_lapsed: bool = ...
    ) -> Job | None: ...


class EnqueueQueue(Protocol):
    """Queueing a job inside the caller's transaction (:meth:`JobQueue.enqueue`)."""

    async def enqueue(self, conn: Any, **job: Unpack[NewJob]) -> int | None: ...


class ClaimManyQueue(RenewQueue, Protocol):
    """A worker that claims several jobs at once (:meth:`JobQueue.claim_many`) and renews each."""

    async def claim_many(
        self, kind: str, worker: str, now: datetime, lease_seconds: float, limit: int, *, reclaim_lapsed: bool = True
    ) -> list[Job]: ...


class SettleQueue(Protocol):
    """Every move of a claimed job inside the caller's transaction, fenced by the claim: False when
    it is no longer held."""

    async def finish(self, conn: Any, job: Job, worker: str, now: datetime) -> bool: ...

    async def defer(self, conn: Any, job: Job, worker: str, until: datetime) -> bool: ...

    async def retry(self, conn: Any, job: Job, worker: str, until: datetime, reason: str) -> bool: ...

    async def dead_letter(self, conn: Any, job: Job, worker: str, now: datetime, reason: str) -> bool: ...


class PendingQueue(Protocol):
    """How many jobs of a kind are not finished (:meth:`JobQueue.pending`)."""

    async def pending(self, kind: str) -> int: ...


class HeldQueue(Protocol):
    """Which of a worker's claims it still holds (:meth:`JobQueue.held`)."""

    async def held(self, worker: str, jobs: Sequence[Job]) -> set[tuple[int, int]]: ...


@dataclass(eq=False)
class HeldClaim:
    """One claim a worker process holds, watched in its :class:`HeldClaims`."""

    job: Job
    lost: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when a re-check found the claim revoked (:func:`keep_claim` then cancels the work)."""
    settling: bool = False
    """Its own worker is settling it (:meth:`HeldClaims.settling`): not being held any more is then
    its own doing, not a revocation."""


class HeldClaims:
    """The claims one worker process holds, re-checked together when claims of its kind are revoked.

    An erasure that takes a job from its holder (empties or deletes it) NOTIFYs
    :func:`revoked_payload`; :func:`listen` hands it to :meth:`revoked`, and :meth:`watch` asks the
    queue once which claims this process still holds and sets the ``lost`` event of each it does
    not, which :func:`keep_claim` turns into the work's cancellation at once. Each (re)connect of the
    listener counts as a notice too (one sent meanwhile reached nobody); the lease's renewal stays
    the backstop. A claim its worker is settling (:meth:`settling`) is not re-checked: a notice
    about someone else's job must not stop the end of a job this worker just finished."""

    def __init__(self) -> None:
        self._held: dict[tuple[int, int], HeldClaim] = {}
        self._notice = asyncio.Event()

    @contextlib.contextmanager
    def holding(self, job: Job) -> Iterator[HeldClaim]:
        """Watch ``job``'s claim while the block runs; yields it (its ``lost`` event is set when it
        is found revoked)."""
        key = (job.id, job.attempts)
        claim = HeldClaim(job)
        self._held[key] = claim
        try:
            yield claim
        finally:
            self._held.pop(key, None)

    @contextlib.contextmanager
    def settling(self, job: Job) -> Iterator[None]:
        """Around a worker's own settle of ``job`` (its finish, retry, defer or dead-letter, and the
        transaction that commits it): from here on the claim is not held because its worker let it
        go, so neither a re-check nor a renewal stops the work that follows (its closing event, its
        bookkeeping). Marked *before* the statement, so a re-check that reads the committed settle
        always finds the mark; a block that raises (the settle did not commit) unmarks it, and the
        claim is watched again. A job this process does not watch is settled as usual."""
        claim = self._held.get((job.id, job.attempts))
        if claim is None:
            yield
            return
        claim.settling = True
        try:
            yield
        except BaseException:
            claim.settling = False
            raise

    def revoked(self) -> None:
        """Claims of this kind were revoked somewhere: re-check them all (:meth:`watch`)."""
        self._notice.set()

    async def recheck(self, queue: HeldQueue, worker: str) -> int:
        """Ask which claims are still held and mark the others lost; how many were."""
        held = [c for c in self._held.values() if not c.settling]
        if not held:
            return 0
        still = await queue.held(worker, [c.job for c in held])
        lost = 0
        for claim in held:
            job = claim.job
            # Settled meanwhile by its worker (the mark precedes the statement the query may have
            # read): its own doing, not a revocation.
            if (job.id, job.attempts) not in still and not claim.settling:
                _log.warning("the claim on %s job %s was revoked; stopping its work", job.kind, job.id)
                claim.lost.set()
                lost += 1
        return lost

    async def watch(self, queue: HeldQueue, worker: str) -> None:
        """Re-check the held claims at every notice; runs until cancelled. A re-check the database
        did not answer leaves them to their renewal."""
        while True:
            await self._notice.wait()
            self._notice.clear()
            try:
                await self.recheck(queue, worker)
            except Exception as exc:
                _log.warning("could not re-check the claims held after a revocation (%s); their renewal will", exc)


async def keep_claim(
    queue: RenewQueue,
    job: Job,
    worker: str,
    clock: Clock,
    lease_seconds: float,
    work: asyncio.Task[Any],
    claim: HeldClaim | None = None,
) -> bool:
    """Renew ``job``'s lease every third of it while ``work`` runs. A renewal the database did not
    answer is tried again at the next beat (the lease still covers two); a claim no longer held (it
    lapsed and another worker took it) cancels ``work`` and returns False, so the caller can tell a
    lost claim from any other cancellation. So does ``claim.lost`` set (:class:`HeldClaims` found
    the claim revoked), at once rather than at the next beat. A claim its worker is settling
    (:meth:`HeldClaims.settling`) is neither renewed nor lost: what follows its settle runs to its
    end. Every queue family's worker runs this one loop."""
    while True:
        if claim is None:
            await asyncio.sleep(lease_seconds / 3)
        else:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(claim.lost.wait(), lease_seconds / 3)
            if claim.lost.is_set():
                work.cancel()
                return False
            if claim.settling:
                continue
        try:
            held = await queue.renew(job, worker, clock.now(), lease_seconds)
        except Exception as exc:
            _log.warning("could not renew the claim on %s job %s: %s", job.kind, job.id, exc)
            continue
        if not held and not (claim is not None and claim.settling):  # settled meanwhile: its own doing
            work.cancel()
            return False


async def run_claimed(
    queue: RenewQueue,
    job: Job,
    worker: str,
    clock: Clock,
    lease_seconds: float,
    process: Callable[[Job], Coroutine[Any, Any, Any]],
    *,
    when_lost: str,
    claims: HeldClaims | None = None,
) -> None:
    """Run ``process(job)`` under its renewed claim, watched in ``claims`` (its revocation stops the
    work at once). A lost claim stops the work and is logged with ``when_lost`` (what becomes of the
    job: the family's rule); a revoked one stops it too (its job was erased: nothing becomes of it);
    a failure to record is logged and the claim left to lapse (the family's lapse rule then
    applies). ``process`` marks its own settle of the job in ``claims``
    (:meth:`HeldClaims.settling`). Cancellation of the caller propagates."""
    with (claims if claims is not None else HeldClaims()).holding(job) as claim:
        work = asyncio.create_task(process(job))
        renew = asyncio.create_task(keep_claim(queue, job, worker, clock, lease_seconds, work, claim))
        try:
            await work
        except asyncio.CancelledError:
            if not (renew.done() and renew.result() is False):
                raise
            if claim.lost.is_set():
                _log.warning("%s job %s was revoked (erased); its work stopped", job.kind, job.id)
            else:
                _log.warning("lost the claim on %s job %s; %s", job.kind, job.id, when_lost)
        except Exception:
            _log.exception("%s job %s could not be recorded; its claim will lapse", job.kind, job.id)
        finally:
            renew.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renew


async def drain_claimed(
    queue: ClaimQueue,
    kind: str,
    worker: str,
    clock: Clock,
    lease_seconds: float,
    process: Callable[[Job], Coroutine[Any, Any, Any]],
    *,
    reclaim_lapsed: bool,
    when_lost: str,
    claims: HeldClaims | None = None,
) -> int:
    """Run every job of ``kind`` claimable now, one at a time, each under its renewed claim
    (``run_claimed``, watched in ``claims``); returns how many were taken. ``reclaim_lapsed``: a
    lapsed claim is taken again (the job resumes) — the family's lapse rule."""
    taken = 0
    while job := await queue.claim(kind, worker, clock.now(), lease_seconds, reclaim_lapsed=reclaim_lapsed):
        taken += 1
        await run_claimed(queue, job, worker, clock, lease_seconds, process, when_lost=when_lost, claims=claims)
    return taken


class ClaimLeaseConfig(Protocol):
    """The knobs of a worker that claims jobs one at a time (a family's config section)."""

    @property
    def claim_lease_seconds(self) -> float: ...


class ClaimingWorker:
    """A worker that runs its family's jobs one at a time, each under its renewed claim: the
    family states its rule as class attributes (``kind``; ``reclaim_lapsed`` and ``when_lost``: what
    becomes of a lapsed or lost claim) and its ``process``; ``drain`` is the same for every family.
    A mixin for a dataclass whose fields hold the parts named below. A family whose jobs an erasure
    can take from their holder gives itself ``_claims`` (a :class:`HeldClaims`) and watches it."""

    kind: ClassVar[str]
    reclaim_lapsed: ClassVar[bool]
    when_lost: ClassVar[str]
    queue: ClaimQueue
    config: ClaimLeaseConfig
    clock: Clock
    worker_id: str
    _wake: asyncio.Event
    _claims: HeldClaims | None = None

    def wake(self) -> None:
        self._wake.set()

    async def process(self, job: Job) -> Any:
        """Run one claimed job (the family's work)."""
        raise NotImplementedError

    async def drain(self) -> int:
        """Run every job of ``kind`` claimable now, one at a time; returns how many were taken."""
        return await drain_claimed(
            self.queue,
            self.kind,
            self.worker_id,
            self.clock,
            self.config.claim_lease_seconds,
            self.process,
            reclaim_lapsed=self.reclaim_lapsed,
            when_lost=self.when_lost,
            claims=self._claims,
        )


async def serve(drain: Callable[[], Awaitable[int]], wake: asyncio.Event, poll_seconds: float, what: str) -> None:
    """A worker's loop: drain, and when nothing was taken wait for a wake (a NOTIFY) or the poll
    interval, the backstop. An unreadable queue is logged and tried again after the wait."""
    while True:
        try:
            taken = await drain()
        except asyncio.CancelledError:
            raise
        except Exception:
            _log.exception("%s queue unreadable; retrying", what)
            taken = 0
        if taken == 0:
            wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), poll_seconds)


async def listen(
    dsn: str,
    kinds: Iterable[str],
    on_wake: Callable[[], object],
    *,
    channel: str = NOTIFY_CHANNEL,
    reconnect_seconds: float = 2.0,
    check_seconds: float = 30.0,
    on_revoke: Callable[[], object] | None = None,
) -> None:
    """Call ``on_wake`` whenever a job of one of ``kinds`` is queued, and ``on_revoke`` whenever
    claims of one of them are revoked (:func:`revoked_payload`); runs until cancelled.

    The wake is an optimisation: the workers poll as the backstop; so is the revocation, which the
    claims' renewal backs. A lost connection (a database restart) is reopened every
    ``reconnect_seconds``, and both are called after each (re)connect, since anything queued or
    revoked meanwhile sent its NOTIFY to nobody. A connection that the socket does not report as
    lost is checked every ``check_seconds``.
    """
    wanted = frozenset(kinds)
    revoked = frozenset(revoked_payload(k) for k in kinds)

    def notified(_conn: object, _pid: int, _channel: str, payload: str) -> None:
        if payload in wanted:
            on_wake()
        elif on_revoke is not None and payload in revoked:
            on_revoke()

    down_logged = False
    while True:
        try:
            conn = await asyncpg.connect(dsn)
        except Exception as exc:  # any failure to connect means "poll until it returns"
            if not down_logged:
                _log.warning("LISTEN %s unavailable (%s); polling until it returns", channel, exc)
                down_logged = True
            await asyncio.sleep(reconnect_seconds)
            continue
        lost = asyncio.Event()
        try:
            conn.add_termination_listener(lambda _c, lost=lost: lost.set())
            await conn.add_listener(channel, notified)
            if down_logged:
                _log.info("LISTEN %s restored", channel)
            down_logged = False
            on_wake()
            if on_revoke is not None:
                on_revoke()
            while not lost.is_set():
                try:
                    await asyncio.wait_for(lost.wait(), check_seconds)
                except TimeoutError:
                    await asyncio.wait_for(conn.execute("SELECT 1"), check_seconds)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the connection failed: reconnect
            _log.warning("LISTEN %s connection failed (%s); reconnecting", channel, exc)
        finally:
            if not conn.is_closed():
                conn.terminate()
        await asyncio.sleep(reconnect_seconds if not lost.is_set() else 0)
