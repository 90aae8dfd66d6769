"""PostgreSQL store of ``synthesized_skills``, ``synthesized_skill_versions`` and the
``learning_health`` view: named queries, ``$n`` parameters, driver errors kept inside.

Writes that must see a consistent catalogue (create: name, cap and duplicate gates; restore: the
cap) run in a :class:`SeatTx`, a transaction holding the seat's advisory lock, so two drafts for
one seat can never both pass the cap. Writes to one skill (refine, observation, rollback) lock its
row. The curator's transitions are set-based statements that write their events in the same
statement, so a transition and its event are one atomic write and 100,000 skills cost a handful of
statements rather than a loop.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Sequence
from datetime import datetime

import asyncpg
import numpy as np

from agentlearn.common.v1.provenance_pb2 import Provenance
from libs.common.db import as_array, unflushed
from libs.common.erasure import provenance_from_json, provenance_json
from libs.common.errors import AlreadyExists
from libs.common.rows import Conversions, RowReader
from services.skills.domain import (
    DOMAIN,
    LearningHealth,
    ProposalDecision,
    ProposalOrigin,
    ProposalState,
    Skill,
    SkillChange,
    SkillDraft,
    SkillEdit,
    SkillKey,
    SkillProposal,
    SkillState,
    SkillTrigger,
    SkillVersion,
)
from services.skills.ports import Used

__all__ = [
    "PROPOSAL_SQL",
    "SQL",
    "PostgresProposalStore",
    "PostgresSkillStore",
    "SeatTx",
    "SkillKey",
    "StampFailed",
    "name_taken_error",
]

_COLUMNS = """id, company, seat, name, summary, body, tool_sequence, trigger, cluster_size, source_turn_ids,
              state, pinned, version, use_count, last_used_time, last_offered_time, unused_since, state_change_time,
              create_time, update_time, change, change_reason, restored_from_version"""
_S_COLUMNS = ", ".join(f"s.{c.strip()}" for c in _COLUMNS.split(","))
# One skill of the seat by id or by name: exactly one of $3 (id) and $4 (name) is set.
_KEY = "company = $1 AND seat = $2 AND (id = $3::uuid OR name = $4::text)"


def _revived(now: str) -> str:
    """The SET items every touch of a skill shares (a use, an offer, a use without loading): its
    clock of disuse moved to ``now`` (an SQL parameter), and a stale, unpinned skill made active
    again at ``now``, in the same statement as the touch (spec L359: "Revival happens in the same
    transaction as the use"; L367: the offer is what moves the staleness clock)."""
    return f"""unused_since = greatest(s.unused_since, {now}),
                   state = CASE WHEN s.state = 'stale' AND NOT s.pinned THEN 'active' ELSE s.state END,
                   state_change_time = CASE WHEN s.state = 'stale' AND NOT s.pinned THEN {now}
                                            ELSE s.state_change_time END"""


_LOCK_NAMESPACE = 0x736B6C73  # "skls": the seat locks of this service

SQL = {
    "lock_seat": "SELECT pg_advisory_xact_lock($1, hashtext($2 || '/' || $3))",
    "insert": f"""
        INSERT INTO synthesized_skills (id, company, seat, name, summary, body, tool_sequence, trigger, cluster_size,
                                        source_turn_ids, state, unused_since, state_change_time, create_time,
                                        update_time, version_time, change, provenance, version_provenance)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, 'active', $11, $11, $11, $11, $11, 'created', $12, $12)
        RETURNING {_COLUMNS}""",
    "name_taken": "SELECT EXISTS (SELECT 1 FROM synthesized_skills WHERE company = $1 AND seat = $2 AND name = $3)",
    "live": f"""SELECT {_COLUMNS} FROM synthesized_skills
                WHERE company = $1 AND seat = $2 AND state <> 'archived' ORDER BY create_time, name""",
    "all": f"""SELECT {_COLUMNS} FROM synthesized_skills
               WHERE company = $1 AND seat = $2 ORDER BY create_time, name""",
    "get": f"SELECT {_COLUMNS} FROM synthesized_skills WHERE {_KEY}",
    "get_for_update": f"SELECT {_COLUMNS} FROM synthesized_skills WHERE {_KEY} FOR UPDATE",
    # The row lock and whether the call with idempotency key $5 made a kept version (``request_seen``),
    # in one statement. The check reads the statement's snapshot; ``settled`` is false when the row
    # moved while the statement waited for its lock (the live version is not the snapshot's), and
    # the caller then checks again under the lock.
    "get_for_update_seen": f"""
        SELECT {_S_COLUMNS},
               (s.request_id = $5) IS TRUE
               OR EXISTS (SELECT 1 FROM synthesized_skill_versions v WHERE v.skill_id = s.id AND v.request_id = $5)
               AS seen,
               s.version = (SELECT version FROM synthesized_skills WHERE id = s.id) AS settled
        FROM synthesized_skills s WHERE {_KEY} FOR UPDATE""",
    # A use: the body, the count, the clock, and a stale (unpinned) skill revived, in one statement.
    # A use ($5 now): the count, the clock, and revival. With a key ($6: UseSkill's request id) the
    # key is claimed by the same statement, only for a live skill, and the use made only if this
    # statement claimed it; a key claimed before reads the skill as it is (``counted`` false).
    "use": f"""
        WITH prior AS (
            SELECT id, state FROM synthesized_skills WHERE {_KEY} AND state <> 'archived' FOR UPDATE),
        claim AS (
            INSERT INTO skill_use_requests (company, seat, request_id, create_time)
            SELECT $1, $2, $6::text, $5 WHERE $6::text IS NOT NULL AND EXISTS (SELECT 1 FROM prior)
            ON CONFLICT DO NOTHING RETURNING 1),
        moved AS (
            UPDATE synthesized_skills s
               SET use_count = s.use_count + 1, last_used_time = $5, {_revived("$5")}
              FROM prior WHERE s.id = prior.id AND ($6::text IS NULL OR EXISTS (SELECT 1 FROM claim))
            RETURNING {_S_COLUMNS}, prior.state AS prior_state)
        SELECT *, true AS counted FROM moved
        UNION ALL
        SELECT {_S_COLUMNS}, prior.state AS prior_state, false AS counted
        FROM synthesized_skills s JOIN prior ON s.id = prior.id
        WHERE NOT EXISTS (SELECT 1 FROM moved)""",
    # An offer moves the clock (and revives, like a use) of exactly the named live skills.
    "offer": f"""
        WITH prior AS (
            SELECT id, state FROM synthesized_skills
            WHERE company = $1 AND seat = $2 AND (id = ANY($3::uuid[]) OR name = ANY($4::text[]))
              AND state <> 'archived'
            ORDER BY id FOR UPDATE)
        UPDATE synthesized_skills s
           SET last_offered_time = $5, {_revived("$5")}
          FROM prior WHERE s.id = prior.id
        RETURNING s.id, s.name, prior.state AS prior_state, s.state""",
    # Uses without loading (the reflector's SkillUse worker): the count, the clock, and revival;
    # with a request id ($5) the key is claimed in the same statement and the uses are made only
    # if this statement claimed it. One row per skill moved, plus a row of NULLs when none moved;
    # ``applied`` false: the request was applied before.
    "mark_used": f"""
        WITH claim AS (
            INSERT INTO skill_use_requests (company, seat, request_id, create_time)
            SELECT $1, $2, $5::text, $4 WHERE $5::text IS NOT NULL
            ON CONFLICT DO NOTHING RETURNING 1),
        prior AS (
            SELECT id, state FROM synthesized_skills
            WHERE company = $1 AND seat = $2 AND id = ANY($3::uuid[]) AND state <> 'archived'
              AND ($5::text IS NULL OR EXISTS (SELECT 1 FROM claim))
            ORDER BY id FOR UPDATE),
        moved AS (
            UPDATE synthesized_skills s
               SET use_count = s.use_count + 1, last_used_time = $4, {_revived("$4")}
              FROM prior WHERE s.id = prior.id
            RETURNING s.id, s.name, prior.state AS prior_state, s.state)
        SELECT ($5::text IS NULL OR EXISTS (SELECT 1 FROM claim)) AS applied,
               moved.id, moved.name, moved.prior_state, moved.state
        FROM (SELECT 1) AS one LEFT JOIN moved ON true""",
    # A new version in one statement: the live body archived, the new one installed as version + 1,
    # and the archived versions past the newest $9 dropped. Every part reads the statement's snapshot
    # (the row as it was; the archive without the version archived now, whose number is above every
    # archived one), so the trim keeps $9 - 1 of those and the archive is written only when $9 > 0.
    # An observation's bullet ($11, id $10) is recorded with the version that appends it.
    "new_version": f"""
        WITH bullet AS (
            INSERT INTO skill_practice_bullets (id, skill_id, version, bullet, provenance, create_time)
            SELECT $10, id, version + 1, $11::text, $8, $6
            FROM synthesized_skills WHERE id = $1 AND $11::text IS NOT NULL),
        archived AS (
            INSERT INTO synthesized_skill_versions (skill_id, version, body, change, reason, restored_from_version,
                                                    request_id, create_time, supersede_time, provenance)
            SELECT id, version, body, change, change_reason, restored_from_version, request_id, version_time, $6,
                   version_provenance
            FROM synthesized_skills WHERE id = $1 AND $9::int > 0),
        trimmed AS (
            DELETE FROM synthesized_skill_versions WHERE id IN (
                SELECT id FROM synthesized_skill_versions WHERE skill_id = $1
                ORDER BY version DESC OFFSET greatest($9::int - 1, 0)))
        UPDATE synthesized_skills
           SET body = $2, version = version + 1, change = $3, change_reason = $4, restored_from_version = $5,
               version_time = $6, update_time = $6, request_id = $7, version_provenance = $8
         WHERE id = $1
        RETURNING {_COLUMNS}""",
    "request_seen": """
        SELECT EXISTS (SELECT 1 FROM synthesized_skills WHERE id = $1 AND request_id = $2)
            OR EXISTS (SELECT 1 FROM synthesized_skill_versions WHERE skill_id = $1 AND request_id = $2)""",
    # The version the call with idempotency key $2 made (the live one or a kept one), to tell a
    # retry of that call from another request reusing its key.
    "keyed_version": """
        SELECT * FROM (
            SELECT id AS skill_id, version, body, change, change_reason AS reason, restored_from_version,
                   version_time AS create_time, NULL::timestamptz AS supersede_time, true AS current
            FROM synthesized_skills WHERE id = $1 AND request_id = $2
            UNION ALL
            SELECT skill_id, version, body, change, reason, restored_from_version, create_time, supersede_time, false
            FROM synthesized_skill_versions WHERE skill_id = $1 AND request_id = $2) v
        ORDER BY version DESC LIMIT 1""",
    "get_version": """
        SELECT version, body, provenance FROM synthesized_skill_versions WHERE skill_id = $1 AND version = $2""",
    "versions_page": """
        SELECT * FROM (
            SELECT id AS skill_id, version, body, change, change_reason AS reason, restored_from_version,
                   version_time AS create_time, NULL::timestamptz AS supersede_time, true AS current
            FROM synthesized_skills WHERE id = $1
            UNION ALL
            SELECT skill_id, version, body, change, reason, restored_from_version, create_time, supersede_time, false
            FROM synthesized_skill_versions WHERE skill_id = $1) v
        WHERE ($2::int IS NULL OR version < $2)
        ORDER BY version DESC LIMIT $3""",
    "versions_count": "SELECT 1 + count(*) FROM synthesized_skill_versions WHERE skill_id = $1",
    "set_pinned": f"""UPDATE synthesized_skills SET pinned = $2, update_time = $3 WHERE id = $1 RETURNING {_COLUMNS}""",
    "set_state": f"""
        UPDATE synthesized_skills SET state = $2, state_change_time = $3, update_time = $3,
               unused_since = CASE WHEN $4 THEN greatest(unused_since, $3) ELSE unused_since END
         WHERE id = $1 RETURNING {_COLUMNS}""",
    "count_live": "SELECT count(*) FROM synthesized_skills WHERE company = $1 AND seat = $2 AND state <> 'archived'",
    "page": f"""
        SELECT {_COLUMNS} FROM synthesized_skills
        WHERE company = $1 AND seat = $2 AND ($3 OR state <> 'archived') AND ($4::text IS NULL OR name > $4)
        ORDER BY name LIMIT $5""",
    "count": "SELECT count(*) FROM synthesized_skills WHERE company = $1 AND seat = $2 AND ($3 OR state <> 'archived')",
    # The curator. $1 cutoff (clock at or before it has been unused long enough), $2 now, $3 batch.
    # Each statement moves a batch and writes one event per moved skill in the same statement; rows
    # another transaction holds (a use in flight, which would revive them anyway) are skipped.
    "curate": """
        WITH picked AS (
            SELECT id FROM synthesized_skills
            WHERE state = $4 AND NOT pinned AND unused_since <= $1
            LIMIT $3 FOR UPDATE SKIP LOCKED),
        moved AS (
            UPDATE synthesized_skills s SET state = $5, state_change_time = $2, update_time = $2
              FROM picked WHERE s.id = picked.id AND s.state = $4 AND NOT s.pinned AND s.unused_since <= $1
            RETURNING s.id, s.company, s.seat, s.name, s.unused_since),
        logged AS (
            INSERT INTO events (time, kind, company, seat, payload)
            SELECT $2, $6, company, seat,
                   jsonb_build_object('skill_id', id, 'name', name, 'cause', 'curator',
                                      'from_state', $4::text, 'to_state', $5::text,
                                      'unused_since', unused_since,
                                      'days_unused', floor(extract(epoch FROM ($2 - unused_since)) / 86400)::int)
            FROM moved)
        SELECT count(*) FROM moved""",
    "health": """
        SELECT company, seat, total_skills, skills_used_at_least_once, total_skill_uses, most_recent_skill_use,
               avg_uses_per_skill, avg_skill_age_days, active_skills, stale_skills, archived_skills
        FROM learning_health WHERE company = $1 AND seat = $2""",
}


class StampFailed(Exception):
    """A telemetry stamp (a use count, an offer's clock) could not be written."""


_STAMP_ERRORS = (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, TimeoutError)
"""Why a stamp may not be written: the database refused it, the pool or its connection is gone
(``InterfaceError``: a closed pool, a dead connection), the network failed (``OSError``, a
reconnect refused), or the row or a connection did not come within the stamp's timeout."""


_SKILL_COLUMNS: Conversions = {
    "tool_sequence": tuple,
    "trigger": SkillTrigger,
    "cluster_size": int,
    "source_turn_ids": tuple,
    "state": SkillState,
    "pinned": bool,
    "version": int,
    "use_count": int,
    "change": SkillChange,
}
_VERSION_COLUMNS: Conversions = {"version": int, "change": SkillChange, "current": bool}
_HEALTH_COLUMNS: Conversions = {
    "total_skills": int,
    "skills_used_at_least_once": int,
    "total_skill_uses": int,
    "avg_uses_per_skill": float,
    "avg_skill_age_days": float,
    "active_skills": int,
    "stale_skills": int,
    "archived_skills": int,
}


def _moved(row: asyncpg.Record) -> tuple[uuid.UUID, str, SkillState, SkillState]:
    """A stamp's effect on one skill (``ports.Moved``): its id, name, state before and after."""
    return row["id"], row["name"], SkillState(row["prior_state"]), SkillState(row["state"])


_READ_SKILL = RowReader(Skill, _SKILL_COLUMNS)
_READ_VERSION = RowReader(SkillVersion, _VERSION_COLUMNS)
_READ_HEALTH = RowReader(LearningHealth, _HEALTH_COLUMNS)


def _skill(row: asyncpg.Record) -> Skill:
    return _READ_SKILL(row)


def _version(row: asyncpg.Record) -> SkillVersion:
    return _READ_VERSION(row)


class SeatTx:
    """A transaction holding one seat's advisory lock (see the module docstring)."""

    def __init__(self, conn: asyncpg.Connection, company: str, seat: str):
        self.conn = conn
        self.company = company
        self.seat = seat

    async def name_taken(self, name: str) -> bool:
        return bool(await self.conn.fetchval(SQL["name_taken"], self.company, self.seat, name))

    async def live_skills(self) -> list[Skill]:
        return [_skill(r) for r in await self.conn.fetch(SQL["live"], self.company, self.seat)]

    async def all_skills(self) -> list[Skill]:
        """Every skill of the seat, archived ones included (what it has learned)."""
        return [_skill(r) for r in await self.conn.fetch(SQL["all"], self.company, self.seat)]

    async def count_live(self) -> int:
        return int(await self.conn.fetchval(SQL["count_live"], self.company, self.seat))

    async def insert(self, draft: SkillDraft, provenance: Provenance, now: datetime) -> Skill:
        try:
            row = await self.conn.fetchrow(
                SQL["insert"],
                uuid.uuid4(),
                self.company,
                self.seat,
                draft.name,
                draft.summary,
                draft.body,
                list(draft.tool_sequence),
                str(draft.trigger),
                draft.cluster_size,
                list(draft.source_turn_ids),
                now,
                provenance_json(provenance),
            )
        except asyncpg.UniqueViolationError:
            raise name_taken_error(self.seat, draft.name) from None
        return _skill(row)

    async def get_for_update(self, key: SkillKey) -> Skill | None:
        row = await self.conn.fetchrow(SQL["get_for_update"], *key.args())
        return _skill(row) if row else None

    async def set_state(self, skill_id: uuid.UUID, state: SkillState, now: datetime, *, reset_clock: bool) -> Skill:
        return _skill(await self.conn.fetchrow(SQL["set_state"], skill_id, str(state), now, reset_clock))


def name_taken_error(seat: str, name: str) -> AlreadyExists:
    """The refusal of a name the seat's catalogue already has: the use case's check under the
    seat's lock and the unique index behind it refuse alike."""
    return AlreadyExists.of_field(
        "name",
        "SKILL_NAME_TAKEN",
        f"seat {seat} already has a skill named {name!r}",
        domain=DOMAIN,
        name=name,
        seat=seat,
    )


class PostgresSkillStore:
    def __init__(self, pool: asyncpg.Pool):
        self.pool = pool

    # -------------------------------------------------------------- transactions

    @contextlib.asynccontextmanager
    async def seat(self, company: str, seat: str) -> AsyncIterator[SeatTx]:
        """A transaction holding the seat's lock: the catalogue cannot change under the caller."""
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.execute(SQL["lock_seat"], _LOCK_NAMESPACE, company, seat)
            yield SeatTx(conn, company, seat)

    @contextlib.asynccontextmanager
    async def skill_row(
        self, key: SkillKey, request_id: str | None = None
    ) -> AsyncIterator[tuple[asyncpg.Connection, Skill | None, bool]]:
        """A transaction holding one skill's row lock (None when the seat has no such skill), and
        whether ``request_id`` made a kept version (checked by the lock's statement)."""
        async with self.pool.acquire() as conn, conn.transaction():
            if request_id is None:
                row = await conn.fetchrow(SQL["get_for_update"], *key.args())
                yield conn, (_skill(row) if row else None), False
                return
            row = await conn.fetchrow(SQL["get_for_update_seen"], *key.args(), request_id)
            if row is None:
                yield conn, None, False
                return
            seen = row["seen"] if row["settled"] else await self.request_seen(conn, row["id"], request_id)
            yield conn, _skill(row), bool(seen)

    # -------------------------------------------------------------- reads

    async def get(self, key: SkillKey) -> Skill | None:
        row = await self.pool.fetchrow(SQL["get"], *key.args())
        return _skill(row) if row else None

    async def live_skills(self, company: str, seat: str) -> list[Skill]:
        return [_skill(r) for r in await self.pool.fetch(SQL["live"], company, seat)]

    async def all_skills(self, company: str, seat: str) -> list[Skill]:
        """Every skill of the seat, archived ones included (what it has learned)."""
        return [_skill(r) for r in await self.pool.fetch(SQL["all"], company, seat)]

    async def page(
        self, company: str, seat: str, include_archived: bool, after_name: str | None, limit: int
    ) -> list[Skill]:
        rows = await self.pool.fetch(SQL["page"], company, seat, include_archived, after_name, limit)
        return [_skill(r) for r in rows]

    async def count(self, company: str, seat: str, include_archived: bool) -> int:
        return int(await self.pool.fetchval(SQL["count"], company, seat, include_archived))

    async def versions_page(self, skill_id: uuid.UUID, before: int | None, limit: int) -> list[SkillVersion]:
        return [_version(r) for r in await self.pool.fetch(SQL["versions_page"], skill_id, before, limit)]

    async def versions_count(self, skill_id: uuid.UUID) -> int:
        return int(await self.pool.fetchval(SQL["versions_count"], skill_id))

    async def health(self, company: str, seat: str, now: datetime) -> LearningHealth:
        async with self.pool.acquire() as conn, conn.transaction():
            # The view measures ages against this transaction's notion of now: the service's clock.
            await conn.execute("SELECT set_config('agentlearn.now', $1, true)", now.isoformat())
            row = await conn.fetchrow(SQL["health"], company, seat)
        if row is None:
            return LearningHealth(company=company, seat=seat)
        return _READ_HEALTH(row)  # the view names its company and seat

    # -------------------------------------------------------------- telemetry stamps

    async def use(self, key: SkillKey, now: datetime, timeout: float, request_id: str | None = None) -> Used | None:
        """The key is recorded by the same statement as the use (one round trip, one commit)."""
        try:
            # The timeout bounds the wait for a connection too: a turn start must not hang on it.
            async with self.pool.acquire(timeout=timeout) as conn:
                row = await conn.fetchrow(SQL["use"], *key.args(), now, request_id, timeout=timeout)
        except _STAMP_ERRORS as err:
            raise StampFailed(f"{type(err).__name__}: {err}") from err
        return Used(_skill(row), SkillState(row["prior_state"]), bool(row["counted"])) if row else None

    async def offer(
        self, company: str, seat: str, ids: Sequence[uuid.UUID], names: Sequence[str], now: datetime, timeout: float
    ) -> list[tuple[uuid.UUID, str, SkillState, SkillState]]:
        try:
            # Being offered is telemetry by the spec, stamped on a turn start's path: its commit does
            # not wait for the disk (``unflushed``).
            async with unflushed(self.pool, timeout) as conn:
                rows = await conn.fetch(SQL["offer"], company, seat, list(ids), list(names), now, timeout=timeout)
        except _STAMP_ERRORS as err:
            raise StampFailed(f"{type(err).__name__}: {err}") from err
        return [_moved(r) for r in rows]

    async def mark_used(
        self, company: str, seat: str, ids: Sequence[uuid.UUID], now: datetime, request_id: str | None
    ) -> list[tuple[uuid.UUID, str, SkillState, SkillState]] | None:
        """The key is recorded by the same statement as the uses (one round trip, one commit)."""
        rows = await self.pool.fetch(SQL["mark_used"], company, seat, list(ids), now, request_id)
        if not rows or not rows[0]["applied"]:
            return None
        return [_moved(r) for r in rows if r["id"] is not None]

    # -------------------------------------------------------------- versions

    @staticmethod
    async def new_version(
        conn: asyncpg.Connection, skill: Skill, edit: SkillEdit, now: datetime, keep: int, bullet: str | None = None
    ) -> Skill:
        """One statement (``SQL["new_version"]``), the bullet's record included."""
        row = await conn.fetchrow(
            SQL["new_version"],
            skill.id,
            edit.body,
            str(edit.change),
            edit.reason,
            edit.restored_from,
            now,
            edit.request_id,
            provenance_json(edit.provenance),
            keep,
            uuid.uuid4(),
            bullet,
        )
        return _skill(row)

    @staticmethod
    async def request_seen(conn: asyncpg.Connection, skill_id: uuid.UUID, request_id: str) -> bool:
        return bool(await conn.fetchval(SQL["request_seen"], skill_id, request_id))

    @staticmethod
    async def keyed_version(conn: asyncpg.Connection, skill_id: uuid.UUID, request_id: str) -> SkillVersion | None:
        row = await conn.fetchrow(SQL["keyed_version"], skill_id, request_id)
        return _version(row) if row else None

    @staticmethod
    async def archived_body(
        conn: asyncpg.Connection, skill_id: uuid.UUID, version: int
    ) -> tuple[str, Provenance] | None:
        row = await conn.fetchrow(SQL["get_version"], skill_id, version)
        return (row["body"], provenance_from_json(row["provenance"])) if row else None

    @staticmethod
    async def set_pinned(conn: asyncpg.Connection, skill_id: uuid.UUID, pinned: bool, now: datetime) -> Skill:
        return _skill(await conn.fetchrow(SQL["set_pinned"], skill_id, pinned, now))

    @staticmethod
    async def set_state(
        conn: asyncpg.Connection, skill_id: uuid.UUID, state: SkillState, now: datetime, *, reset_clock: bool
    ) -> Skill:
        return _skill(await conn.fetchrow(SQL["set_state"], skill_id, str(state), now, reset_clock))

    # -------------------------------------------------------------- the curator

    async def curate(
        self, from_state: SkillState, to_state: SkillState, event: str, cutoff: datetime, now: datetime, batch: int
    ) -> int:
        """Move every unpinned ``from_state`` skill whose clock is at or before ``cutoff``."""
        moved = 0
        while True:
            n = int(
                await self.pool.fetchval(
                    SQL["curate"], cutoff, now, batch, str(from_state), str(to_state), event, timeout=300
                )
            )
            moved += n
            if n < batch:
                return moved


# ------------------------------------------------------------------------------------- proposals

_P_COLUMNS = """id, company, seat, name, summary, body, tool_sequence, origin, session_id, check_id, evidence_ids,
                turn_id, state, create_time, decide_time, decided_by, decision_reason, skill_id, provenance"""

PROPOSAL_SQL = {
    "by_request": f"SELECT {_P_COLUMNS} FROM skill_proposals WHERE company = $1 AND seat = $2 AND request_id = $3",
    "get": f"SELECT {_P_COLUMNS} FROM skill_proposals WHERE company = $1 AND seat = $2 AND id = $3",
    # What a candidate is compared with: the pending and the rejected proposals, with their vectors.
    "comparable": f"""
        SELECT {_P_COLUMNS}, embedding, embedding_model FROM skill_proposals
        WHERE company = $1 AND seat = $2 AND state IN ('pending', 'rejected')
        ORDER BY create_time, id""",
    "insert": f"""
        INSERT INTO skill_proposals (id, company, seat, name, summary, body, tool_sequence, origin, session_id,
                                     check_id, evidence_ids, turn_id, state, request_id, embedding, embedding_model,
                                     create_time, provenance)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, 'pending', $13, $14, $15, $16, $17::jsonb)
        ON CONFLICT (company, seat, request_id) DO NOTHING
        RETURNING {_P_COLUMNS}""",
    "approve": f"""
        UPDATE skill_proposals SET state = 'approved', decide_time = $4, decided_by = $5, decision_reason = $6,
               skill_id = $7
        WHERE company = $1 AND seat = $2 AND id = $3 AND state = 'pending'
        RETURNING {_P_COLUMNS}""",
    "reject": f"""
        UPDATE skill_proposals SET state = 'rejected', decide_time = $4, decided_by = $5, decision_reason = $6
        WHERE company = $1 AND seat = $2 AND id = $3 AND state = 'pending'
        RETURNING {_P_COLUMNS}""",
    "page": f"""
        SELECT {_P_COLUMNS} FROM skill_proposals
        WHERE company = $1 AND seat = $2 AND ($3::text IS NULL OR state = $3)
          AND ($4::timestamptz IS NULL OR (create_time, id) < ($4, $5::uuid))
        ORDER BY create_time DESC, id DESC LIMIT $6""",
}


_PROPOSAL_COLUMNS: Conversions = {
    "tool_sequence": tuple,
    "origin": ProposalOrigin,
    "evidence_ids": tuple,
    "state": ProposalState,
    "provenance": provenance_from_json,
}
_READ_PROPOSAL = RowReader(SkillProposal, _PROPOSAL_COLUMNS)


def _proposal(row: asyncpg.Record) -> SkillProposal:
    return _READ_PROPOSAL(row)


class PostgresProposalStore:
    """``skill_proposals``. Inserts run inside the skills store's seat transaction (``SeatTx``), so a
    proposal and a skill created at once see each other's gates."""

    def __init__(self, pool: asyncpg.Pool):
        self.pool = pool

    async def by_request(
        self, company: str, seat: str, request_id: str, conn: asyncpg.Connection | None = None
    ) -> SkillProposal | None:
        row = await (conn or self.pool).fetchrow(PROPOSAL_SQL["by_request"], company, seat, request_id)
        return _proposal(row) if row else None

    async def get(self, company: str, seat: str, proposal_id: uuid.UUID) -> SkillProposal | None:
        row = await self.pool.fetchrow(PROPOSAL_SQL["get"], company, seat, proposal_id)
        return _proposal(row) if row else None

    async def comparable(
        self, company: str, seat: str, conn: asyncpg.Connection | None = None
    ) -> list[tuple[SkillProposal, np.ndarray | None, str | None]]:
        rows = await (conn or self.pool).fetch(PROPOSAL_SQL["comparable"], company, seat)
        return [
            (_proposal(r), as_array(r["embedding"]) if r["embedding"] is not None else None, r["embedding_model"])
            for r in rows
        ]

    async def insert(
        self,
        conn: asyncpg.Connection,
        proposal: SkillProposal,
        request_id: str | None,
        vector: np.ndarray | None,
        model: str | None,
    ) -> SkillProposal | None:
        row = await conn.fetchrow(
            PROPOSAL_SQL["insert"],
            proposal.id,
            proposal.company,
            proposal.seat,
            proposal.name,
            proposal.summary,
            proposal.body,
            list(proposal.tool_sequence),
            str(proposal.origin),
            proposal.session_id,
            proposal.check_id,
            list(proposal.evidence_ids),
            proposal.turn_id,
            request_id,
            None if vector is None else vector.astype(np.float32),
            model if vector is not None else None,
            proposal.create_time,
            provenance_json(proposal.provenance),
        )
        return _proposal(row) if row else None

    async def decide(
        self, company: str, seat: str, proposal_id: uuid.UUID, decision: ProposalDecision, now: datetime
    ) -> SkillProposal | None:
        by, why = decision.reviewer, decision.reason
        if decision.state is ProposalState.APPROVED:
            row = await self.pool.fetchrow(
                PROPOSAL_SQL["approve"], company, seat, proposal_id, now, by, why, decision.skill_id
            )
        else:
            row = await self.pool.fetchrow(PROPOSAL_SQL["reject"], company, seat, proposal_id, now, by, why)
        return _proposal(row) if row else None

    async def page(
        self,
        company: str,
        seat: str,
        state: ProposalState | None,
        after: tuple[datetime, uuid.UUID] | None,
        limit: int,
    ) -> list[SkillProposal]:
        t, i = after if after else (None, None)
        rows = await self.pool.fetch(PROPOSAL_SQL["page"], company, seat, str(state) if state else None, t, i, limit)
        return [_proposal(r) for r in rows]
