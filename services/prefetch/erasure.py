"""The prefetch's part of an erasure (issue 17, ``libs.common.erasure``): the frozen turn contexts
(rendered blocks: notes, profiles, episodes of the turn) and the refresh ledgers (the notes a hint
selected) of a person's turns or naming them, of a seat, or of a company; a seat's or a company's
onboarding markers too.

A person's erasure drops **every** frozen turn context and refresh ledger of the company made up to
the erasure, not only those naming the person: they are caches (a context is kept a day so a
redelivered turn start gets the same answer; a ledger lives for one run) holding rendered note text,
and a note derived from her messages need not name her, so no text match can find it. Losing them
costs a redelivered turn start a rebuild from the erased stores; keeping one would show her lesson
again. The verification (``find``) still looks only for rows naming her or her turns: contexts built
after the erasure were built from stores without her."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import asyncpg

from libs.common.erasure import Kind, Report, Target, delete_keyed, run_once, scope_rows

__all__ = ["OWNER", "erase", "find", "pool_of"]

OWNER = "prefetch"

SQL = {
    "contexts_subject": """
        SELECT seat, turn_id FROM turn_contexts
        WHERE company = $1 AND (turn_id = ANY($2::text[]) OR coalesce(context::text, '') ~* $3)""",
    "ledgers_subject": """
        SELECT DISTINCT r.seat, r.turn_id FROM refresh_ledger_runs r
        LEFT JOIN refresh_ledger_hints h USING (company, seat, turn_id)
        WHERE r.company = $1 AND (r.turn_id = ANY($2::text[]) OR (h.hint || ' ' || h.notes::text) ~* $3)""",
    # The erasure's own plan for a person: every cached context/ledger of the company made up to now.
    "contexts_before": "SELECT seat, turn_id FROM turn_contexts WHERE company = $1 AND create_time <= $2",
    "ledgers_before": "SELECT seat, turn_id FROM refresh_ledger_runs WHERE company = $1 AND create_time <= $2",
    "delete_markers": "DELETE FROM agent_onboarding_markers WHERE company = $1 AND seat = ANY($2::text[])",
}


def pool_of(store: object) -> asyncpg.Pool:
    """The prefetch store's pool (it keeps it private): an erasure runs its own transaction."""
    return store._pool  # type: ignore[attr-defined]  # the store keeps its pool private; an erasure runs its own transaction


async def _plan(
    conn: asyncpg.Connection | asyncpg.Pool, target: Target, before: datetime | None = None
) -> tuple[list[Any], list[Any], list[Any]]:
    """What to erase (``before`` given: a person's erasure takes the company's caches up to then) or
    what the verification must not find (``before`` None: only what names her or her turns)."""
    c = target.company
    if target.kind is Kind.SUBJECT:
        args = (c, list(target.turn_ids), target.sql_pattern())
        contexts = await conn.fetch(SQL["contexts_subject"], *args)
        ledgers = await conn.fetch(SQL["ledgers_subject"], *args)
        if before is not None:
            contexts = [*contexts, *await conn.fetch(SQL["contexts_before"], c, before)]
            ledgers = [*ledgers, *await conn.fetch(SQL["ledgers_before"], c, before)]
        markers: list[Any] = []
    else:  # a seat's or a company's: every one of the seat (the company)
        contexts = await scope_rows(conn, target, "turn_contexts", "seat, turn_id")
        ledgers = await scope_rows(conn, target, "refresh_ledger_runs", "seat, turn_id")
        markers = await scope_rows(conn, target, "agent_onboarding_markers", "seat")

    def pairs(rows: list[Any]) -> list[tuple[str, str]]:
        return sorted({(r["seat"], r["turn_id"]) for r in rows})

    return pairs(contexts), pairs(ledgers), [r["seat"] for r in markers]


def _report(contexts: list[Any], ledgers: list[Any], markers: list[Any]) -> Report:
    report = Report(OWNER)
    if contexts:
        report.add("turn_contexts", [f"{s}/{t}" for s, t in contexts])
    if ledgers:
        report.add("refresh_ledger_runs", [f"{s}/{t}" for s, t in ledgers])
    if markers:
        report.add("agent_onboarding_markers", markers)
    return report


async def find(pool: asyncpg.Pool, target: Target) -> Report:
    return _report(*await _plan(pool, target))


async def erase(pool: asyncpg.Pool, target: Target, now: datetime) -> Report:
    async def work(conn: asyncpg.Connection) -> Report:
        contexts, ledgers, markers = await _plan(conn, target, before=now)
        c = target.company
        await delete_keyed(conn, "turn_contexts", c, contexts)
        await delete_keyed(conn, "refresh_ledger_runs", c, ledgers)
        await conn.execute(SQL["delete_markers"], c, markers)
        return _report(contexts, ledgers, markers)

    return await run_once(pool, OWNER, target, now, work)
