"""The diary's part of an erasure (issue 17, ``libs.common.erasure``): the notes of a seat or a
company, or every note derived from a person's turns (its run id is one of theirs) or naming them,
deleted with their vectors and their fill pieces."""

from __future__ import annotations

import uuid
from datetime import datetime

import asyncpg

from agentlearn.common.v1 import provenance_pb2
from libs.common.config import PrivacyConfig
from libs.common.erasure import (
    Kind,
    Report,
    Target,
    drop_points,
    provenance_from_json,
    provenance_json,
    provenance_subjects,
    retention_cutoffs,
    run_once,
)
from libs.common.errors import NotFound
from libs.common.vectorindex import VectorIndex
from services.diary.domain import COLLECTION_BASE, DOMAIN

__all__ = ["OWNER", "erase", "find", "provenance", "prune_retention", "record_provenance"]

OWNER = "diary"

SQL = {
    Kind.SUBJECT: """
        SELECT id, embedding_dims FROM agent_diary
        WHERE company = $1 AND (turn_id = ANY($2::text[]) OR content ~* $3
               OR EXISTS (SELECT 1 FROM note_provenance p
                          WHERE p.note_id = agent_diary.id AND p.company = $1 AND p.subjects && $4::text[])
               OR EXISTS (SELECT 1 FROM note_provenance p
                          WHERE p.note_id = agent_diary.id AND p.provenance->>'session_id' = ANY($5::text[])))""",
    "past_retention": """
        DELETE FROM agent_diary WHERE company = $1 AND create_time < $2 RETURNING id, embedding_dims""",
    "record": """
        INSERT INTO note_provenance (note_id, company, seat, subjects, provenance, record_time)
        SELECT id, company, seat, $2, $3::jsonb, $4 FROM agent_diary WHERE id = $1
        ON CONFLICT (note_id) DO NOTHING""",
    "provenance": """
        SELECT p.provenance, d.turn_id FROM agent_diary d LEFT JOIN note_provenance p ON p.note_id = d.id
        WHERE d.id = $1 AND d.company = $2 AND d.seat = $3""",
    Kind.SEAT: "SELECT id, embedding_dims FROM agent_diary WHERE company = $1 AND seat = $2",
    Kind.COMPANY: "SELECT id, embedding_dims FROM agent_diary WHERE company = $1",
    "delete": "DELETE FROM agent_diary WHERE id = ANY($1::uuid[])",
    "pieces": "DELETE FROM fill_pieces WHERE row_id = ANY($1::uuid[])",
}


async def _rows(conn: asyncpg.Connection | asyncpg.Pool, target: Target) -> list[asyncpg.Record]:
    if target.kind is Kind.SUBJECT:
        return list(
            await conn.fetch(
                SQL[Kind.SUBJECT],
                target.company,
                list(target.turn_ids),
                target.sql_pattern(),
                target.identifiers,
                list(target.session_ids),
            )
        )
    if target.kind is Kind.SEAT:
        return list(await conn.fetch(SQL[Kind.SEAT], target.company, target.seat))
    return list(await conn.fetch(SQL[Kind.COMPANY], target.company))


async def find(pool: asyncpg.Pool, target: Target) -> Report:
    report = Report(OWNER)
    rows = await _rows(pool, target)
    if rows:
        report.add("agent_diary", [r["id"] for r in rows])
    return report


async def erase(pool: asyncpg.Pool, index: VectorIndex | None, target: Target, now: datetime) -> Report:
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


async def record_provenance(pool: asyncpg.Pool, note_id: object, msg: provenance_pb2.Provenance, now: datetime) -> None:
    """Keep a written note's provenance (once: a retried write finds it kept)."""
    await pool.execute(SQL["record"], uuid.UUID(str(note_id)), provenance_subjects(msg), provenance_json(msg), now)


async def provenance(pool: asyncpg.Pool, company: str, seat: str, note_id: str) -> provenance_pb2.Provenance:
    """The note's provenance; a note written before provenance was kept names its run id only."""
    row = await pool.fetchrow(SQL["provenance"], uuid.UUID(note_id), company, seat)
    if row is None:
        raise NotFound(
            f"note {note_id} not found for seat {seat}",
            reason="NOTE_NOT_FOUND",
            domain=DOMAIN,
            metadata={"note_id": note_id, "seat": seat},
        )
    msg = provenance_from_json(row["provenance"])
    if not msg.turn_ids and row["turn_id"]:
        msg.turn_ids.append(row["turn_id"])
    return msg


async def prune_retention(pool: asyncpg.Pool, index: VectorIndex | None, privacy: PrivacyConfig, now: datetime) -> int:
    """Delete notes older than their company's ``note_max_age_days`` (with their vectors); how many."""
    deleted = 0
    for company, cutoff in await retention_cutoffs(pool, "agent_diary", privacy, "note_max_age_days", now):
        async with pool.acquire() as conn, conn.transaction():
            rows = await conn.fetch(SQL["past_retention"], company, cutoff)
            await conn.execute(SQL["pieces"], [r["id"] for r in rows])
        report = Report(OWNER)
        report.add_points(COLLECTION_BASE, [(r["id"], r["embedding_dims"]) for r in rows])
        await drop_points(index, report.points)
        deleted += len(rows)
    return deleted
