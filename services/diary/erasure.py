"""The diary's part of an erasure (issue 17, ``libs.common.erasure``): the notes of a seat or a
company, or every note derived from a person's turns (its run id is one of theirs) or naming them,
deleted with their vectors and their fill pieces."""

from __future__ import annotations

import asyncpg

from libs.common.erasure import Kind, Report, Target, run_once
from libs.common.vectorindex import VectorIndex
from services.diary.domain import COLLECTION_BASE

__all__ = ["OWNER", "erase", "find"]

OWNER = "diary"

SQL = {
    Kind.SUBJECT: """
        SELECT id, embedding_dims FROM agent_diary
        WHERE company = $1 AND (turn_id = ANY($2::text[]) OR content ~* $3)""",
    Kind.SEAT: "SELECT id, embedding_dims FROM agent_diary WHERE company = $1 AND seat = $2",
    Kind.COMPANY: "SELECT id, embedding_dims FROM agent_diary WHERE company = $1",
    "delete": "DELETE FROM agent_diary WHERE id = ANY($1::uuid[])",
    "pieces": "DELETE FROM fill_pieces WHERE row_id = ANY($1::uuid[])",
}


async def _rows(conn: asyncpg.Connection | asyncpg.Pool, target: Target) -> list[asyncpg.Record]:
    if target.kind is Kind.SUBJECT:
        return await conn.fetch(SQL[Kind.SUBJECT], target.company, list(target.turn_ids), target.sql_pattern())
    if target.kind is Kind.SEAT:
        return await conn.fetch(SQL[Kind.SEAT], target.company, target.seat)
    return await conn.fetch(SQL[Kind.COMPANY], target.company)


async def find(pool: asyncpg.Pool, target: Target) -> Report:
    report = Report(OWNER)
    rows = await _rows(pool, target)
    if rows:
        report.add("agent_diary", [r["id"] for r in rows])
    return report


async def erase(pool: asyncpg.Pool, index: VectorIndex | None, target: Target, now) -> Report:  # type: ignore[no-untyped-def]
    async def work(conn: asyncpg.Connection) -> Report:
        report = Report(OWNER)
        rows = await _rows(conn, target)
        ids = [r["id"] for r in rows]
        await conn.execute(SQL["delete"], ids)
        await conn.execute(SQL["pieces"], ids)
        report.add("agent_diary", ids)
        report.add_points(COLLECTION_BASE, [(r["id"], r["embedding_dims"]) for r in rows])
        return report

    return await run_once(pool, OWNER, target, now, work, index=index)
