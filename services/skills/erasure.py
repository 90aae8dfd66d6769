"""The skills' part of an erasure (issue 17, ``libs.common.erasure``).

A skill rests on the turns it was drafted from (``source_turn_ids``). A skill whose every source
turn is the person's, or whose text (name, summary, body, or a superseded version's body) names
them, is deleted with its versions. A skill that also rests on other turns, and whose text does not
name them, keeps its body and loses their run ids (changed): a skill is a procedure (tools in
order), so what the person contributed is the evidence, not the words. A skill proposal from their
turns or sessions, or naming them, is deleted.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import asyncpg

from agentlearn.common.v1 import provenance_pb2
from libs.common.erasure import Kind, Report, Target, run_once
from libs.common.errors import NotFound
from services.skills.domain import DOMAIN

__all__ = ["OWNER", "erase", "find", "provenance"]

OWNER = "skills"

_TEXT = "(name || ' ' || summary || ' ' || body || ' ' || array_to_string(tool_sequence, ' '))"
SQL = {
    "skills_subject": f"""
        SELECT s.id, s.source_turn_ids,
               ({_TEXT} ~* $3 OR EXISTS (SELECT 1 FROM synthesized_skill_versions v
                                         WHERE v.skill_id = s.id AND v.body ~* $3)) AS names
        FROM synthesized_skills s
        WHERE company = $1 AND (source_turn_ids && $2::text[] OR {_TEXT} ~* $3
               OR EXISTS (SELECT 1 FROM synthesized_skill_versions v WHERE v.skill_id = s.id AND v.body ~* $3))""",
    "proposals_subject": f"""
        SELECT id FROM skill_proposals
        WHERE company = $1 AND ((turn_id <> '' AND turn_id = ANY($2::text[])) OR {_TEXT} ~* $3
               OR (session_id <> '' AND session_id = ANY($4::text[])))""",
    "skills_seat": "SELECT id FROM synthesized_skills WHERE company = $1 AND seat = $2",
    "proposals_seat": "SELECT id FROM skill_proposals WHERE company = $1 AND seat = $2",
    "skills_company": "SELECT id FROM synthesized_skills WHERE company = $1",
    "proposals_company": "SELECT id FROM skill_proposals WHERE company = $1",
    "delete_skills": "DELETE FROM synthesized_skills WHERE id = ANY($1::uuid[])",
    "delete_proposals": "DELETE FROM skill_proposals WHERE id = ANY($1::uuid[])",
    "strip": """
        UPDATE synthesized_skills
        SET source_turn_ids = ARRAY(SELECT t FROM unnest(source_turn_ids) t WHERE t <> ALL($2::text[]))
        WHERE id = $1""",
    "provenance": """
        SELECT source_turn_ids, trigger FROM synthesized_skills WHERE id = $1 AND company = $2 AND seat = $3""",
    "uses_seat": "DELETE FROM skill_use_requests WHERE company = $1 AND seat = $2",
    "uses_company": "DELETE FROM skill_use_requests WHERE company = $1",
}


async def _plan(conn: asyncpg.Connection | asyncpg.Pool, target: Target) -> tuple[list[Any], list[Any], list[Any]]:
    """(skills to delete, skills to change, proposals to delete)."""
    if target.kind is Kind.SEAT:
        skills = await conn.fetch(SQL["skills_seat"], target.company, target.seat)
        proposals = await conn.fetch(SQL["proposals_seat"], target.company, target.seat)
        return [r["id"] for r in skills], [], [r["id"] for r in proposals]
    if target.kind is Kind.COMPANY:
        skills = await conn.fetch(SQL["skills_company"], target.company)
        proposals = await conn.fetch(SQL["proposals_company"], target.company)
        return [r["id"] for r in skills], [], [r["id"] for r in proposals]
    turns, pattern = list(target.turn_ids), target.sql_pattern()
    gone: list[Any] = []
    changed: list[Any] = []
    for row in await conn.fetch(SQL["skills_subject"], target.company, turns, pattern):
        rest = [t for t in row["source_turn_ids"] if t not in set(turns)]
        (gone if row["names"] or not rest else changed).append(row["id"])
    proposals = await conn.fetch(SQL["proposals_subject"], target.company, turns, pattern, list(target.session_ids))
    return gone, changed, [r["id"] for r in proposals]


def _report(gone: list[Any], changed: list[Any], proposals: list[Any]) -> Report:
    report = Report(OWNER)
    if gone or changed:
        report.add("synthesized_skills", gone)
        report.add("synthesized_skills", changed, changed=True)
    if proposals:
        report.add("skill_proposals", proposals)
    return report


async def find(pool: asyncpg.Pool, target: Target) -> Report:
    return _report(*await _plan(pool, target))


async def erase(pool: asyncpg.Pool, target: Target, now: datetime) -> Report:
    async def work(conn: asyncpg.Connection) -> Report:
        gone, changed, proposals = await _plan(conn, target)
        await conn.execute(SQL["delete_skills"], gone)
        await conn.execute(SQL["delete_proposals"], proposals)
        for skill_id in changed:
            await conn.execute(SQL["strip"], skill_id, list(target.turn_ids))
        if target.kind is Kind.SEAT:
            await conn.execute(SQL["uses_seat"], target.company, target.seat)
        elif target.kind is Kind.COMPANY:
            await conn.execute(SQL["uses_company"], target.company)
        return _report(gone, changed, proposals)

    return await run_once(pool, OWNER, target, now, work)


async def provenance(pool: asyncpg.Pool, company: str, seat: str, skill_id: str) -> provenance_pb2.Provenance:
    """The turns the skill was drafted from (single-turn or clustered synthesis, or its creator)."""
    row = await pool.fetchrow(SQL["provenance"], uuid.UUID(skill_id), company, seat)
    if row is None:
        raise NotFound(
            f"skill {skill_id} not found for seat {seat}",
            reason="SKILL_NOT_FOUND",
            domain=DOMAIN,
            metadata={"skill_id": skill_id, "seat": seat},
        )
    return provenance_pb2.Provenance(turn_ids=list(row["source_turn_ids"]), writer=f"synthesis:{row['trigger']}")
