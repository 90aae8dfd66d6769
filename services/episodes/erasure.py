"""The episodes' part of an erasure (issue 17, ``libs.common.erasure``).

- A raw row is one turn: the person's (they are among its subjects, its run id is one of theirs,
  or its text names them) is deleted, with its vector, its fill pieces and its collapsed run ids.
- A compacted row rests on many turns. Its text is kept only when it does not name the person;
  their identifiers leave ``subjects_involved`` and their run ids leave ``exemplar_turn_ids``
  (the row is *changed*). A compacted row whose text names them, or whose only subjects were
  them, is deleted (re-deriving the summary by a model is not done: deleting is the simplest
  correct rule, and the lifecycle folds the remaining raw rows again).
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import asyncpg

from agentlearn.common.v1 import erasure_pb2, provenance_pb2
from libs.common.config import PrivacyConfig
from libs.common.erasure import Kind, Report, Target, drop_points, retention_cutoffs, run_once
from libs.common.errors import NotFound
from libs.common.vectorindex import VectorIndex
from services.episodes.domain import COLLECTION_BASE, DOMAIN

__all__ = ["OWNER", "erase", "find", "provenance", "prune_retention"]

OWNER = "episodes"

_TEXT = "(label || ' ' || ask || ' ' || what_it_did || ' ' || review_outcome)"
_COMPACTED_TEXT = (
    "(label || ' ' || ask || ' ' || what_it_did || ' ' || common_task_pattern || ' ' || common_outcome"
    " || ' ' || array_to_string(notable_patterns, ' '))"
)
SQL = {
    "raw_subject": f"""
        SELECT id, turn_id, embedding_dims, carried FROM (
            SELECT id, turn_id, embedding_dims, {_TEXT} ~* $4 AS names,
                   (subjects && $2::text[] OR turn_id = ANY($3::text[])
                    OR EXISTS (SELECT 1 FROM episode_runs r
                               WHERE r.episode_id = e.id AND r.turn_id = ANY($3::text[]))) AS carried
            FROM episodes e WHERE company = $1 AND kind = 'raw') raw
        WHERE carried OR names""",
    "runs_of": "SELECT turn_id FROM episode_runs WHERE episode_id = ANY($1::uuid[])",
    "compacted_subject": f"""
        SELECT id, subjects_involved, exemplar_turn_ids, {_COMPACTED_TEXT} ~* $4 AS names FROM episodes
        WHERE company = $1 AND kind = 'compacted'
          AND (subjects_involved && $2::text[] OR exemplar_turn_ids && $3::text[] OR {_COMPACTED_TEXT} ~* $4)""",
    Kind.SEAT: "SELECT id, turn_id, embedding_dims FROM episodes WHERE company = $1 AND seat = $2",
    Kind.COMPANY: "SELECT id, turn_id, embedding_dims FROM episodes WHERE company = $1",
    "delete": "DELETE FROM episodes WHERE id = ANY($1::uuid[])",
    "pieces": "DELETE FROM fill_pieces WHERE row_id = ANY($1::uuid[])",
    "past_retention": """
        DELETE FROM episodes WHERE company = $1 AND end_time < $2 RETURNING id, embedding_dims""",
    "provenance": """
        SELECT kind, turn_id, work_key, subjects, subjects_involved, exemplar_turn_ids,
               ARRAY(SELECT r.turn_id FROM episode_runs r WHERE r.episode_id = e.id ORDER BY r.turn_id) AS runs
        FROM episodes e WHERE id = $1 AND company = $2 AND seat = $3""",
    "unanchor": "UPDATE episodes SET exemplar_of = NULL WHERE exemplar_of = ANY($1::uuid[])",
    "strip": """
        UPDATE episodes
        SET subjects_involved = ARRAY(SELECT s FROM unnest(subjects_involved) s WHERE s <> ALL($2::text[])),
            exemplar_turn_ids = ARRAY(SELECT t FROM unnest(exemplar_turn_ids) t WHERE t <> ALL($3::text[]))
        WHERE id = $1""",
}


async def _plan(conn: asyncpg.Connection | asyncpg.Pool, target: Target) -> tuple[list[Any], list[Any], list[Any]]:
    """(rows to delete with their widths, compacted rows to change, run ids of deleted raw rows)."""
    if target.kind is Kind.SEAT:
        rows = await conn.fetch(SQL[Kind.SEAT], target.company, target.seat)
        return list(rows), [], [r["turn_id"] for r in rows if r["turn_id"]]
    if target.kind is Kind.COMPANY:
        rows = await conn.fetch(SQL[Kind.COMPANY], target.company)
        return list(rows), [], [r["turn_id"] for r in rows if r["turn_id"]]
    ident, turns, pattern = target.identifiers, list(target.turn_ids), target.sql_pattern()
    raw = list(await conn.fetch(SQL["raw_subject"], target.company, ident, turns, pattern))
    # Her turns are the rows that carried her messages; a row that only names her (someone else's
    # turn mentioning her) is deleted too, but its run id is not hers: what else it taught stays.
    carried = [r for r in raw if r["carried"]]
    runs = [r["turn_id"] for r in carried]
    runs += [r["turn_id"] for r in await conn.fetch(SQL["runs_of"], [r["id"] for r in carried])]
    gone, changed = list(raw), []
    gone_turns = set(turns) | set(runs)
    for row in await conn.fetch(SQL["compacted_subject"], target.company, ident, turns, pattern):
        others = [s for s in row["subjects_involved"] if s not in ident]
        if row["names"] or not others:
            gone.append({"id": row["id"], "turn_id": None, "embedding_dims": None})
        else:
            changed.append(row["id"])
    return gone, changed, sorted(gone_turns)


async def find(pool: asyncpg.Pool, target: Target) -> Report:
    report = Report(OWNER)
    gone, changed, runs = await _plan(pool, target)
    if gone:
        report.add("episodes", [r["id"] for r in gone])
    if changed:
        report.add("episodes", changed, changed=True)
    if target.kind is Kind.SUBJECT:
        report.turn_ids.update(runs)
    return report


async def erase(pool: asyncpg.Pool, index: VectorIndex | None, target: Target, now: datetime) -> Report:
    async def work(conn: asyncpg.Connection) -> Report:
        report = Report(OWNER)
        gone, changed, _runs = await _plan(conn, target)
        ids = [r["id"] for r in gone]
        await conn.execute(SQL["unanchor"], ids)
        await conn.execute(SQL["delete"], ids)
        await conn.execute(SQL["pieces"], ids)
        for episode_id in changed:
            await conn.execute(SQL["strip"], episode_id, target.identifiers, list(target.turn_ids))
        report.add("episodes", ids)
        if changed:
            report.add("episodes", changed, changed=True)
        report.add_points(COLLECTION_BASE, [(r["id"], r["embedding_dims"]) for r in gone])
        report.turn_ids.update(r["turn_id"] for r in gone if r["turn_id"])
        return report

    return await run_once(pool, OWNER, target, now, work, index=index)


async def provenance(pool: asyncpg.Pool, company: str, seat: str, episode_id: str) -> provenance_pb2.Provenance:
    """A raw row: its run id, the redeliveries collapsed into it, its work key and the people its
    turn carried. A compacted row: its exemplars' run ids and every person its turns carried."""
    row = await pool.fetchrow(SQL["provenance"], uuid.UUID(episode_id), company, seat)
    if row is None:
        raise NotFound(
            f"episode {episode_id} not found for seat {seat}",
            reason="EPISODE_NOT_FOUND",
            domain=DOMAIN,
            metadata={"episode_id": episode_id, "seat": seat},
        )
    raw = row["kind"] == "raw"
    turns = [row["turn_id"], *row["runs"]] if raw else list(row["exemplar_turn_ids"])
    people = row["subjects"] if raw else row["subjects_involved"]
    return provenance_pb2.Provenance(
        turn_ids=[t for t in turns if t],
        work_key=row["work_key"] or "",
        subjects=[erasure_pb2.ErasureSubject(handle=p) for p in people],
        writer="episodist" if raw else "episode_lifecycle",
    )


async def prune_retention(pool: asyncpg.Pool, index: VectorIndex | None, privacy: PrivacyConfig, now: datetime) -> int:
    """Delete episodes (raw and compacted) that ended before their company's
    ``episode_max_age_days`` (with their vectors); how many."""
    deleted = 0
    for company, cutoff in await retention_cutoffs(pool, "episodes", privacy, "episode_max_age_days", now):
        async with pool.acquire() as conn, conn.transaction():
            rows = await conn.fetch(SQL["past_retention"], company, cutoff)
            ids = [r["id"] for r in rows]
            await conn.execute(SQL["unanchor"], ids)
            await conn.execute(SQL["pieces"], ids)
        report = Report(OWNER)
        report.add_points(COLLECTION_BASE, [(r["id"], r["embedding_dims"]) for r in rows])
        await drop_points(index, report.points)
        deleted += len(rows)
    return deleted
