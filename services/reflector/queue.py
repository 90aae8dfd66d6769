"""The durable job queue: Postgres rows claimed with ``FOR UPDATE SKIP LOCKED``, woken by
LISTEN/NOTIFY with polling as the backstop (the pgqueuer / procrastinate model).

A claim is a lease: the holder renews it while it works; a holder that stops (a crash, a SIGKILL)
loses it after ``claim_lease_seconds`` and another worker takes the job. The receivers of every
write are idempotent, so a redo writes nothing twice.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta

import asyncpg

__all__ = ["NOTIFY_CHANNEL", "Job", "JobQueue"]

NOTIFY_CHANNEL = "reflection_jobs"


@dataclass(frozen=True)
class Job:
    id: int
    kind: str
    key: str
    company: str
    seat: str
    payload: bytes
    trace_carrier: dict
    attempts: int


class JobQueue:
    def __init__(self, pool: asyncpg.Pool):
        self._pool = pool

    async def enqueue(
        self,
        conn: asyncpg.Connection,
        kind: str,
        key: str,
        company: str,
        seat: str,
        payload: bytes,
        trace_carrier: dict,
        now: datetime,
    ) -> bool:
        """Queue a job inside the caller's transaction; False when (kind, company, key) exists."""
        row = await conn.fetchrow(
            """INSERT INTO reflection_jobs (kind, key, company, seat, payload, trace_carrier, run_after, create_time)
               VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7, $7)
               ON CONFLICT (kind, company, key) DO NOTHING RETURNING id""",
            kind,
            key,
            company,
            seat,
            payload,
            json.dumps(trace_carrier),
            now,
        )
        if row is not None:
            await conn.execute("SELECT pg_notify($1, $2)", NOTIFY_CHANNEL, kind)
        return row is not None

    async def claim(self, kind: str, worker: str, now: datetime, lease_seconds: float) -> Job | None:
        row = await self._pool.fetchrow(
            """UPDATE reflection_jobs SET state = 'running', locked_by = $2, locked_until = $4,
                      attempts = attempts + 1
               WHERE id = (
                   SELECT id FROM reflection_jobs
                   WHERE kind = $1 AND state <> 'done' AND run_after <= $3
                     AND (state = 'queued' OR locked_until < $3)
                   ORDER BY run_after, id
                   FOR UPDATE SKIP LOCKED LIMIT 1)
               RETURNING id, kind, key, company, seat, payload, trace_carrier, attempts""",
            kind,
            worker,
            now,
            now + timedelta(seconds=lease_seconds),
        )
        if row is None:
            return None
        return Job(
            id=row["id"],
            kind=row["kind"],
            key=row["key"],
            company=row["company"],
            seat=row["seat"],
            payload=bytes(row["payload"]),
            trace_carrier=json.loads(row["trace_carrier"]),
            attempts=row["attempts"],
        )

    async def renew(self, job: Job, worker: str, now: datetime, lease_seconds: float) -> bool:
        status = await self._pool.execute(
            "UPDATE reflection_jobs SET locked_until = $3 WHERE id = $1 AND locked_by = $2 AND state = 'running'",
            job.id,
            worker,
            now + timedelta(seconds=lease_seconds),
        )
        return status.endswith("1")

    async def finish(self, conn: asyncpg.Connection, job: Job, worker: str, now: datetime) -> bool:
        """Mark done inside the caller's transaction; False if this worker no longer holds it."""
        status = await conn.execute(
            """UPDATE reflection_jobs SET state = 'done', finish_time = $3, locked_by = NULL, locked_until = NULL
               WHERE id = $1 AND locked_by = $2 AND state = 'running'""",
            job.id,
            worker,
            now,
        )
        return status.endswith("1")

    async def defer(self, conn: asyncpg.Connection, job: Job, worker: str, until: datetime) -> bool:
        """Put the job back for later (the budget gate); False if this worker no longer holds it."""
        status = await conn.execute(
            """UPDATE reflection_jobs SET state = 'queued', run_after = $3, locked_by = NULL, locked_until = NULL
               WHERE id = $1 AND locked_by = $2 AND state = 'running'""",
            job.id,
            worker,
            until,
        )
        return status.endswith("1")

    async def pending(self, kind: str) -> int:
        return int(
            await self._pool.fetchval("SELECT count(*) FROM reflection_jobs WHERE kind = $1 AND state <> 'done'", kind)
        )
