"""The diary's part of an erasure (issue 17, ``libs.common.erasure``): the notes of a seat or a
company, or every note derived from a person's turns (its run id is one of theirs) or naming them,
deleted with their vectors and their fill pieces.

A note resting on several people (a shared lesson: its provenance names others too) that does not
name the person and was not written from a turn or session of theirs keeps its text and loses them
as a source (their identifiers and run ids leave its provenance): a note is one short sentence
with no quotation, so text that does not name them carries no words of theirs, only a lesson the
others taught as well. Re-deriving it by a model would write the same sentence from the same
remaining sources; its vector (of the unchanged text) stays as it is."""

from __future__ import annotations

import uuid
from datetime import datetime

import asyncpg

from agentlearn.common.v1 import provenance_pb2
from libs.common.config import PrivacyConfig
from libs.common.embeddings import Embedder
from libs.common.erasure import (
    Kind,
    Report,
    Target,
    delete_indexed,
    provenance_from_json,
    provenance_json,
    provenance_row,
    provenance_subjects,
    prune_indexed,
    run_once,
    scope_rows,
    verify_index,
)
from libs.common.vectorindex import VectorIndex
from services.diary.domain import COLLECTION_BASE, DOMAIN

__all__ = ["OWNER", "erase", "find", "provenance", "prune_retention", "record_provenance"]

OWNER = "diary"

SQL = {
    # ``shared``: a note resting on several people (its provenance names others too) that neither
    # names her in its text, nor was written from a turn or session of hers: it keeps its text and
    # loses her as a source. Every other note found is deleted.
    Kind.SUBJECT: """
        SELECT d.id, d.embedding_dims, p.provenance,
               (NOT coalesce(d.turn_id = ANY($2::text[]), false) AND NOT d.content ~* $3
                AND NOT coalesce(p.provenance->>'session_id' = ANY($5::text[]), false)
                AND EXISTS (SELECT 1 FROM unnest(coalesce(p.subjects, '{}')) s WHERE s <> ALL($4::text[])))
               AS shared
        FROM agent_diary d LEFT JOIN note_provenance p ON p.note_id = d.id AND p.company = $1
        WHERE d.company = $1 AND (d.turn_id = ANY($2::text[]) OR d.content ~* $3 OR p.subjects && $4::text[]
               OR p.provenance->>'session_id' = ANY($5::text[]))""",
    "unsource": """
        UPDATE note_provenance SET subjects = ARRAY(SELECT s FROM unnest(subjects) s WHERE s <> ALL($2::text[])),
                                   provenance = $3::jsonb
        WHERE note_id = $1""",
    "past_retention": """
        DELETE FROM agent_diary WHERE company = $1 AND create_time < $2 RETURNING id, embedding_dims""",
    "record": """
        INSERT INTO note_provenance (note_id, company, seat, subjects, provenance, record_time)
        SELECT id, company, seat, $2, $3::jsonb, $4 FROM agent_diary WHERE id = $1
        ON CONFLICT (note_id) DO NOTHING""",
    "provenance": """
        SELECT p.provenance, d.turn_id FROM agent_diary d LEFT JOIN note_provenance p ON p.note_id = d.id
        WHERE d.id = $1 AND d.company = $2 AND d.seat = $3""",
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
    return await scope_rows(conn, target, "agent_diary", "id, embedding_dims")


def _shared(row: asyncpg.Record) -> bool:
    return bool(row.get("shared"))


def _without(provenance: str | None, target: Target) -> str:
    """The provenance without the person: their identifiers leave ``subjects``, their run ids leave
    ``turn_ids``."""
    msg = provenance_from_json(provenance)
    ident, turns = set(target.identifiers), set(target.turn_ids)
    kept = [s for s in msg.subjects if s.handle not in ident and s.external_id not in ident]
    del msg.subjects[:]
    msg.subjects.extend(kept)
    runs = [t for t in msg.turn_ids if t not in turns]
    del msg.turn_ids[:]
    msg.turn_ids.extend(runs)
    return provenance_json(msg)


async def find(
    pool: asyncpg.Pool, target: Target, index: VectorIndex | None = None, embedder: Embedder | None = None
) -> Report:
    """What the diary still holds of the target: rows, and (given the index) points of erased
    notes or near the person's names whose notes name them (``verify_index``)."""
    report = Report(OWNER)
    rows = await _rows(pool, target)
    if gone := [r["id"] for r in rows if not _shared(r)]:
        report.add("agent_diary", gone)
    if shared := [r["id"] for r in rows if _shared(r)]:
        report.add("note_provenance", shared, changed=True)
    await verify_index(pool, index, embedder, OWNER, COLLECTION_BASE, "agent_diary", "content", target, report)
    return report


async def erase(pool: asyncpg.Pool, index: VectorIndex | None, target: Target, now: datetime) -> Report:
    async def work(conn: asyncpg.Connection) -> Report:
        report = Report(OWNER)
        rows = await _rows(conn, target)
        await delete_indexed(conn, report, "agent_diary", COLLECTION_BASE, [r for r in rows if not _shared(r)])
        shared = [r for r in rows if _shared(r)]
        for row in shared:
            await conn.execute(SQL["unsource"], row["id"], target.identifiers, _without(row["provenance"], target))
        if shared:
            report.add("note_provenance", [r["id"] for r in shared], changed=True)
        return report

    return await run_once(pool, OWNER, target, now, work, index=index)


async def record_provenance(pool: asyncpg.Pool, note_id: object, msg: provenance_pb2.Provenance, now: datetime) -> None:
    """Keep a written note's provenance (once: a retried write finds it kept)."""
    await pool.execute(SQL["record"], uuid.UUID(str(note_id)), provenance_subjects(msg), provenance_json(msg), now)


async def provenance(pool: asyncpg.Pool, company: str, seat: str, note_id: str) -> provenance_pb2.Provenance:
    """The note's provenance; a note written before provenance was kept names its run id only."""
    row = await provenance_row(pool, SQL["provenance"], "note", note_id, company, seat, domain=DOMAIN)
    msg = provenance_from_json(row["provenance"])
    if not msg.turn_ids and row["turn_id"]:
        msg.turn_ids.append(row["turn_id"])
    return msg


async def prune_retention(pool: asyncpg.Pool, index: VectorIndex | None, privacy: PrivacyConfig, now: datetime) -> int:
    """Delete notes older than their company's ``note_max_age_days`` (with their vectors); how many."""
    return await prune_indexed(
        pool,
        index,
        privacy,
        now,
        table="agent_diary",
        knob="note_max_age_days",
        base=COLLECTION_BASE,
        past=SQL["past_retention"],
    )
