"""PostgreSQL store of ``reflections``: each turn's record, with every worker's outcome appended the
moment it is known, so a pass resumed after a crash skips the workers that already finished."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime

import asyncpg

from services.reflector.domain import WorkerOutcome

__all__ = ["PostgresReflectionStore", "ReflectionRecord"]


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
    )


_COLUMNS = "company, seat, turn_id, state, gate, workers, attempts, submit_time, complete_time"


class PostgresReflectionStore:
    def __init__(self, pool: asyncpg.Pool):
        self.pool = pool

    async def insert_queued(
        self, conn: asyncpg.Connection, company: str, seat: str, turn_id: str, now: datetime
    ) -> None:
        await conn.execute(
            """INSERT INTO reflections (company, seat, turn_id, state, submit_time) VALUES ($1, $2, $3, 'queued', $4)
               ON CONFLICT (company, turn_id) DO NOTHING""",
            company,
            seat,
            turn_id,
            now,
        )

    async def get(self, company: str, turn_id: str) -> ReflectionRecord | None:
        row = await self.pool.fetchrow(
            f"SELECT {_COLUMNS} FROM reflections WHERE company = $1 AND turn_id = $2", company, turn_id
        )
        return _record(row) if row else None

    async def start(self, company: str, turn_id: str, attempts: int) -> None:
        await self.pool.execute(
            "UPDATE reflections SET state = 'running', gate = NULL, attempts = $3 WHERE company = $1 AND turn_id = $2",
            company,
            turn_id,
            attempts,
        )

    async def append_worker(self, company: str, turn_id: str, outcome: WorkerOutcome) -> None:
        """Record one worker's outcome, once: a second record of the same worker is ignored."""
        await self.pool.execute(
            """UPDATE reflections SET workers = workers || $3::jsonb
               WHERE company = $1 AND turn_id = $2 AND NOT workers @> $4::jsonb""",
            company,
            turn_id,
            json.dumps([outcome.to_json()]),
            json.dumps([{"worker": outcome.worker}]),
        )

    async def close(
        self, conn: asyncpg.Connection, company: str, turn_id: str, state: str, gate: str | None, now: datetime | None
    ) -> None:
        await conn.execute(
            "UPDATE reflections SET state = $3, gate = $4, complete_time = $5 WHERE company = $1 AND turn_id = $2",
            company,
            turn_id,
            state,
            gate,
            now,
        )

    async def page(
        self, company: str, seat: str, after: tuple[datetime, str] | None, limit: int
    ) -> list[ReflectionRecord]:
        rows = await self.pool.fetch(
            f"""SELECT {_COLUMNS} FROM reflections WHERE company = $1 AND seat = $2
                AND ($3::timestamptz IS NULL OR (submit_time, turn_id) < ($3, $4::text))
                ORDER BY submit_time DESC, turn_id DESC LIMIT $5""",
            company,
            seat,
            after[0] if after else None,
            after[1] if after else None,
            limit,
        )
        return [_record(r) for r in rows]

    async def count(self, company: str, seat: str) -> int:
        return int(
            await self.pool.fetchval("SELECT count(*) FROM reflections WHERE company = $1 AND seat = $2", company, seat)
        )
