"""An in-memory job queue (``libs.common.jobs.JobQueue``) and a fake database whose transaction
covers the queue and a store's own state: a transaction that raises leaves neither moved, as one
Postgres transaction would. The stores' fakes of the queue families (reflection, erasure, session
learning checks) build on it.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from libs.common.jobs import Job, JobState


@dataclass
class FakeJob:
    job: Job
    state: JobState = JobState.QUEUED
    run_after: datetime | None = None
    locked_by: str | None = None
    locked_until: datetime | None = None
    reason: str | None = None


class FakeJobQueue:
    """``libs.common.jobs.JobQueue`` in memory: one job per (kind, company, key); a claim counts an
    attempt and takes due jobs oldest first (a lapsed claim too, with ``reclaim_lapsed``); every
    move of a claimed job is fenced by its holder and attempt, as the SQL's ``_HELD`` is."""

    def __init__(self) -> None:
        self.jobs: dict[int, FakeJob] = {}
        self._next_id = 1

    async def enqueue(
        self,
        conn: object,
        *,
        kind: str,
        key: str,
        company: str,
        seat: str,
        payload: bytes,
        trace_carrier: dict[str, str],
        now: datetime,
        run_after: datetime | None = None,
    ) -> int | None:
        if any((j.job.kind, j.job.company, j.job.key) == (kind, company, key) for j in self.jobs.values()):
            return None
        job_id, self._next_id = self._next_id, self._next_id + 1
        job = Job(job_id, kind, key, company, seat, payload, dict(trace_carrier), 0, now)
        self.jobs[job_id] = FakeJob(job, run_after=run_after or now)
        return job_id

    async def claim_many(
        self, kind: str, worker: str, now: datetime, lease_seconds: float, limit: int, *, reclaim_lapsed: bool = True
    ) -> list[Job]:
        due = [
            j
            for j in self.jobs.values()
            if j.job.kind == kind
            and j.run_after is not None
            and j.run_after <= now
            and (
                j.state == JobState.QUEUED
                or (
                    reclaim_lapsed
                    and j.state == JobState.RUNNING
                    and j.locked_until is not None
                    and j.locked_until < now
                )
            )
        ]
        due.sort(key=lambda j: (j.run_after or now, j.job.id))
        taken = []
        for j in due[: max(0, limit)]:
            j.job = dataclasses.replace(j.job, attempts=j.job.attempts + 1)
            j.state, j.locked_by, j.locked_until = JobState.RUNNING, worker, now + timedelta(seconds=lease_seconds)
            taken.append(j.job)
        return taken

    def _held(self, job: Job, worker: str) -> FakeJob | None:
        j = self.jobs.get(job.id)
        if j is None or j.state != JobState.RUNNING or j.locked_by != worker or j.job.attempts != job.attempts:
            return None
        return j

    async def renew(self, job: Job, worker: str, now: datetime, lease_seconds: float) -> bool:
        j = self._held(job, worker)
        if j is not None:
            j.locked_until = now + timedelta(seconds=lease_seconds)
        return j is not None

    async def finish(self, conn: object, job: Job, worker: str, now: datetime) -> bool:
        j = self._held(job, worker)
        if j is not None:
            j.state, j.locked_by, j.locked_until = JobState.DONE, None, None
        return j is not None

    async def defer(self, conn: object, job: Job, worker: str, until: datetime) -> bool:
        j = self._held(job, worker)
        if j is not None:
            j.state, j.run_after, j.locked_by, j.locked_until = JobState.QUEUED, until, None, None
            j.job = dataclasses.replace(j.job, attempts=j.job.attempts - 1)  # not now is not a fault
        return j is not None

    async def retry(self, conn: object, job: Job, worker: str, until: datetime, reason: str) -> bool:
        j = self._held(job, worker)
        if j is not None:
            j.state, j.run_after, j.reason, j.locked_by, j.locked_until = JobState.QUEUED, until, reason, None, None
        return j is not None

    async def dead_letter(self, conn: object, job: Job, worker: str, now: datetime, reason: str) -> bool:
        j = self._held(job, worker)
        if j is not None:
            j.state, j.reason, j.locked_by, j.locked_until = JobState.DEAD, reason, None, None
        return j is not None

    async def claim(
        self, kind: str, worker: str, now: datetime, lease_seconds: float, *, reclaim_lapsed: bool = True
    ) -> Job | None:
        jobs = await self.claim_many(kind, worker, now, lease_seconds, 1, reclaim_lapsed=reclaim_lapsed)
        return jobs[0] if jobs else None

    async def pending(self, kind: str) -> int:
        return sum(
            1 for j in self.jobs.values() if j.job.kind == kind and j.state in (JobState.QUEUED, JobState.RUNNING)
        )

    async def held(self, worker: str, jobs: Sequence[Job]) -> set[tuple[int, int]]:
        return {(job.id, job.attempts) for job in jobs if self._held(job, worker) is not None}


class FakeDb:
    """A fake database: ``state`` (the subclass's own tables) and ``queue``, rolled back together."""

    state: Any

    def __init__(self) -> None:
        self.queue = FakeJobQueue()
        self.commits = 0
        self.rollbacks = 0

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[FakeDb]:
        saved = copy.deepcopy((self.state, self.queue.jobs))
        try:
            yield self
        except BaseException:
            self.state, self.queue.jobs = saved
            self.rollbacks += 1
            raise
        self.commits += 1

    def job(self) -> FakeJob:
        """The one job queued (a test of one job's life)."""
        (job,) = self.queue.jobs.values()
        return job
