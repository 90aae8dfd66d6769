"""The reflector's part of an erasure (issue 17, ``libs.common.erasure``).

The reflector keeps two things per turn: its reflection record (``reflections``: state, gate,
workers' outcomes) and its job in the shared queue (kind ``reflection``), whose payload is the
serialized ``TurnCompleted`` — the person's messages, verbatim. A person's turns are found by
reading those payloads (a sender with their handle or external id, or text that names them):
that is the collection pass the coordinator starts from. Erasing them deletes the records and
keeps no copy of the text: every job of theirs keeps its row (it is the durable "reflected once"
gate) with an empty payload, and one not yet run is closed as finished (its record deleted with
it), so it never writes anything derived from them and a redelivery of the turn (the engine
retrying SubmitTurn) is refused as a duplicate instead of being reflected again: a job row so
emptied with no record is what the service answers REFLECTION_STATE_ERASED for. A seat's or a company's erasure deletes
the rows. Either way a worker reflecting one of those turns is told at the commit (a NOTIFY,
``libs.common.jobs.HeldClaims``) and stops its pass at once: nothing more derived from the person
is written after the erasure took the turn.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import asyncpg

from agentlearn.reflector.v1 import reflector_service_pb2 as pb
from libs.common.config import PrivacyConfig
from libs.common.erasure import (
    Kind,
    Report,
    Target,
    delete_keyed,
    platform_key,
    retention_cutoffs,
    run_once,
    scope_rows,
)
from libs.common.jobs import NOTIFY_CHANNEL, revoked_payload
from services.reflector.domain import JOB_KIND, ROUND_SUFFIX, run_id_of, turn_id_of

__all__ = ["OWNER", "erase", "find", "prune_retention"]

OWNER = "reflector"
BATCH = 500
_OF_KIND = f" AND kind = '{JOB_KIND}'"
"""The reflector's jobs among the shared queue's (a condition on ``background_jobs``)."""
_REVOKED = revoked_payload(JOB_KIND)

SQL = {
    "jobs": f"""
        SELECT id, key, seat, payload, state FROM background_jobs
        WHERE kind = '{JOB_KIND}' AND company = $1 AND id > $2 AND length(payload) > 0
        ORDER BY id LIMIT $3""",
    "records_subject": """
        SELECT seat, turn_id FROM reflections
        WHERE company = $1 AND (turn_id = ANY($2::text[]) OR coalesce(reason, '') || ' ' || workers::text ~* $3)""",
    "records_of": """
        SELECT r.seat, r.turn_id FROM reflections r JOIN unnest($2::text[], $3::text[]) AS g(seat, turn_id)
            ON r.seat = g.seat AND r.turn_id = g.turn_id
        WHERE r.company = $1""",
    # Every statement that takes jobs away tells their holders at its commit (``revoked_payload``):
    # a worker reflecting one of them stops at once instead of at its next renewal.
    "delete_jobs": """
        WITH gone AS (DELETE FROM background_jobs WHERE id = ANY($1::bigint[]) RETURNING id)
        SELECT pg_notify($2, $3) WHERE EXISTS (SELECT 1 FROM gone)""",
    # Finished records only, as for their jobs: a turn still waiting (deferred by its budget,
    # retrying) keeps its record, whose absence the harness reads as an erasure.
    "records_past": """
        DELETE FROM reflections
        WHERE company = $1 AND submit_time < $2 AND state IN ('completed', 'gated', 'dead_lettered')""",
    "jobs_past": f"""
        DELETE FROM background_jobs
        WHERE kind = '{JOB_KIND}' AND company = $1 AND state IN ('done', 'dead', 'interrupted') AND create_time < $2""",
    # A job of her turn keeps its row (the duplicate gate: a redelivered SubmitTurn of the same run
    # finds it and queues nothing) and loses the turn's text. One not run yet is closed as finished
    # ($2: the erasure's time), so no worker claims it; a worker holding it loses its claim (its
    # finish is guarded by the claim) and, told at this commit ($3, $4: the revocation's NOTIFY),
    # stops its pass there and then; what it already wrote is the next round's.
    "empty_jobs": """
        WITH emptied AS (
            UPDATE background_jobs
            SET payload = ''::bytea, state = CASE WHEN state IN ('queued', 'running') THEN 'done' ELSE state END,
                finish_time = coalesce(finish_time, $2), reason = CASE WHEN state IN ('queued', 'running')
                    THEN 'erased before it was reflected' ELSE reason END,
                locked_by = NULL, locked_until = NULL
            WHERE id = ANY($1::bigint[])
            RETURNING id)
        SELECT pg_notify($3, $4) WHERE EXISTS (SELECT 1 FROM emptied)""",
}


def _her_identifiers(turn: pb.TurnCompleted, target: Target) -> set[str]:
    """Every identifier of the turn's senders that are the person: a sender whose handle or
    external id is one of theirs, on their platform (the payload keeps the engine's spelling of the
    platform, "Slack", the target a folded one: compared through ``platform_key``). Such a sender's
    other identifier is theirs too. Empty: the turn did not carry their messages."""
    ident = set(target.identifiers)
    found: set[str] = set()
    for inter in turn.interactions:
        sender = inter.sender
        if (sender.handle in ident or sender.external_id in ident) and (
            not target.platform or not sender.platform or platform_key(sender.platform) == target.platform
        ):
            found |= {x for x in (sender.handle, sender.external_id) if x}
    return found


def _names(turn: pb.TurnCompleted, target: Target) -> bool:
    """The turn's text names the person (someone else's message mentioning them)."""
    texts = [turn.label, turn.ask, turn.what_it_did, turn.review_outcome]
    texts += [i.body for i in turn.interactions]
    texts += [i.sender.display_name for i in turn.interactions]
    return target.names_text(*texts)


@dataclass
class _Found:
    jobs: list[Any] = field(default_factory=list)
    """The jobs whose turn carried the person or names them."""
    records: list[tuple[str, str]] = field(default_factory=list)
    """Reflection records to erase: (seat, turn id)."""
    theirs: list[str] = field(default_factory=list)
    """Run ids whose turn carried the person."""
    aliases: set[str] = field(default_factory=set)
    """Identifiers the person's messages came under that the target does not name."""


async def _subject_jobs(conn: asyncpg.Connection | asyncpg.Pool, target: Target) -> _Found:
    """The jobs whose turn carried the person or names them; the run ids that carried them (a turn
    that only names them keeps no copy of their name, but what else it taught is not theirs); the
    other identifiers they sent under."""
    out = _Found()
    theirs: set[str] = set()
    named = set(target.turn_ids)
    after = 0
    while True:
        rows = await conn.fetch(SQL["jobs"], target.company, after, BATCH)
        if not rows:
            out.theirs = sorted(theirs)
            out.aliases -= set(target.identifiers)
            return out
        for row in rows:
            after = row["id"]
            run = run_id_of(turn_id_of(row["key"]))
            try:
                turn = pb.TurnCompleted.FromString(bytes(row["payload"]))
            except Exception:  # an unreadable payload is no evidence either way
                turn = None
            hers = _her_identifiers(turn, target) if turn is not None else set()
            out.aliases |= hers
            if run in named or hers:
                out.jobs.append(row)
                theirs.add(run)
            elif turn is not None and _names(turn, target):
                out.jobs.append(row)


async def _plan(conn: asyncpg.Connection | asyncpg.Pool, target: Target) -> _Found:
    """The jobs and records to erase, the run ids that carried the person, their aliases."""
    if target.kind is not Kind.SUBJECT:  # a seat's or a company's: every one of the seat (the company)
        jobs = await scope_rows(conn, target, "background_jobs", "id, key, state", also=_OF_KIND)
        records = await scope_rows(conn, target, "reflections", "seat, turn_id")
        return _Found(jobs=jobs, records=[(r["seat"], r["turn_id"]) for r in records])
    found = await _subject_jobs(conn, target)
    # Run ids (a self_iterate round's reflection is its run's: domain.reflection_id); the records are
    # the runs' and their rounds'.
    turns = sorted(set(target.turn_ids) | set(found.theirs))
    keys = [*turns, *(t + ROUND_SUFFIX for t in turns)]
    records = await conn.fetch(SQL["records_subject"], target.company, keys, target.sql_pattern())
    found.records = [(r["seat"], r["turn_id"]) for r in records]
    # A turn the erasure closes before it was reflected (one that only names them, not carrying
    # their messages) loses its record too: left as it was, it said QUEUED (or RUNNING) for ever of
    # a turn that will never run. Gone, the turn answers ERASED, as theirs do.
    closed = sorted({(j["seat"], turn_id_of(j["key"])) for j in found.jobs if j["state"] in ("queued", "running")})
    if closed:
        seats, turn_ids = [list(c) for c in zip(*closed, strict=True)]
        rows = await conn.fetch(SQL["records_of"], target.company, seats, turn_ids)
        found.records += sorted({(r["seat"], r["turn_id"]) for r in rows} - set(found.records))
    return found


def _report(found: _Found) -> Report:
    report = Report(OWNER)
    if found.jobs:
        report.add("background_jobs:reflection", [j["key"] for j in found.jobs])
    if found.records:
        report.add("reflections", [f"{seat}/{turn}" for seat, turn in found.records])
    report.turn_ids.update(found.theirs)
    report.aliases.update(found.aliases)
    return report


async def find(pool: asyncpg.Pool, target: Target) -> Report:
    return _report(await _plan(pool, target))


async def erase(pool: asyncpg.Pool, target: Target, now: datetime) -> Report:
    async def work(conn: asyncpg.Connection) -> Report:
        found = await _plan(conn, target)
        ids = [j["id"] for j in found.jobs]
        if target.kind is Kind.SUBJECT:
            # Every job of hers stays as an emptied, finished row: deleting a queued one let an
            # engine's retry of SubmitTurn queue the whole turn again, and everything of hers was
            # derived anew after an erasure that had succeeded.
            await conn.execute(SQL["empty_jobs"], ids, now, NOTIFY_CHANNEL, _REVOKED)
        else:  # a seat's or a company's: the rows go (the seat, the company, is gone)
            await conn.execute(SQL["delete_jobs"], ids, NOTIFY_CHANNEL, _REVOKED)
        await delete_keyed(conn, "reflections", target.company, found.records)
        return _report(found)

    return await run_once(pool, OWNER, target, now, work)


async def prune_retention(pool: asyncpg.Pool, privacy: PrivacyConfig, now: datetime) -> int:
    """The reflector's records prune: reflection records, and the finished jobs holding their turns,
    older than their company's ``reflection_max_age_days``. How many rows went."""
    deleted = 0
    for company, cutoff in await retention_cutoffs(pool, "reflections", privacy, "reflection_max_age_days", now):
        async with pool.acquire() as conn, conn.transaction():
            for name in ("records_past", "jobs_past"):
                status = await conn.execute(SQL[name], company, cutoff)
                deleted += int(status.split()[-1])
    return deleted
