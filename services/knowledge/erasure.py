"""The knowledge's part of an erasure (issue 17, ``libs.common.erasure``): the native pages written
from a person's sessions (their lessons, named by the sessions owner) and every page that names
them (lessons, promotion drafts) are deleted with their vectors; a company's erasure deletes all of
its pages. A seat has no pages of its own (pages are the company's). Confluence pages are the
customer's own system and are not touched."""

from __future__ import annotations

import uuid
from datetime import datetime

import asyncpg

from libs.common.erasure import Kind, Report, Target, run_once
from libs.common.vectorindex import VectorIndex
from services.knowledge.domain import COLLECTION_BASE

__all__ = ["OWNER", "erase", "find"]

OWNER = "knowledge"

SQL = {
    "subject": """
        SELECT id, embedding_dims FROM knowledge_pages
        WHERE company = $1
          AND (id = ANY($2::uuid[]) OR (title || ' ' || body || ' ' || array_to_string(parent_titles, ' ')) ~* $3)""",
    "company": "SELECT id, embedding_dims FROM knowledge_pages WHERE company = $1",
    "delete": "DELETE FROM knowledge_pages WHERE id = ANY($1::uuid[])",
    "pieces": "DELETE FROM fill_pieces WHERE row_id = ANY($1::uuid[])",
}


def _uuids(values: tuple[str, ...]) -> list[uuid.UUID]:
    out = []
    for v in values:
        try:
            out.append(uuid.UUID(v))
        except ValueError:
            continue  # a page of another backend: not ours
    return out


async def _rows(conn: asyncpg.Connection | asyncpg.Pool, target: Target) -> list[asyncpg.Record]:
    if target.kind is Kind.SUBJECT:
        return list(await conn.fetch(SQL["subject"], target.company, _uuids(target.page_ids), target.sql_pattern()))
    if target.kind is Kind.COMPANY:
        return list(await conn.fetch(SQL["company"], target.company))
    # A seat: the lessons its sessions taught alone (named by the sessions owner).
    return list(await conn.fetch(SQL["subject"], target.company, _uuids(target.page_ids), "a^"))


async def find(pool: asyncpg.Pool, target: Target) -> Report:
    report = Report(OWNER)
    rows = await _rows(pool, target)
    if rows:
        report.add("knowledge_pages", [r["id"] for r in rows])
    return report


async def erase(pool: asyncpg.Pool, index: VectorIndex | None, target: Target, now: datetime) -> Report:
    async def work(conn: asyncpg.Connection) -> Report:
        report = Report(OWNER)
        rows = await _rows(conn, target)
        ids = [r["id"] for r in rows]
        await conn.execute(SQL["delete"], ids)
        await conn.execute(SQL["pieces"], ids)
        report.add("knowledge_pages", ids)
        report.add_points(COLLECTION_BASE, [(r["id"], r["embedding_dims"]) for r in rows])
        return report

    return await run_once(pool, OWNER, target, now, work, index=index)
