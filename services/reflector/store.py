"""PostgreSQL store of ``reflections``: each turn's record (one per company, seat and run id), with
every worker's outcome, so a pass resumed after a crash or a retry runs only the workers that have
not finished. A pass records its outcomes in the transaction that ends it (completed, retrying or
dead-lettered, fenced by the claim), and a pass still running after a checkpoint interval records
what has finished so far (:meth:`PostgresReflectionStore.put_workers`), so a crash redoes at most
the workers of the last interval (their receivers are idempotent).

The record's ``state`` is the reflection's one state (``domain.ReflectionState``): every statement
that moves it is guarded by the states the move is allowed from (``domain.TRANSITIONS``), and a move
refused by that guard raises :class:`~services.reflector.domain.IllegalTransition` inside the
caller's transaction, so the queue row moved beside it (its projection) rolls back with it."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Unpack

import asyncpg

from libs.common.db import PooledStore
from libs.common.events import Bookkeeping, current_bookkeeping, held_events, write_bookkeeping, written_together
from libs.common.jobs import FINISHED, HELD_FOR_UPDATE, Job, NewJob, enqueue_args, enqueue_sql
from services.reflector.domain import (
    JOB_KIND,
    IllegalTransition,
    ReflectionState,
    TurnKey,
    WorkerOutcome,
    job_key,
    sources,
)

__all__ = ["SQL", "PostgresReflectionStore", "ReflectionRecord", "merge_outcome", "merge_outcomes"]

_log = logging.getLogger(__name__)


@dataclass
class ReflectionRecord:
    company: str
    seat: str
    turn_id: str
    state: ReflectionState
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
        state=ReflectionState(row["state"]),
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

_RECORDED = """,
        recorded AS (
            INSERT INTO reflections (company, seat, turn_id, state, submit_time)
            SELECT $3, $4, $10, 'queued', $8 FROM queued
            ON CONFLICT (company, seat, turn_id) DO NOTHING)"""


def _finish_and_close(beside: str = "") -> str:
    """``SQL["finish_and_close"]``; ``beside``: further common table expressions (each led by a
    comma) that read ``finished`` (a row when the job finished, the record closed with it)."""
    return f"""
        WITH held AS ({HELD_FOR_UPDATE}),
        old AS (SELECT state FROM reflections WHERE company = $5 AND seat = $6 AND turn_id = $7 FOR UPDATE),
        allowed AS (SELECT 1 FROM held WHERE NOT EXISTS (SELECT 1 FROM old WHERE NOT old.state = ANY($11::text[]))),
        finished AS (UPDATE background_jobs j SET {FINISHED} FROM allowed WHERE j.id = $1 RETURNING 1),
        closed AS (
            UPDATE reflections r SET state = $8, gate = $9, complete_time = $4, reason = NULL, next_attempt_time = NULL,
                   workers = coalesce($10::jsonb, r.workers)
            FROM allowed WHERE r.company = $5 AND r.seat = $6 AND r.turn_id = $7 RETURNING 1){beside}
        SELECT EXISTS (SELECT 1 FROM held) AS held, (SELECT state FROM old) AS state,
               EXISTS (SELECT 1 FROM finished) AS finished, EXISTS (SELECT 1 FROM closed) AS closed"""


SQL = {
    # The turn's job queued (``libs.common.jobs``' enqueue, $1–$9) and, only when this statement
    # queued it, its record QUEUED ($10 the run id), in one statement.
    "queue_turn": enqueue_sql(_RECORDED),
    "get": f"SELECT {_COLUMNS} FROM reflections WHERE {_TURN}",
    # A worker takes the turn (each take counts an attempt): the record as it was, and whether it
    # moved. A finished record does not move (the duplicate gate), in the same statement.
    "take": f"""
        WITH old AS (SELECT {_COLUMNS} FROM reflections WHERE {_TURN} FOR UPDATE),
        taken AS (
            UPDATE reflections r SET state = 'running', gate = NULL, reason = NULL, next_attempt_time = NULL,
                   attempts = r.attempts + 1
            FROM old WHERE r.company = $1 AND r.seat = $2 AND r.turn_id = $3 AND old.state = ANY($4::text[])
            RETURNING 1)
        SELECT old.*, EXISTS (SELECT 1 FROM taken) AS taken FROM old""",
    "state": f"SELECT state FROM reflections WHERE {_TURN}",
    "workers_for_update": f"SELECT workers FROM reflections WHERE {_TURN} FOR UPDATE",
    "set_workers": f"UPDATE reflections SET workers = $4::jsonb WHERE {_TURN}",
    # Every move below is guarded by the states it is allowed from (the last parameter).
    # The claim's job finished ($1–$4, as ``libs.common.jobs``' finish) and the record closed ($5–$7
    # its key; $10 its whole list of outcomes, NULL keeps them) in one statement, both or neither:
    # nothing moves when the claim is no longer held, nor when the record's guard refuses the move
    # ($11; the caller raises). No record (erased, past retention): the job moves alone. The claim is
    # locked before the record, in the order the two-statement transaction took them. With the pass's
    # bookkeeping (``_finish_and_close(held_events(...))``), its rows go in only if the job finished.
    "finish_and_close": _finish_and_close(),
    "defer": f"""
        UPDATE reflections SET state = 'deferred', gate = $4, next_attempt_time = $5
        WHERE {_TURN} AND state = ANY($6::text[])""",
    "retrying": f"""
        UPDATE reflections SET state = 'retrying', reason = $4, next_attempt_time = $5
        WHERE {_TURN} AND state = ANY($6::text[])""",
    "retrying_with_workers": f"""
        UPDATE reflections SET state = 'retrying', reason = $4, next_attempt_time = $5, workers = $6::jsonb
        WHERE {_TURN} AND state = ANY($7::text[])""",
    "dead_letter": f"""
        UPDATE reflections SET state = 'dead_lettered', reason = $4, workers = $5::jsonb, complete_time = $6,
               next_attempt_time = NULL
        WHERE {_TURN} AND state = ANY($7::text[])""",
    "dead_letter_keep_workers": f"""
        UPDATE reflections SET state = 'dead_lettered', reason = $4, complete_time = $5, next_attempt_time = NULL
        WHERE {_TURN} AND state = ANY($6::text[])""",
    # A pass handed back on shutdown: it waits in the queue again.
    "requeued": f"UPDATE reflections SET state = 'queued' WHERE {_TURN} AND state = ANY($4::text[])",
    "page": f"""
        SELECT {_COLUMNS} FROM reflections WHERE company = $1 AND seat = $2
        AND ($3::timestamptz IS NULL OR (submit_time, turn_id) < ($3, $4::text))
        ORDER BY submit_time DESC, turn_id DESC LIMIT $5""",
    "count": "SELECT count(*) FROM reflections WHERE company = $1 AND seat = $2",
    # The turn's job row as an erasure leaves it: kept (the duplicate gate), its payload emptied. A
    # queued turn's payload is its serialized TurnCompleted, never empty (a run id is required).
    "erased": f"""
        SELECT EXISTS (SELECT 1 FROM background_jobs
                       WHERE kind = '{JOB_KIND}' AND company = $1 AND key = $2 AND length(payload) = 0)""",
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


class PostgresReflectionStore(PooledStore):
    async def write_bookkeeping(self, batch: Bookkeeping) -> None:
        await write_bookkeeping(self.pool, batch)

    async def queue_turn(self, turn_id: str, **job: Unpack[NewJob]) -> bool:
        """One statement (``SQL["queue_turn"]``), its own commit. Under a bookkeeping batch that
        announces the queueing (the service's ``turn_completed``: ``Bookkeeping.announce``), the same
        statement writes the batch's rows, only if the turn was queued (:meth:`_with_bookkeeping`)."""
        args = [*enqueue_args(job), turn_id]
        batch = current_bookkeeping()
        if batch is None or not batch.announced:
            return await self.pool.fetchval(SQL["queue_turn"], *args) is not None
        beside, held = held_events(batch, len(args) + 1, "EXISTS (SELECT 1 FROM queued)")
        combined, row = await self._with_bookkeeping(batch, enqueue_sql(_RECORDED + beside), [*args, *held])
        if not combined:
            return await self.pool.fetchval(SQL["queue_turn"], *args) is not None
        batch.settle(row is not None)
        return row is not None

    async def get(self, company: str, seat: str, turn_id: str) -> ReflectionRecord | None:
        row = await self.pool.fetchrow(SQL["get"], company, seat, turn_id)
        return _record(row) if row else None

    async def erased(self, company: str, seat: str, turn_id: str) -> bool:
        row = await self.pool.fetchval(SQL["erased"], company, job_key(seat, turn_id))
        return bool(row)

    async def take(self, company: str, seat: str, turn_id: str) -> tuple[ReflectionRecord | None, bool]:
        """One statement (``SQL["take"]``)."""
        row = await self.pool.fetchrow(SQL["take"], company, seat, turn_id, sources(ReflectionState.RUNNING))
        if row is None:
            return None, False
        return _record(row), bool(row["taken"])

    async def _with_bookkeeping(
        self, batch: Bookkeeping, sql: str, args: list[Any]
    ) -> tuple[bool, asyncpg.Record | None]:
        """Run ``sql``, a write with its bookkeeping (``held_events``): :func:`written_together`."""
        return await written_together(batch, lambda: self.pool.fetchrow(sql, *args), "a reflection write")

    async def _move(
        self, conn: asyncpg.Connection, target: ReflectionState, sql: str, key: TurnKey, *params: Any
    ) -> bool:
        """One guarded move to ``target``: ``sql`` takes the record's key, ``params``, and last the
        states it may move from (``domain.sources``); then :meth:`_moved`."""
        status = await conn.execute(sql, *key, *params, sources(target))
        return await self._moved(conn, status, key, target)

    async def _moved(self, conn: asyncpg.Connection, status: str, key: TurnKey, target: ReflectionState) -> bool:
        """After a guarded move: True if the record moved, False if there is no record (erased or
        past retention: the queue row moves alone). A record the guard kept where it was is an
        illegal move: raised, so the caller's transaction (the queue row's move too) rolls back."""
        if status.endswith(" 1"):
            return True
        current = await conn.fetchval(SQL["state"], *key)
        if current is None:
            return False
        raise IllegalTransition(key.turn_id, ReflectionState(current), target)

    async def put_workers(self, company: str, seat: str, turn_id: str, outcomes: list[WorkerOutcome]) -> bool:
        """One transaction, under the record's row lock."""
        async with self.transaction() as conn:
            raw = await conn.fetchval(SQL["workers_for_update"], company, seat, turn_id)
            if raw is None:
                return False
            known = [WorkerOutcome.from_json(w) for w in json.loads(raw)]
            merged = merge_outcomes(known, outcomes)
            if merged == known:
                return False
            await conn.execute(SQL["set_workers"], company, seat, turn_id, _dump(merged))
            return True

    async def finish_and_close(
        self,
        job: Job,
        worker: str,
        key: TurnKey,
        state: ReflectionState,
        gate: str | None,
        now: datetime,
        workers: list[WorkerOutcome] | None = None,
    ) -> bool:
        """One statement (``SQL["finish_and_close"]``), its own commit. Under the pass's bookkeeping
        batch, the same statement writes the batch's rows, only if the job finished; else (a stale
        claim, a refused close) they stay held for their own writer, and what was announced (the
        pass's ``reflection_completed``) is dropped."""
        if state not in (ReflectionState.COMPLETED, ReflectionState.GATED):
            raise ValueError(f"a close ends a pass completed or gated, not {state}")
        dumped = None if workers is None else _dump(workers)
        args = [job.id, worker, job.attempts, now, *key, str(state), gate, dumped, sources(state)]
        batch = current_bookkeeping()
        row = None
        if batch is not None and (batch.announced or len(batch)):
            # The pass's bookkeeping (its held events and charges, the announced reflection_completed)
            # rides on this statement, written only if the job finished: one commit for all of it.
            beside, held = held_events(batch, len(args) + 1, "EXISTS (SELECT 1 FROM finished)")
            combined, row = await self._with_bookkeeping(batch, _finish_and_close(beside), [*args, *held])
            if combined:
                assert row is not None
                batch.settle(bool(row["finished"]))
        if row is None:
            row = await self.pool.fetchrow(SQL["finish_and_close"], *args)
        assert row is not None
        if not row["held"]:
            return False
        if row["state"] is not None and not row["closed"]:
            raise IllegalTransition(key.turn_id, ReflectionState(row["state"]), state)
        return True

    async def defer(self, conn: asyncpg.Connection, key: TurnKey, gate: str, until: datetime) -> bool:
        return await self._move(conn, ReflectionState.DEFERRED, SQL["defer"], key, gate, until)

    async def retrying(
        self,
        conn: asyncpg.Connection,
        key: TurnKey,
        reason: str,
        until: datetime,
        workers: list[WorkerOutcome] | None = None,
    ) -> bool:
        retry = ReflectionState.RETRYING
        if workers is None:
            return await self._move(conn, retry, SQL["retrying"], key, reason, until)
        return await self._move(conn, retry, SQL["retrying_with_workers"], key, reason, until, _dump(workers))

    async def dead_letter(
        self, conn: asyncpg.Connection, key: TurnKey, reason: str, workers: list[WorkerOutcome] | None, now: datetime
    ) -> bool:
        dead = ReflectionState.DEAD_LETTERED
        if workers is None:
            return await self._move(conn, dead, SQL["dead_letter_keep_workers"], key, reason, now)
        return await self._move(conn, dead, SQL["dead_letter"], key, reason, _dump(workers), now)

    async def requeued(self, conn: asyncpg.Connection, key: TurnKey) -> bool:
        status = await conn.execute(SQL["requeued"], *key, sources(ReflectionState.QUEUED))
        if not status.endswith(" 1"):
            current = await conn.fetchval(SQL["state"], *key)
            if current is None or ReflectionState(current).waiting:
                return False
        return await self._moved(conn, status, key, ReflectionState.QUEUED)

    async def page(
        self, company: str, seat: str, after: tuple[datetime, str] | None, limit: int
    ) -> list[ReflectionRecord]:
        rows = await self.pool.fetch(
            SQL["page"], company, seat, after[0] if after else None, after[1] if after else None, limit
        )
        return [_record(r) for r in rows]

    async def count(self, company: str, seat: str) -> int:
        return int(await self.pool.fetchval(SQL["count"], company, seat))
