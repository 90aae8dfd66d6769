"""The sessions' part of an erasure (issue 17, ``libs.common.erasure``).

A person's sessions (they own them) are deleted with everything recorded in them (events, plans,
learning-check receipts: the foreign keys cascade). An event, plan or receipt of someone else's
session that names them is deleted too. A workspace lesson rests on the sessions that taught it:
one taught only by the erased sessions (or naming the person) is deleted, and its knowledge page is
reported for the knowledge owner to remove; one also taught by others loses those sources
(changed). The collection pass reports the person's sessions and the run ids recorded in them.

The erased sessions' learning jobs (``background_jobs`` of kind ``learning``) are deleted too,
unlike the reflector's (whose emptied rows stay as the "reflected once" gate): a check's job key is
``plan:<session>:<revision>``, ``turn:<session>:<seq>`` or ``manual:<session>:<uuid>``, and a
session recreated under the same id starts its revisions and sequence again, so a kept row would
refuse the new session's checks their jobs. Nothing is gated by the old rows: the session they
belonged to is gone. A check running when its job is deleted is stopped at once (the delete
NOTIFYs its revocation: ``libs.common.jobs.HeldClaims``), before it writes what it learned from the
erased session.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import asyncpg

from libs.common.erasure import Kind, Report, Target, delete_keyed, run_once, scope_rows
from libs.common.jobs import NOTIFY_CHANNEL, revoked_payload
from services.sessions.domain import JOB_KIND

__all__ = ["OWNER", "erase", "find"]

OWNER = "sessions"

SQL = {
    "sessions_subject": "SELECT session_id FROM chat_sessions WHERE company = $1 AND owner = ANY($2::text[])",
    "turns_of": """
        SELECT DISTINCT turn_id FROM session_events
        WHERE company = $1 AND session_id = ANY($2::text[]) AND turn_id <> ''
        UNION SELECT DISTINCT turn_id FROM learning_checks
        WHERE company = $1 AND session_id = ANY($2::text[]) AND turn_id <> ''""",
    "events_naming": """
        SELECT session_id, seq FROM session_events
        WHERE company = $1 AND NOT (session_id = ANY($2::text[])) AND text ~* $3""",
    "plans_naming": """
        SELECT session_id, revision FROM session_plans
        WHERE company = $1 AND NOT (session_id = ANY($2::text[])) AND steps::text ~* $3""",
    "checks_naming": """
        SELECT id FROM learning_checks
        WHERE company = $1 AND NOT (session_id = ANY($2::text[]))
          AND (reason || ' ' || outputs::text || ' ' || dropped::text || ' ' || partial_failures::text
               || ' ' || evidence::text) ~* $3""",
    "lessons": """
        SELECT workspace, content_hash, page_id, sources, (title || ' ' || body) ~* $3 AS names
        FROM workspace_lessons
        WHERE company = $1 AND (EXISTS (SELECT 1 FROM jsonb_array_elements(sources) s
                                        WHERE s->>'session_id' = ANY($2::text[]))
                                OR (title || ' ' || body) ~* $3)""",
    "lessons_company": """
        SELECT workspace, content_hash, page_id, sources, true AS names FROM workspace_lessons WHERE company = $1""",
    # A learning job's key is <trigger>:<session id>:<revision, seq or uuid>; a session id may hold
    # ':' itself, so the id is what lies between the first ':' and the last one.
    "jobs_of": """
        SELECT key FROM background_jobs
        WHERE kind = 'learning' AND company = $1 AND substring(key from '^[a-z]+:(.*):[^:]*$') = ANY($2::text[])""",
    # The revocation's NOTIFY ($3, $4) goes out at the commit: a worker running one of these checks
    # stops it at once, before it writes lessons or facts of the erased session.
    "delete_jobs": """
        WITH gone AS (
            DELETE FROM background_jobs WHERE kind = 'learning' AND company = $1 AND key = ANY($2::text[])
            RETURNING id)
        SELECT pg_notify($3, $4) WHERE EXISTS (SELECT 1 FROM gone)""",
    "delete_sessions": "DELETE FROM chat_sessions WHERE company = $1 AND session_id = ANY($2::text[])",
    "delete_checks": "DELETE FROM learning_checks WHERE id = ANY($1::uuid[])",
    "delete_lesson": "DELETE FROM workspace_lessons WHERE company = $1 AND workspace = $2 AND content_hash = $3",
    "set_sources": """
        UPDATE workspace_lessons SET sources = $4::jsonb WHERE company = $1 AND workspace = $2 AND content_hash = $3""",
}


class _Plan:
    def __init__(self) -> None:
        self.sessions: list[str] = []
        self.turns: list[str] = []
        self.events: list[tuple[str, int]] = []
        self.plans: list[tuple[str, int]] = []
        self.checks: list[Any] = []
        self.jobs: list[str] = []
        self.lessons_gone: list[asyncpg.Record] = []
        self.lessons_changed: list[tuple[asyncpg.Record, list[Any]]] = []


async def _plan(conn: asyncpg.Connection | asyncpg.Pool, target: Target) -> _Plan:
    plan = _Plan()
    c = target.company
    if target.kind is Kind.SUBJECT:
        rows = await conn.fetch(SQL["sessions_subject"], c, target.identifiers)
    else:  # a seat's or a company's: every one of the seat (the company)
        rows = await scope_rows(conn, target, "chat_sessions", "session_id")
    plan.sessions = sorted({r["session_id"] for r in rows})
    # The sessions the collection pass already named count as erased even once they are gone.
    every = sorted(set(plan.sessions) | set(target.session_ids))
    plan.turns = sorted({r["turn_id"] for r in await conn.fetch(SQL["turns_of"], c, every)})
    plan.turns += [f"session:{s}" for s in every]
    plan.jobs = sorted(r["key"] for r in await conn.fetch(SQL["jobs_of"], c, every))
    pattern = target.sql_pattern() if target.kind is Kind.SUBJECT else "a^"
    if target.kind is Kind.SUBJECT:
        plan.events = [(r["session_id"], r["seq"]) for r in await conn.fetch(SQL["events_naming"], c, every, pattern)]
        plan.plans = [
            (r["session_id"], r["revision"]) for r in await conn.fetch(SQL["plans_naming"], c, every, pattern)
        ]
        plan.checks = [r["id"] for r in await conn.fetch(SQL["checks_naming"], c, every, pattern)]
    if target.kind is Kind.COMPANY:
        lessons = await conn.fetch(SQL["lessons_company"], c)
    else:
        lessons = await conn.fetch(SQL["lessons"], c, every, pattern)
    erased = set(every)
    for lesson in lessons:
        sources = json.loads(lesson["sources"]) if isinstance(lesson["sources"], str) else list(lesson["sources"])
        rest = [s for s in sources if s.get("session_id") not in erased]
        if lesson["names"] or not rest:
            plan.lessons_gone.append(lesson)
        else:
            plan.lessons_changed.append((lesson, rest))
    return plan


def _report(target: Target, plan: _Plan) -> Report:
    report = Report(OWNER)
    if plan.sessions:
        report.add("chat_sessions", plan.sessions)
    if plan.events:
        report.add("session_events", [f"{s}/{q}" for s, q in plan.events])
    if plan.plans:
        report.add("session_plans", [f"{s}/{r}" for s, r in plan.plans])
    if plan.checks:
        report.add("learning_checks", plan.checks)
    if plan.jobs:
        report.add("background_jobs:learning", plan.jobs)
    if plan.lessons_gone or plan.lessons_changed:
        report.add("workspace_lessons", [lesson["page_id"] for lesson in plan.lessons_gone])
        report.add("workspace_lessons", [lesson["page_id"] for lesson, _ in plan.lessons_changed], changed=True)
    report.page_ids.update(lesson["page_id"] for lesson in plan.lessons_gone)
    if target.kind is Kind.SUBJECT:
        report.session_ids.update(plan.sessions)
        report.turn_ids.update(plan.turns)
    return report


async def find(pool: asyncpg.Pool, target: Target) -> Report:
    return _report(target, await _plan(pool, target))


async def erase(pool: asyncpg.Pool, target: Target, now: datetime) -> Report:
    async def work(conn: asyncpg.Connection) -> Report:
        plan = await _plan(conn, target)
        c = target.company
        await conn.execute(SQL["delete_sessions"], c, plan.sessions)
        await delete_keyed(conn, "session_events", c, plan.events, ("session_id", "seq"), second_type="bigint")
        await delete_keyed(conn, "session_plans", c, plan.plans, ("session_id", "revision"), second_type="bigint")
        await conn.execute(SQL["delete_checks"], plan.checks)
        await conn.execute(SQL["delete_jobs"], c, plan.jobs, NOTIFY_CHANNEL, revoked_payload(JOB_KIND))
        for lesson in plan.lessons_gone:
            await conn.execute(SQL["delete_lesson"], c, lesson["workspace"], lesson["content_hash"])
        for lesson, rest in plan.lessons_changed:
            await conn.execute(SQL["set_sources"], c, lesson["workspace"], lesson["content_hash"], json.dumps(rest))
        return _report(target, plan)

    return await run_once(pool, OWNER, target, now, work)
