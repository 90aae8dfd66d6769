"""The diary's part of an erasure (issue 17, ``libs.common.erasure``): the notes of a seat or a
company, or every note derived from a person's turns (its run id is one of theirs) or naming them,
deleted with their vectors and their fill pieces.

A note resting on several people (a shared lesson: its provenance names others too) that does not
name the person and was not written from a turn or session of theirs keeps its text and loses them
as a source (their provenance entries, with every identifier in them, and their run ids leave its
provenance); one resting on them alone is deleted, whichever of their identifiers the request names
(a provenance entry holds a sender's handle and external id together: one person). A note is one
short sentence with no quotation, so text that does not name them carries no words of theirs, only
a lesson the others taught as well. Re-deriving it by a model would write the same sentence from the same
remaining sources; its vector (of the unchanged text) stays as it is."""

from __future__ import annotations

import hashlib
import uuid
from datetime import datetime

import asyncpg

from agentlearn.common.v1 import erasure_pb2, provenance_pb2
from libs.common.config import PrivacyConfig
from libs.common.embeddings import Embedder
from libs.common.erasure import (
    Kind,
    Report,
    Target,
    delete_indexed,
    delete_keyed,
    delete_scope,
    provenance_from_json,
    provenance_json,
    provenance_row,
    provenance_subjects,
    prune_indexed,
    retention_cutoffs,
    run_once,
    scope_rows,
    verify_index,
)
from libs.common.not_found import require_found
from libs.common.vectorindex import VectorIndex
from services.diary.domain import COLLECTION_BASE, DOMAIN

__all__ = ["OWNER", "erase", "find", "provenance", "prune_retention", "record_provenance"]

OWNER = "diary"

SQL = {
    # ``theirs``: a note written from a turn or session of hers, or naming her in its text: deleted
    # whatever else it rests on. Whether another person's messages taught it too is read from the
    # provenance's subjects (``_shared``), never from the flat ``subjects`` column: that holds a
    # person's handle and external id side by side, and her own second identifier is not another
    # person.
    Kind.SUBJECT: """
        SELECT d.id, d.embedding_dims, p.provenance,
               (coalesce(d.turn_id = ANY($2::text[]), false) OR d.content ~* $3
                OR coalesce(p.provenance->>'session_id' = ANY($5::text[]), false)) AS theirs
        FROM agent_diary d LEFT JOIN note_provenance p ON p.note_id = d.id AND p.company = $1
        WHERE d.company = $1 AND (d.turn_id = ANY($2::text[]) OR d.content ~* $3 OR p.subjects && $4::text[]
               OR p.provenance->>'session_id' = ANY($5::text[]))""",
    # The flat column is rebuilt from the provenance left (every identifier of each remaining person).
    "unsource": "UPDATE note_provenance SET subjects = $2, provenance = $3::jsonb WHERE note_id = $1",
    "past_retention": """
        DELETE FROM agent_diary WHERE company = $1 AND create_time < $2 RETURNING id, embedding_dims""",
    # The idempotency keys of the notes an erasure deletes ($2), naming the person ($3: a caller's
    # key may carry a name), or keyed by a turn of theirs ($4: ``<run id>:<worker>``, the note of
    # which may be gone already): a key outlives its note, never its erasure.
    "requests_of": """
        SELECT seat, request_id FROM diary_requests
        WHERE company = $1 AND (note_id = ANY($2::uuid[]) OR request_id ~* $3
               OR EXISTS (SELECT 1 FROM unnest($4::text[]) AS t(run) WHERE starts_with(request_id, t.run || ':')))""",
    # A company's keys past its retention (kept as long as a note would be).
    "requests_past_retention": "DELETE FROM diary_requests WHERE company = $1 AND create_time < $2",
    "record": """
        INSERT INTO note_provenance (note_id, company, seat, subjects, provenance, record_time)
        SELECT id, company, seat, $2, $3::jsonb, $4 FROM agent_diary WHERE id = $1
        ON CONFLICT (note_id) DO NOTHING""",
    "provenance": """
        SELECT p.provenance, d.turn_id, d.expire_time FROM agent_diary d LEFT JOIN note_provenance p ON p.note_id = d.id
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


def _hers(subject: erasure_pb2.ErasureSubject, target: Target) -> bool:
    """A provenance subject is the person when its handle or its external id is one of theirs (a
    note names a person by either, on any platform): the entry's other identifier is theirs too."""
    ident = set(target.identifiers)
    return subject.handle in ident or subject.external_id in ident


def _shared(row: asyncpg.Record, target: Target) -> bool:
    """Kept without her: a note a subject erasure found that is not ``theirs`` and whose provenance
    names another person too. A note resting on her alone (every subject hers) is deleted."""
    if target.kind is not Kind.SUBJECT or row["theirs"]:
        return False
    return any(not _hers(s, target) for s in provenance_from_json(row["provenance"]).subjects)


def _without(provenance: str | None, target: Target) -> provenance_pb2.Provenance:
    """The provenance without the person: their entries (with every identifier in them) leave
    ``subjects``, their run ids leave ``turn_ids``."""
    msg = provenance_from_json(provenance)
    turns = set(target.turn_ids)
    kept = [s for s in msg.subjects if not _hers(s, target)]
    del msg.subjects[:]
    msg.subjects.extend(kept)
    runs = [t for t in msg.turn_ids if t not in turns]
    del msg.turn_ids[:]
    msg.turn_ids.extend(runs)
    return msg


def _digests(keys: list[tuple[str, str]]) -> list[str]:
    """A key may name someone: the receipt keeps a digest of each, never the key."""
    return [hashlib.sha256(f"{seat}/{key}".encode()).hexdigest()[:16] for seat, key in keys]


async def _keys(conn: asyncpg.Connection | asyncpg.Pool, target: Target, gone: list[object]) -> list[tuple[str, str]]:
    """The idempotency keys an erasure takes: the seat's or the company's; for a person, the keys
    of the notes it deletes and the keys naming them."""
    if target.kind is Kind.SUBJECT:
        rows = await conn.fetch(SQL["requests_of"], target.company, gone, target.sql_pattern(), list(target.turn_ids))
    else:
        rows = await scope_rows(conn, target, "diary_requests", "seat, request_id")
    return sorted((r["seat"], r["request_id"]) for r in rows)


async def find(
    pool: asyncpg.Pool, target: Target, index: VectorIndex | None = None, embedder: Embedder | None = None
) -> Report:
    """What the diary still holds of the target: rows, and (given the index) points of erased
    notes or near the person's names whose notes name them (``verify_index``)."""
    report = Report(OWNER)
    rows = await _rows(pool, target)
    gone = [r["id"] for r in rows if not _shared(r, target)]
    if gone:
        report.add("agent_diary", gone)
    if keys := await _keys(pool, target, gone):
        report.add("diary_requests", _digests(keys))
    if shared := [r["id"] for r in rows if _shared(r, target)]:
        report.add("note_provenance", shared, changed=True)
    await verify_index(pool, index, embedder, OWNER, COLLECTION_BASE, "agent_diary", "content", target, report)
    return report


async def erase(pool: asyncpg.Pool, index: VectorIndex | None, target: Target, now: datetime) -> Report:
    async def work(conn: asyncpg.Connection) -> Report:
        report = Report(OWNER)
        rows = await _rows(conn, target)
        gone = [r for r in rows if not _shared(r, target)]
        keys = await _keys(conn, target, [r["id"] for r in gone])
        await delete_indexed(conn, report, "agent_diary", COLLECTION_BASE, gone)
        if target.kind is Kind.SUBJECT:
            await delete_keyed(conn, "diary_requests", target.company, keys, ("seat", "request_id"))
        else:
            await delete_scope(conn, target, "diary_requests")
        if keys:
            report.add("diary_requests", _digests(keys))
        shared = [r for r in rows if _shared(r, target)]
        for row in shared:
            left = _without(row["provenance"], target)
            await conn.execute(SQL["unsource"], row["id"], provenance_subjects(left), provenance_json(left))
        if shared:
            report.add("note_provenance", [r["id"] for r in shared], changed=True)
        return report

    return await run_once(pool, OWNER, target, now, work, index=index)


async def record_provenance(pool: asyncpg.Pool, note_id: object, msg: provenance_pb2.Provenance, now: datetime) -> None:
    """Keep a written note's provenance (once: a retried write finds it kept)."""
    await pool.execute(SQL["record"], uuid.UUID(str(note_id)), provenance_subjects(msg), provenance_json(msg), now)


async def provenance(
    pool: asyncpg.Pool, company: str, seat: str, note_id: str, now: datetime
) -> provenance_pb2.Provenance:
    """The note's provenance; a note written before provenance was kept names its run id only. A
    SHORT note past its expiry at ``now`` (not swept yet) is NOT_FOUND, as GetNote answers it."""
    row = await provenance_row(pool, SQL["provenance"], "note", note_id, company, seat, domain=DOMAIN)
    if row["expire_time"] is not None and row["expire_time"] <= now:
        require_found(None, "note", note_id, seat=seat, domain=DOMAIN)
    msg = provenance_from_json(row["provenance"])
    if not msg.turn_ids and row["turn_id"]:
        msg.turn_ids.append(row["turn_id"])
    return msg


async def prune_retention(pool: asyncpg.Pool, index: VectorIndex | None, privacy: PrivacyConfig, now: datetime) -> int:
    """Delete notes older than their company's ``note_max_age_days`` (with their vectors); how many.
    The idempotency keys go by the same age (a key is kept as long as a note written with it
    would be: past it, a retry is far outside any redelivery window)."""
    for company, cutoff in await retention_cutoffs(pool, "diary_requests", privacy, "note_max_age_days", now):
        await pool.execute(SQL["requests_past_retention"], company, cutoff)
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
