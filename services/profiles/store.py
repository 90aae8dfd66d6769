"""PostgreSQL store of ``counterparty_profiles``: named queries, ``$n`` parameters, driver errors
kept inside.

Every read is scoped to one (company, observer): a profile is private to the seat that wrote it.
An observation is merged under a row lock (``SELECT ... FOR UPDATE`` in a transaction), so two
concurrent observations of one subject are applied one after the other and neither is lost; the
first observation creates the row with ``INSERT ... ON CONFLICT DO NOTHING``, and the loser of a
creation race merges into the winner's row instead.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import asyncpg

from libs.common.rows import RowReader
from services.profiles.domain import (
    ObservationRecord,
    ObservationSource,
    Profile,
    Subject,
    empty,
    prunable,
)
from services.profiles.ports import Merge, ObservationWrite

__all__ = ["Merge", "PostgresProfileStore", "source_from_json", "source_to_json"]

_COLUMNS = """id, company, observer, platform, subject_key, subject_handle, subject_external_id,
              communication_style, past_decisions, sensitivities, topics, observation_count,
              create_time, update_time, last_turn_id"""

_RECORDED = """
        recorded AS (
            INSERT INTO profile_observations (id, profile_id, company, observer, turn_id, subjects, provenance,
                                              communication_style, past_decisions, sensitivities, topics,
                                              observe_time)
            SELECT $1::uuid, w.id, w.company, w.observer, $2, $3, $4::jsonb, $5, $6, $7, $8, $9
            FROM written w WHERE $1::uuid IS NOT NULL)"""
"""The observation a write records (issue 17), beside the row it wrote (``written``)."""

SQL = {
    # The request key claimed (when one is given, $5) and the subject's row locked, in one statement:
    # ``fresh`` false when the key was claimed before (a concurrent claim of it is waited for); the
    # row's columns NULL when there is no row (yet: a row a concurrent claimant created is not in
    # this statement's snapshot, and "lock" reads it afterwards).
    "claim_and_lock": f"""
        WITH claim AS (
            INSERT INTO profile_requests (company, observer, request_id, create_time)
            SELECT $1, $2, $5::text, $6 WHERE $5::text IS NOT NULL
            ON CONFLICT DO NOTHING RETURNING 1),
        locked AS (
            SELECT {_COLUMNS} FROM counterparty_profiles
            WHERE company = $1 AND observer = $2 AND platform = $3 AND subject_key = $4
            FOR UPDATE)
        SELECT ($5::text IS NULL OR EXISTS (SELECT 1 FROM claim)) AS fresh, locked.*
        FROM (SELECT 1) AS one LEFT JOIN locked ON true""",
    "lock": f"""
        SELECT {_COLUMNS} FROM counterparty_profiles
        WHERE company = $1 AND observer = $2 AND platform = $3 AND subject_key = $4
        FOR UPDATE""",
    # A write (the row's first, "insert", or a merge into it, "update") and the observation it
    # records, in one statement: $1..$9 are the observation (its id NULL: nothing recorded), the
    # write's own parameters follow.
    "insert": f"""
        WITH written AS (
            INSERT INTO counterparty_profiles (
                id, company, observer, platform, subject_key, subject_handle, subject_external_id,
                communication_style, past_decisions, sensitivities, topics, observation_count,
                create_time, update_time, last_turn_id)
            VALUES ($10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23, $24)
            ON CONFLICT (company, observer, platform, subject_key) DO NOTHING
            RETURNING {_COLUMNS}),
        {_RECORDED}
        SELECT * FROM written""",
    "update": f"""
        WITH written AS (
            UPDATE counterparty_profiles
            SET subject_handle = $11, subject_external_id = $12, communication_style = $13, past_decisions = $14,
                sensitivities = $15, topics = $16, observation_count = $17, update_time = $18, last_turn_id = $19
            WHERE id = $10
            RETURNING {_COLUMNS}),
        {_RECORDED}
        SELECT * FROM written""",
    # The named subjects' profiles: pairs of (platform, subject key) unnested side by side.
    "get_many": f"""
        SELECT {_COLUMNS} FROM counterparty_profiles
        WHERE company = $1 AND observer = $2
          AND (platform, subject_key) IN (SELECT * FROM unnest($3::text[], $4::text[]))""",
    "get": f"SELECT {_COLUMNS} FROM counterparty_profiles WHERE id = $1 AND company = $2 AND observer = $3",
    "observations": """
        SELECT o.id, o.profile_id, o.provenance, o.communication_style, o.past_decisions, o.sensitivities, o.topics,
               o.observe_time
        FROM profile_observations o
        WHERE o.profile_id = $1 AND o.company = $2 AND o.observer = $3
        ORDER BY o.observe_time DESC, o.id DESC LIMIT $4""",
    # Past the newest $2 (what prunable() reads), oldest last.
    "older_observations": """
        SELECT o.id, o.profile_id, o.provenance, o.communication_style, o.past_decisions, o.sensitivities, o.topics,
               o.observe_time
        FROM profile_observations o WHERE o.profile_id = $1
        ORDER BY o.observe_time DESC, o.id DESC OFFSET $2""",
    "prune_observations": "DELETE FROM profile_observations WHERE id = ANY($1::uuid[])",
    "count": "SELECT count(*) FROM counterparty_profiles WHERE company = $1 AND observer = $2",
    "page": f"""
        SELECT {_COLUMNS} FROM counterparty_profiles
        WHERE company = $1 AND observer = $2
          AND ($3::timestamptz IS NULL OR (update_time, id) < ($3, $4::uuid))
        ORDER BY update_time DESC, id DESC LIMIT $5""",
}


def source_to_json(source: ObservationSource) -> str:
    """The source as the ``agentlearn.common.v1.Provenance`` JSON every owner keeps (proto field
    names; empty fields left out)."""
    data: dict[str, Any] = {
        "turn_ids": list(source.turn_ids),
        "work_key": source.work_key,
        "subjects": [
            {k: v for k, v in (("handle", h), ("external_id", e), ("platform", p)) if v} for h, e, p in source.subjects
        ],
        "model": source.model,
        "prompt_version": source.prompt_version,
        "writer": source.writer,
    }
    return json.dumps({k: v for k, v in data.items() if v})


def source_from_json(text: str | dict[str, Any] | None) -> ObservationSource:
    data = json.loads(text) if isinstance(text, str) else dict(text or {})
    return ObservationSource(
        turn_ids=tuple(data.get("turn_ids", ())),
        work_key=data.get("work_key", ""),
        subjects=tuple(
            (s.get("handle", ""), s.get("external_id", ""), s.get("platform", "")) for s in data.get("subjects", ())
        ),
        model=data.get("model", ""),
        prompt_version=data.get("prompt_version", ""),
        writer=data.get("writer", ""),
    )


_observation = RowReader(
    ObservationRecord,
    {"past_decisions": tuple, "sensitivities": tuple, "topics": tuple},
    computed={"source": lambda row: source_from_json(row["provenance"])},
)


_profile = RowReader(
    Profile,
    convert={"past_decisions": tuple, "sensitivities": tuple, "topics": tuple, "observation_count": int},
    computed={
        "subject": lambda r: Subject(
            platform=r["platform"], handle=r["subject_handle"], external_id=r["subject_external_id"]
        )
    },
)
"""A profile from its row (the subject from its three columns; every other column named as its field)."""


_NOT_RECORDED = (None,) * 9


def _recorded(write: ObservationWrite) -> tuple[object, ...] | None:
    """The parameters of the observation a write records (``_RECORDED``'s $1..$9), or None when it
    names no observation and source (nothing is recorded)."""
    observation, source = write.observation, write.source
    if observation is None or source is None:
        return None
    return (
        uuid.uuid4(),
        observation.turn_id,
        source.identifiers,
        source_to_json(source),
        observation.communication_style or "",
        list(observation.past_decisions),
        list(observation.sensitivities),
        list(observation.topics),
        write.now,
    )


class PostgresProfileStore:
    def __init__(self, pool: asyncpg.Pool):
        self.pool = pool

    async def observe(self, write: ObservationWrite) -> tuple[Profile, bool, bool]:
        """One transaction under the subject's row lock: the request key claimed with the lock,
        the observation recorded by the statement that writes the row."""
        recorded = _recorded(write)
        async with self.pool.acquire() as conn, conn.transaction():
            profile, created, changed = await self._observe(conn, write, recorded or _NOT_RECORDED)
            keep = write.keep_observations
            # A profile holds at most one recorded observation per merge counted: with no more
            # merges than are kept, none is past the newest ``keep`` (nothing to read or prune).
            if changed and recorded is not None and keep is not None and profile.observation_count > keep:
                older = [_observation(r) for r in await conn.fetch(SQL["older_observations"], profile.id, keep)]
                gone = prunable(profile, older)
                if gone:
                    await conn.execute(SQL["prune_observations"], gone)
            return profile, created, changed

    async def _observe(
        self, conn: asyncpg.Connection, write: ObservationWrite, recorded: tuple[object, ...]
    ) -> tuple[Profile, bool, bool]:
        """The merge under the row lock; a row it writes records ``recorded`` (``_recorded``)."""
        key, company, observer, subject = write.key, write.company, write.observer, write.subject
        now, merge, request_id = write.now, write.merge, write.request_id
        found = await conn.fetchrow(SQL["claim_and_lock"], *key, request_id, now)
        row = found if found["id"] is not None else None
        if not found["fresh"]:  # applied before (a concurrent retry waits here for the first)
            row = row or await conn.fetchrow(SQL["lock"], *key)
            if row is not None:
                return _profile(row), False, False
        if row is None:
            first = merge(empty(company, observer, subject, now))
            assert first is not None  # an empty profile has no turn to replay
            row = await conn.fetchrow(
                SQL["insert"],
                *recorded,
                first.id,
                company,
                observer,
                subject.platform,
                subject.key,
                first.subject.handle,
                first.subject.external_id,
                first.communication_style,
                list(first.past_decisions),
                list(first.sensitivities),
                list(first.topics),
                first.observation_count,
                first.create_time,
                first.update_time,
                first.last_turn_id,
            )
            if row is not None:
                return _profile(row), True, True
            # A concurrent first observation committed the row between our read and our insert:
            # merge into it (a new statement sees the committed row, and waits for its lock).
            row = await conn.fetchrow(SQL["lock"], *key)
            assert row is not None  # profiles are never deleted
        current = _profile(row)
        merged = merge(current)
        if merged is None:
            return current, False, False
        row = await conn.fetchrow(
            SQL["update"],
            *recorded,
            current.id,
            merged.subject.handle,
            merged.subject.external_id,
            merged.communication_style,
            list(merged.past_decisions),
            list(merged.sensitivities),
            list(merged.topics),
            merged.observation_count,
            merged.update_time,
            merged.last_turn_id,
        )
        return _profile(row), False, True

    async def get(self, company: str, observer: str, profile_id: uuid.UUID) -> Profile | None:
        row = await self.pool.fetchrow(SQL["get"], profile_id, company, observer)
        return _profile(row) if row is not None else None

    async def observations(
        self, company: str, observer: str, profile_id: uuid.UUID, limit: int
    ) -> list[ObservationRecord]:
        rows = await self.pool.fetch(SQL["observations"], profile_id, company, observer, limit)
        return [_observation(r) for r in rows]

    async def get_many(self, company: str, observer: str, subjects: Sequence[Subject]) -> list[Profile]:
        rows = await self.pool.fetch(
            SQL["get_many"], company, observer, [s.platform for s in subjects], [s.key for s in subjects]
        )
        return [_profile(r) for r in rows]

    async def count(self, company: str, observer: str) -> int:
        return int(await self.pool.fetchval(SQL["count"], company, observer))

    async def page(
        self, company: str, observer: str, after: tuple[datetime, uuid.UUID] | None, limit: int
    ) -> list[Profile]:
        rows = await self.pool.fetch(
            SQL["page"], company, observer, after[0] if after else None, after[1] if after else None, limit
        )
        return [_profile(r) for r in rows]
