"""``erasures``: named queries, ``$n`` parameters. The target (the person's identifiers) is kept
only while an erasure runs: ``finish`` clears it in the same statement that records the outcome."""

from __future__ import annotations

import dataclasses
import json
import uuid
from datetime import datetime
from typing import Any

import asyncpg

from libs.common.db import PooledStore
from libs.common.erasure import Kind, Report, Target
from libs.common.jobs import HELD_FOR_UPDATE
from libs.common.rows import RowReader
from services.privacy.domain import ClaimLost, Erasure, ErasureState, Holder

__all__ = ["PostgresErasureStore", "target_from_json", "target_to_json"]

_COLUMNS = (
    "id, company, kind, seat, subject_digest, requested_by, state, target, collected, reports, residues, verified,"
    " reason, create_time, finish_time, round, pending_checks, request_digest"
)


def _held(changes: str) -> str:
    """An UPDATE of the erasure ($4) making ``changes`` only while the claim ($1–$3) is held and the
    erasure unfinished; it returns the erasure's id when it did."""
    return f"""
        WITH held AS ({HELD_FOR_UPDATE})
        UPDATE erasures SET {changes}
        WHERE id = $4 AND state IN ('queued', 'running') AND EXISTS (SELECT 1 FROM held)
        RETURNING id"""


SQL = {
    "insert": """
        INSERT INTO erasures (id, company, kind, seat, subject_digest, request_key, requested_by, state, target,
                              create_time, request_digest)
        VALUES ($1, $2, $3, $4, $5, $6, $7, 'queued', $8::jsonb, $9, $10)
        ON CONFLICT (company, kind, seat, request_key) WHERE request_key IS NOT NULL DO NOTHING
        RETURNING id""",
    # A key is scoped to what the erasure is of, its kind and its seat (migration 0003); a row the
    # previous release wrote keeps its key in request_id, and is found within the same scope.
    "by_request": f"""
        SELECT {_COLUMNS} FROM erasures
        WHERE company = $1 AND kind = $2 AND seat = $3 AND (request_key = $4 OR request_id = $4)
        ORDER BY create_time, id LIMIT 1""",
    "get": f"SELECT {_COLUMNS} FROM erasures WHERE id = $1",
    "get_company": f"SELECT {_COLUMNS} FROM erasures WHERE company = $1 AND id = $2",
    "page": f"""
        SELECT {_COLUMNS} FROM erasures
        WHERE company = $1 AND ($2::timestamptz IS NULL OR (create_time, id) < ($2, $3::uuid))
          AND ($5::text IS NULL OR seat = $5)
        ORDER BY create_time DESC, id DESC LIMIT $4""",
    "running": "UPDATE erasures SET state = 'running' WHERE id = $1 AND state = 'queued'",
    # A run's writes ($1–$3 its claim, as ``libs.common.jobs``' fenced transitions; $4 the erasure):
    # made only while the claim is held (locked for the statement, as the finish locks it) and the
    # erasure is not finished. Each answers the erasure's id when it was written ("held"), so that
    # a write a guard of its own skipped (``next_round``'s) still tells the claim was held.
    "collected": _held("target = $5::jsonb, collected = true"),
    "next_round": _held("target = CASE WHEN round < $6 THEN $5::jsonb ELSE target END, round = greatest(round, $6)"),
    "pending": _held("pending_checks = $5"),
    "report": _held("reports = reports || jsonb_build_object($5::text, $6::jsonb)"),
    "finish": """
        UPDATE erasures SET state = $2, residues = $3::jsonb, verified = $4, reason = $5, finish_time = $6,
                            target = NULL
        WHERE id = $1""",
    "reason": "UPDATE erasures SET reason = $2 WHERE id = $1",
}


def target_to_json(target: Target) -> str:
    data = dataclasses.asdict(target)
    data["erasure_id"] = str(target.erasure_id)
    data["kind"] = str(target.kind)
    return json.dumps(data)


def target_from_json(text: str | dict[str, Any]) -> Target:
    data = json.loads(text) if isinstance(text, str) else dict(text)
    data["erasure_id"] = uuid.UUID(data["erasure_id"])
    data["kind"] = Kind(data["kind"])
    for key in ("names", "turn_ids", "session_ids", "page_ids", "aliases"):
        data[key] = tuple(data.get(key, ()))  # an erasure stored before aliases were kept has none
    return Target(**data)


def _reports(value: Any) -> dict[str, Report]:
    data = json.loads(value) if isinstance(value, str) else dict(value or {})
    return {owner: Report.from_json(json.dumps(r)) for owner, r in data.items()}


_erasure = RowReader(
    Erasure,
    {
        "kind": Kind,
        "state": ErasureState,
        "target": lambda value: target_from_json(value) if value is not None else None,
        "reports": _reports,
        "residues": _reports,
        "pending_checks": list,
    },
)


class PostgresErasureStore(PooledStore):
    async def insert(
        self, conn: asyncpg.Connection, erasure: Erasure, target: Target, request_id: str | None
    ) -> uuid.UUID | None:
        """The new erasure's id, or None when ``request_id`` already named one of the same kind and
        seat."""
        found: uuid.UUID | None = await conn.fetchval(
            SQL["insert"],
            erasure.id,
            erasure.company,
            str(erasure.kind),
            erasure.seat,
            erasure.subject_digest,
            request_id,
            erasure.requested_by,
            target_to_json(target),
            erasure.create_time,
            erasure.request_digest,
        )
        return found

    async def by_request(self, company: str, kind: Kind, seat: str, request_id: str) -> Erasure | None:
        row = await self.pool.fetchrow(SQL["by_request"], company, str(kind), seat, request_id)
        return _erasure(row) if row is not None else None

    async def get(self, erasure_id: uuid.UUID, company: str | None = None) -> Erasure | None:
        if company is None:
            row = await self.pool.fetchrow(SQL["get"], erasure_id)
        else:
            row = await self.pool.fetchrow(SQL["get_company"], company, erasure_id)
        return _erasure(row) if row is not None else None

    async def page(
        self, company: str, after: tuple[datetime, uuid.UUID] | None, limit: int, *, seat: str | None = None
    ) -> list[Erasure]:
        rows = await self.pool.fetch(
            SQL["page"], company, after[0] if after else None, after[1] if after else None, limit, seat
        )
        return [_erasure(r) for r in rows]

    async def mark_running(self, erasure_id: uuid.UUID) -> None:
        await self.pool.execute(SQL["running"], erasure_id)

    async def _held(self, sql: str, holder: Holder, erasure_id: uuid.UUID, *args: Any) -> None:
        written = await self.pool.fetchval(sql, holder.job_id, holder.worker, holder.attempts, erasure_id, *args)
        if written is None:
            raise ClaimLost(f"erasure {erasure_id}: the claim of {holder.worker} is no longer held")

    async def set_collected(self, holder: Holder, erasure_id: uuid.UUID, target: Target) -> None:
        await self._held(SQL["collected"], holder, erasure_id, target_to_json(target))

    async def next_round(self, holder: Holder, erasure_id: uuid.UUID, target: Target, round_: int) -> None:
        """Record that the erasure goes on to ``round_`` with ``target`` (the run ids found since)."""
        await self._held(SQL["next_round"], holder, erasure_id, target_to_json(target), round_)

    async def set_pending_checks(self, holder: Holder, erasure_id: uuid.UUID, checks: list[str]) -> None:
        await self._held(SQL["pending"], holder, erasure_id, checks)

    async def put_report(self, holder: Holder, erasure_id: uuid.UUID, owner: str, report: Report) -> None:
        await self._held(SQL["report"], holder, erasure_id, owner, report.to_json())

    async def set_reason(self, conn: asyncpg.Connection, erasure_id: uuid.UUID, reason: str) -> None:
        await conn.execute(SQL["reason"], erasure_id, reason)

    async def finish(self, conn: asyncpg.Connection, erasure: Erasure, now: datetime) -> None:
        payload = json.dumps({o: json.loads(r.to_json()) for o, r in erasure.residues.items()})
        await conn.execute(
            SQL["finish"], erasure.id, str(erasure.state), payload, erasure.verified, erasure.reason, now
        )
