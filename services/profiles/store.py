"""PostgreSQL store of ``counterparty_profiles``: named queries, ``$n`` parameters, driver errors
kept inside.

Every read is scoped to one (company, observer): a profile is private to the seat that wrote it.
An observation is merged under a row lock (``SELECT ... FOR UPDATE`` in a transaction), so two
concurrent observations of one subject are applied one after the other and neither is lost; the
first observation creates the row with ``INSERT ... ON CONFLICT DO NOTHING``, and the loser of a
creation race merges into the winner's row instead.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from datetime import datetime

import asyncpg

from services.profiles.domain import Profile, Subject, empty

__all__ = ["Merge", "PostgresProfileStore"]

Merge = Callable[[Profile], Profile | None]
"""The rule the service applies to the locked row: the merged profile, or None to leave it."""

_COLUMNS = """id, company, observer, platform, subject_key, subject_handle, subject_external_id,
              communication_style, past_decisions, sensitivities, topics, observation_count,
              create_time, update_time, last_turn_id"""

SQL = {
    "claim_request": """
        INSERT INTO profile_requests (company, observer, request_id, create_time) VALUES ($1, $2, $3, $4)
        ON CONFLICT DO NOTHING RETURNING 1""",
    "lock": f"""
        SELECT {_COLUMNS} FROM counterparty_profiles
        WHERE company = $1 AND observer = $2 AND platform = $3 AND subject_key = $4
        FOR UPDATE""",
    "insert": f"""
        INSERT INTO counterparty_profiles (
            id, company, observer, platform, subject_key, subject_handle, subject_external_id,
            communication_style, past_decisions, sensitivities, topics, observation_count,
            create_time, update_time, last_turn_id)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)
        ON CONFLICT (company, observer, platform, subject_key) DO NOTHING
        RETURNING {_COLUMNS}""",
    "update": f"""
        UPDATE counterparty_profiles
        SET subject_handle = $2, subject_external_id = $3, communication_style = $4, past_decisions = $5,
            sensitivities = $6, topics = $7, observation_count = $8, update_time = $9, last_turn_id = $10
        WHERE id = $1
        RETURNING {_COLUMNS}""",
    # The named subjects' profiles: pairs of (platform, subject key) unnested side by side.
    "get_many": f"""
        SELECT {_COLUMNS} FROM counterparty_profiles
        WHERE company = $1 AND observer = $2
          AND (platform, subject_key) IN (SELECT * FROM unnest($3::text[], $4::text[]))""",
    "count": "SELECT count(*) FROM counterparty_profiles WHERE company = $1 AND observer = $2",
    "page": f"""
        SELECT {_COLUMNS} FROM counterparty_profiles
        WHERE company = $1 AND observer = $2
          AND ($3::timestamptz IS NULL OR (update_time, id) < ($3, $4::uuid))
        ORDER BY update_time DESC, id DESC LIMIT $5""",
}


def _profile(row: asyncpg.Record) -> Profile:
    return Profile(
        id=row["id"],
        company=row["company"],
        observer=row["observer"],
        subject=Subject(platform=row["platform"], handle=row["subject_handle"], external_id=row["subject_external_id"]),
        subject_key=row["subject_key"],
        communication_style=row["communication_style"],
        past_decisions=tuple(row["past_decisions"]),
        sensitivities=tuple(row["sensitivities"]),
        topics=tuple(row["topics"]),
        observation_count=int(row["observation_count"]),
        create_time=row["create_time"],
        update_time=row["update_time"],
        last_turn_id=row["last_turn_id"],
    )


class PostgresProfileStore:
    def __init__(self, pool: asyncpg.Pool):
        self.pool = pool

    async def observe(
        self,
        company: str,
        observer: str,
        subject: Subject,
        now: datetime,
        merge: Merge,
        request_id: str | None = None,
    ) -> tuple[Profile, bool, bool]:
        """Apply ``merge`` to the subject's profile under its row lock, creating the row on the
        first observation. Returns (profile, created, changed). A ``request_id`` seen before changes
        nothing: it is recorded in the same transaction as the merge, so a retry after a crash
        either finds it (the merge committed) or applies the merge (it did not)."""
        key = (company, observer, subject.platform, subject.key)
        async with self.pool.acquire() as conn, conn.transaction():
            if request_id is not None:
                fresh = await conn.fetchval(SQL["claim_request"], company, observer, request_id, now)
                if fresh is None:  # applied before (a concurrent retry waits here for the first)
                    row = await conn.fetchrow(SQL["lock"], *key)
                    if row is not None:
                        return _profile(row), False, False
            row = await conn.fetchrow(SQL["lock"], *key)
            if row is None:
                first = merge(empty(company, observer, subject, now))
                assert first is not None  # an empty profile has no turn to replay
                row = await conn.fetchrow(
                    SQL["insert"],
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
