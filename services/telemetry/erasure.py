"""The event log's part of an erasure (issue 17, ``libs.common.erasure``). The telemetry service
owns the read side of the shared ``events`` table, so it erases from it: the events of a person's
turns (their run ids) or naming them, of a seat, or of a company. The privacy service's own audit
is not an event: it lives in its ``erasures`` table and names no person."""

from __future__ import annotations

from datetime import datetime

import asyncpg

from libs.common.erasure import Kind, Report, Target, run_once, scope_rows

__all__ = ["OWNER", "erase", "find"]

OWNER = "telemetry"

SQL = {
    Kind.SUBJECT: """
        SELECT id FROM events WHERE company = $1 AND (turn_id = ANY($2::text[]) OR payload::text ~* $3)""",
    "delete": "DELETE FROM events WHERE id = ANY($1::bigint[])",
}


async def _ids(conn: asyncpg.Connection | asyncpg.Pool, target: Target) -> list[int]:
    if target.kind is Kind.SUBJECT:
        rows = await conn.fetch(SQL[Kind.SUBJECT], target.company, list(target.turn_ids), target.sql_pattern())
    else:  # a seat's or a company's: every one of the seat (the company)
        rows = await scope_rows(conn, target, "events", "id")
    return [r["id"] for r in rows]


async def find(pool: asyncpg.Pool, target: Target) -> Report:
    report = Report(OWNER)
    ids = await _ids(pool, target)
    if ids:
        report.add("events", ids)
    return report


async def erase(pool: asyncpg.Pool, target: Target, now: datetime) -> Report:
    async def work(conn: asyncpg.Connection) -> Report:
        report = Report(OWNER)
        ids = await _ids(conn, target)
        await conn.execute(SQL["delete"], ids)
        report.add("events", ids)
        return report

    return await run_once(pool, OWNER, target, now, work)
