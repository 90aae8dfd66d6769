"""PostgreSQL store of ``reflections``: each turn's record (one per company, seat and run id), with
every worker's outcome, so a pass resumed after a crash or a retry runs only the workers that have
not finished. A pass records its outcomes in the transaction that ends it (completed, retrying or
dead-lettered, fenced by the claim), and a pass still running after a checkpoint interval records
what has finished so far (:meth:`PostgresReflectionStore.put_workers`), so a crash redoes at most
the workers of the last interval (their receivers are idempotent)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime

import asyncpg

from services.reflector.domain import WorkerOutcome

__all__ = ["SQL", "PostgresReflectionStore", "ReflectionRecord", "merge_outcome", "merge_outcomes"]


@dataclass
class ReflectionRecord:
    company: str
    seat: str
    turn_id: str
    state: str
    gate: str | None
    workers: list[WorkerOutcome] = field(default_factory=list)
    attempts: int = 0
    submit_time: datetime | None = None
    complete_time: datetime | None = None
    reason: str | None = None
    """Why it is retrying or was dead-lettered."""
    next_attempt_time: datetime | None = None
    """When a retrying or deferred turn runs again."""


def _record(row: asyncpg.Record) -> ReflectionRecord:
    return ReflectionRecord(
        company=row["company"],
        seat=row["seat"],
        turn_id=row["turn_id"],
        state=row["state"],
        gate=row["gate"],
        workers=[WorkerOutcome.from_json(w) for w in json.loads(row["workers"])],
        attempts=row["attempts"],
        submit_time=row["submit_time"],
        complete_time=row["complete_time"],
        reason=row["reason"],
        next_attempt_time=row["next_attempt_time"],
    )


_COLUMNS = (
    "company, seat, turn_id, state, gate, workers, attempts, submit_time, complete_time, reason, next_attempt_time"
)
_TURN = "company = $1 AND seat = $2 AND turn_id = $3"

SQL = {
    "insert_queued": """
        INSERT INTO reflections (company, seat, turn_id, state, submit_time) VALUES ($1, $2, $3, 'queued', $4)
        ON CONFLICT (company, seat, turn_id) DO NOTHING""",
    "get": f"SELECT {_COLUMNS} FROM reflections WHERE {_TURN}",
    # Each take of the turn counts (a crash's, a retry's, a deferral's).
    "start": f"""
        UPDATE reflections SET state = 'running', gate = NULL, reason = NULL, next_attempt_time = NULL,
               attempts = attempts + 1
        WHERE {_TURN}""",
    "workers_for_update": f"SELECT workers FROM reflections WHERE {_TURN} FOR UPDATE",
    "set_workers": f"UPDATE reflections SET workers = $4::jsonb WHERE {_TURN}",
    "close": f"""
        UPDATE reflections SET state = $4, gate = $5, complete_time = $6, reason = NULL, next_attempt_time = NULL
        WHERE {_TURN}""",
    # Completed with the pass's outcomes, in one statement.
    "close_with_workers": f"""
        UPDATE reflections SET state = $4, gate = $5, complete_time = $6, reason = NULL, next_attempt_time = NULL,
               workers = $7::jsonb
        WHERE {_TURN}""",
    "defer": f"""
        UPDATE reflections SET state = 'deferred', gate = $4, next_attempt_time = $5, attempts = attempts + 1
        WHERE {_TURN}""",
    "retrying": f"UPDATE reflections SET state = 'retrying', reason = $4, next_attempt_time = $5 WHERE {_TURN}",
    "retrying_with_workers": f"""
        UPDATE reflections SET state = 'retrying', reason = $4, next_attempt_time = $5, workers = $6::jsonb
        WHERE {_TURN}""",
    "dead_letter": f"""
        UPDATE reflections SET state = 'dead_lettered', reason = $4, workers = $5::jsonb, complete_time = $6,
               next_attempt_time = NULL
        WHERE {_TURN}""",
    # A pass handed back on shutdown: it waits in the queue again.
    "requeued": f"UPDATE reflections SET state = 'queued' WHERE {_TURN} AND state = 'running'",
    "page": f"""
        SELECT {_COLUMNS} FROM reflections WHERE company = $1 AND seat = $2
        AND ($3::timestamptz IS NULL OR (submit_time, turn_id) < ($3, $4::text))
        ORDER BY submit_time DESC, turn_id DESC LIMIT $5""",
    "count": "SELECT count(*) FROM reflections WHERE company = $1 AND seat = $2",
}


def _dump(workers: list[WorkerOutcome]) -> str:
    return json.dumps([w.to_json() for w in workers])


def merge_outcomes(workers: list[WorkerOutcome], outcomes: list[WorkerOutcome]) -> list[WorkerOutcome]:
    """``workers`` with each of ``outcomes`` merged in order (:func:`merge_outcome`); a worker's
    final outcome already there is kept."""
    for outcome in outcomes:
        workers = merge_outcome(workers, outcome) or workers
    return workers


def merge_outcome(workers: list[WorkerOutcome], outcome: WorkerOutcome) -> list[WorkerOutcome] | None:
    """``workers`` with ``outcome`` in its place: it replaces the worker's unfinished (retryable)
    outcome where it stood, or is appended. None when the worker already has a final outcome: it
    is recorded once (a stale holder's late result changes nothing)."""
    for i, known in enumerate(workers):
        if known.worker == outcome.worker:
            if not known.retryable:
                return None
            return [*workers[:i], outcome, *workers[i + 1 :]]
    return [*workers, outcome]


class PostgresReflectionStore:
    def __init__(self, pool: asyncpg.Pool):
        self.pool = pool

    async def insert_queued(
        self, conn: asyncpg.Connection, company: str, seat: str, turn_id: str, now: datetime
    ) -> None:
        await conn.execute(SQL["insert_queued"], company, seat, turn_id, now)

    async def get(self, company: str, seat: str, turn_id: str) -> ReflectionRecord | None:
        row = await self.pool.fetchrow(SQL["get"], company, seat, turn_id)
        return _record(row) if row else None

    async def start(self, company: str, seat: str, turn_id: str) -> None:
        await self.pool.execute(SQL["start"], company, seat, turn_id)

    async def put_worker(self, company: str, seat: str, turn_id: str, outcome: WorkerOutcome) -> bool:
        """Record one worker's outcome (see :func:`merge_outcome`); False when it was not."""
        async with self.pool.acquire() as conn, conn.transaction():
            raw = await conn.fetchval(SQL["workers_for_update"], company, seat, turn_id)
            if raw is None:
                return False
            merged = merge_outcome([WorkerOutcome.from_json(w) for w in json.loads(raw)], outcome)
            if merged is None:
                return False
            await conn.execute(SQL["set_workers"], company, seat, turn_id, _dump(merged))
            return True

    async def put_workers(self, company: str, seat: str, turn_id: str, outcomes: list[WorkerOutcome]) -> bool:
        """Record several workers' outcomes in one transaction (each as :func:`merge_outcome`: a
        final outcome already recorded is kept); False when nothing changed."""
        async with self.pool.acquire() as conn, conn.transaction():
            raw = await conn.fetchval(SQL["workers_for_update"], company, seat, turn_id)
            if raw is None:
                return False
            known = [WorkerOutcome.from_json(w) for w in json.loads(raw)]
            merged = merge_outcomes(known, outcomes)
            if merged == known:
                return False
            await conn.execute(SQL["set_workers"], company, seat, turn_id, _dump(merged))
            return True

    async def close(
        self,
        conn: asyncpg.Connection,
        company: str,
        seat: str,
        turn_id: str,
        state: str,
        gate: str | None,
        now: datetime,
        workers: list[WorkerOutcome] | None = None,
    ) -> None:
        """Completed or gated: the turn's pass is over. ``workers``, when given, is the record's
        whole list of outcomes (the caller holds the claim, inside the same transaction)."""
        if workers is None:
            await conn.execute(SQL["close"], company, seat, turn_id, state, gate, now)
        else:
            await conn.execute(SQL["close_with_workers"], company, seat, turn_id, state, gate, now, _dump(workers))

    async def defer(
        self, conn: asyncpg.Connection, company: str, seat: str, turn_id: str, gate: str, until: datetime
    ) -> None:
        await conn.execute(SQL["defer"], company, seat, turn_id, gate, until)

    async def retrying(
        self,
        conn: asyncpg.Connection,
        company: str,
        seat: str,
        turn_id: str,
        reason: str,
        until: datetime,
        workers: list[WorkerOutcome] | None = None,
    ) -> None:
        if workers is None:
            await conn.execute(SQL["retrying"], company, seat, turn_id, reason, until)
        else:
            await conn.execute(SQL["retrying_with_workers"], company, seat, turn_id, reason, until, _dump(workers))

    async def dead_letter(
        self,
        conn: asyncpg.Connection,
        company: str,
        seat: str,
        turn_id: str,
        reason: str,
        workers: list[WorkerOutcome],
        now: datetime,
    ) -> None:
        await conn.execute(SQL["dead_letter"], company, seat, turn_id, reason, _dump(workers), now)

    async def requeued(self, conn: asyncpg.Connection, company: str, seat: str, turn_id: str) -> None:
        await conn.execute(SQL["requeued"], company, seat, turn_id)

    async def page(
        self, company: str, seat: str, after: tuple[datetime, str] | None, limit: int
    ) -> list[ReflectionRecord]:
        rows = await self.pool.fetch(
            SQL["page"], company, seat, after[0] if after else None, after[1] if after else None, limit
        )
        return [_record(r) for r in rows]

    async def count(self, company: str, seat: str) -> int:
        return int(await self.pool.fetchval(SQL["count"], company, seat))
