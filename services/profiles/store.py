"""PostgreSQL store of ``counterparty_profiles``: named queries, ``$n`` parameters, driver errors
kept inside.

Every read is scoped to one (company, observer): a profile is private to the seat that wrote it.
An observation is merged under its subject's identifier locks (transaction-level advisory locks,
one per handle or external id sent) and the row's lock (``SELECT ... FOR UPDATE``), so two
concurrent observations of one person are applied one after the other, neither is lost, and the
second finds the row the first created by either identifier; the first observation creates the
row with ``INSERT ... ON CONFLICT DO NOTHING``, and the loser of a creation race (against a writer
without the locks) merges into the winner's row instead.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

import asyncpg

from libs.common.rows import RowReader
from libs.common.senders import subject_part
from services.profiles.domain import (
    ObservationRecord,
    ObservationSource,
    Profile,
    Subject,
    combine,
    empty,
    grouped,
    identifiers_of,
    linked,
    newest,
    prunable,
)
from services.profiles.ports import Merge, ObservationWrite, ProfilePage

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

_NAMED_BY = """(subject_key = ANY($4::text[]) OR subject_handle = ANY($4::text[])
               OR subject_external_id = ANY($4::text[]))"""
"""A row one of the identifiers $4 names: as its key, its handle or its external id."""
_PEEK = f"""
        SELECT {_COLUMNS} FROM counterparty_profiles
        WHERE company = $1 AND observer = $2 AND platform = $3 AND {_NAMED_BY}"""

SQL = {
    # One person's identifiers, each locked (a transaction-level advisory lock on a digest of
    # company, observer, platform and identifier, taken in order) before their rows are read: two
    # upserts naming one identifier (a handle, or an external id: one key space, as the unique index
    # has it) run one after the other, so the second finds the row the first created, whichever
    # other identifier each sends, and one person never gets two rows by a race.
    "lock_identifier": "SELECT pg_advisory_xact_lock($1)",
    # The request key claimed: a row when it was not claimed before (a concurrent claim of it
    # is waited for; retries of one request name the same identifiers, so they are serialised by
    # the identifier locks already).
    "claim": """
        INSERT INTO profile_requests (company, observer, request_id, create_time) VALUES ($1, $2, $3, $4)
        ON CONFLICT DO NOTHING RETURNING 1""",
    # The rows one of the identifiers $4 names (as a key, a handle or an external id), locked; the
    # store repeats it with the identifiers those rows know too (``linked``), oldest first. "peek"
    # is the same read unlocked: which identifiers to lock first.
    "find": f"{_PEEK} ORDER BY create_time, id FOR UPDATE",
    "peek": _PEEK,
    # Rows of one person folded into the oldest (``combine``): their observations move to it (an
    # entry stays traceable to the turn that added it), then they go.
    "move_observations": "UPDATE profile_observations SET profile_id = $1 WHERE profile_id = ANY($2::uuid[])",
    # The folded rows' ids (and the ids folded into them before) kept on the row they went into: a
    # caller holding one still reaches the person (``get``).
    "keep_folded_ids": """
        UPDATE counterparty_profiles c SET merged_ids = ARRAY(
            SELECT unnest(c.merged_ids) UNION SELECT unnest($2::uuid[])
            UNION SELECT unnest(f.merged_ids) FROM counterparty_profiles f WHERE f.id = ANY($2::uuid[]))
        WHERE c.id = $1""",
    "delete_rows": "DELETE FROM counterparty_profiles WHERE id = ANY($1::uuid[])",
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
    # The rows one of the identifiers $4 names, on one of the subjects' platforms: the store repeats
    # it with the identifiers those rows know too, and the service keeps and combines each
    # subject's (``linked``, ``combine``).
    "get_many": f"""
        SELECT {_COLUMNS} FROM counterparty_profiles
        WHERE company = $1 AND observer = $2 AND platform = ANY($3::text[]) AND {_NAMED_BY}""",
    "get": f"SELECT {_COLUMNS} FROM counterparty_profiles WHERE id = $1 AND company = $2 AND observer = $3",
    # The row a row of id $1 was folded into (``keep_folded_ids``).
    "get_folded": f"""
        SELECT {_COLUMNS} FROM counterparty_profiles
        WHERE company = $2 AND observer = $3 AND merged_ids @> ARRAY[$1::uuid] LIMIT 1""",
    "observations": """
        SELECT o.id, o.profile_id, o.provenance, o.communication_style, o.past_decisions, o.sensitivities, o.topics,
               o.observe_time
        FROM profile_observations o
        WHERE o.profile_id = ANY($1::uuid[]) AND o.company = $2 AND o.observer = $3
        ORDER BY o.observe_time DESC, o.id DESC LIMIT $4""",
    # Past the newest $2 (what prunable() reads), oldest last.
    "older_observations": """
        SELECT o.id, o.profile_id, o.provenance, o.communication_style, o.past_decisions, o.sensitivities, o.topics,
               o.observe_time
        FROM profile_observations o WHERE o.profile_id = $1
        ORDER BY o.observe_time DESC, o.id DESC OFFSET $2""",
    "prune_observations": "DELETE FROM profile_observations WHERE id = ANY($1::uuid[])",
    "count": "SELECT count(*) FROM counterparty_profiles WHERE company = $1 AND observer = $2",
    # The observer's rows that share an identifier (as a key, a handle or an external id) with
    # another of its rows on their platform: the rows of the people with several (``linked``), to
    # be counted as one each. One pass over all the observer's rows, grouped by identifier: read
    # for the count only, on the first page of a listing (``page``).
    "shared": f"""
        WITH ids AS (
            SELECT p.id, p.platform, x.ident FROM counterparty_profiles p,
                   unnest(ARRAY[p.subject_key, p.subject_handle, p.subject_external_id]) AS x(ident)
            WHERE p.company = $1 AND p.observer = $2 AND x.ident IS NOT NULL),
        shared AS (SELECT platform, ident FROM ids GROUP BY platform, ident HAVING count(DISTINCT id) > 1)
        SELECT {_COLUMNS} FROM counterparty_profiles
        WHERE id IN (SELECT i.id FROM ids i JOIN shared s ON s.platform = i.platform AND s.ident = i.ident)""",
    # The observer's rows one of the (platform $3[i], identifier $4[i]) pairs names, as a key, a
    # handle or an external id: one lookup per pair in each identifier's index, so finding the
    # people of a page costs the page, not the observer's rows.
    "named_pairs": f"""
        SELECT {_COLUMNS} FROM counterparty_profiles WHERE id IN (
            SELECT p.id FROM unnest($3::text[], $4::text[]) AS x(platform, ident)
            JOIN counterparty_profiles p ON p.company = $1 AND p.observer = $2 AND p.platform = x.platform
                                        AND p.subject_key = x.ident
            UNION
            SELECT p.id FROM unnest($3::text[], $4::text[]) AS x(platform, ident)
            JOIN counterparty_profiles p ON p.company = $1 AND p.observer = $2 AND p.platform = x.platform
                                        AND p.subject_handle = x.ident
            UNION
            SELECT p.id FROM unnest($3::text[], $4::text[]) AS x(platform, ident)
            JOIN counterparty_profiles p ON p.company = $1 AND p.observer = $2 AND p.platform = x.platform
                                        AND p.subject_external_id = x.ident)""",
    # A page of the observer's rows, newest first.
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


def _identifier_locks(company: str, observer: str, subject: Subject, identifiers: Iterable[str]) -> list[int]:
    """The advisory lock keys of the subject's ``identifiers`` (``lock_identifier``), in one order
    for every caller so two upserts never wait on each other's second lock."""
    keys = {
        int.from_bytes(
            hashlib.sha256(f"profiles/{company}/{observer}/{subject_part(subject.platform, x)}".encode()).digest()[:8],
            "big",
            signed=True,
        )
        for x in identifiers
    }
    return sorted(keys)


def _written(profile: Profile) -> tuple[object, ...]:
    """The parameters of ``update`` after the observation's ($10 on)."""
    return (
        profile.id,
        profile.subject.handle,
        profile.subject.external_id,
        profile.communication_style,
        list(profile.past_decisions),
        list(profile.sensitivities),
        list(profile.topics),
        profile.observation_count,
        profile.update_time,
        profile.last_turn_id,
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
        """The merge under the subject's locks; a row it writes records ``recorded`` (``_recorded``)."""
        company, observer, subject = write.company, write.observer, write.subject
        now, merge, request_id = write.now, write.merge, write.request_id
        # Every identifier of the person's rows is locked before any row is: two upserts reaching
        # one row (by whichever identifier) hold its identifiers' locks, so they never hold its
        # row lock while waiting for another's (no deadlock folding two rows of one person).
        _, known = await self._rows(conn, write, set(subject.identifiers), "peek")
        for lock in _identifier_locks(company, observer, subject, known):
            await conn.execute(SQL["lock_identifier"], lock)
        fresh = request_id is None or await conn.fetchval(SQL["claim"], company, observer, request_id, now) is not None
        rows, linked_now = await self._rows(conn, write, known, "find")
        # Rows linked between the two reads (a concurrent upsert committed a link): lock those too.
        for lock in _identifier_locks(company, observer, subject, linked_now - known):
            await conn.execute(SQL["lock_identifier"], lock)
        if not fresh and rows:  # applied before (a concurrent retry waits for the first)
            return combine(rows, write.limits), False, False
        if not rows:
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
            # A row under the key was committed between our read and our insert by a writer that
            # did not take our locks (one that predates them): merge into it (a new statement sees
            # the committed row, and waits for its lock).
            rows, _ = await self._rows(conn, write, known, "find")
            assert rows  # the insert conflicted with a row under the key
        current = combine(rows, write.limits)
        folded = [p.id for p in rows if p.id != current.id]
        if folded:
            await conn.execute(SQL["move_observations"], current.id, folded)
            await conn.execute(SQL["keep_folded_ids"], current.id, folded)
            await conn.execute(SQL["delete_rows"], folded)
        merged = merge(current)
        if merged is None:
            if folded:  # the rows were folded into one all the same: write it
                await conn.fetchrow(SQL["update"], *_NOT_RECORDED, *_written(current))
            return current, False, False
        row = await conn.fetchrow(SQL["update"], *recorded, *_written(merged))
        return _profile(row), False, True

    @staticmethod
    async def _rows(
        conn: asyncpg.Connection, write: ObservationWrite, identifiers: set[str], statement: str
    ) -> tuple[list[Profile], set[str]]:
        """The subject's rows (``linked``) by ``statement`` ("find": locked, "peek": not) and every
        identifier they know: found by ``identifiers``, then by those the rows found know too, until
        no row adds one."""
        subject = write.subject
        known = set(identifiers)
        while True:
            found = [
                _profile(r)
                for r in await conn.fetch(
                    SQL[statement], write.company, write.observer, subject.platform, sorted(known)
                )
            ]
            more = {x for p in found for x in identifiers_of(p)} - known
            if not more:
                return linked(subject, found), known
            known |= more

    async def get(self, company: str, observer: str, profile_id: uuid.UUID) -> Profile | None:
        row = await self.pool.fetchrow(SQL["get"], profile_id, company, observer)
        if row is None:  # folded into another row of the person since (rare: read only then)
            row = await self.pool.fetchrow(SQL["get_folded"], profile_id, company, observer)
        return _profile(row) if row is not None else None

    async def observations(
        self, company: str, observer: str, profile_ids: Sequence[uuid.UUID], limit: int
    ) -> list[ObservationRecord]:
        rows = await self.pool.fetch(SQL["observations"], list(profile_ids), company, observer, limit)
        return [_observation(r) for r in rows]

    async def get_many(self, company: str, observer: str, subjects: Sequence[Subject]) -> list[Profile]:
        platforms = sorted({s.platform for s in subjects})
        known = {x for s in subjects for x in s.identifiers}
        while True:  # the rows named, and the rows those name (``linked``)
            rows = [
                _profile(r) for r in await self.pool.fetch(SQL["get_many"], company, observer, platforms, sorted(known))
            ]
            more = {x for p in rows for x in identifiers_of(p)} - known
            if not more:
                return rows
            known |= more

    async def page(
        self,
        company: str,
        observer: str,
        after: tuple[datetime, uuid.UUID] | None,
        limit: int,
        *,
        count: bool = True,
    ) -> ProfilePage:
        """One snapshot (repeatable read): the observer's rows after the cursor, newest first, each
        with the rows of its person (``_people``); a row that is not its person's newest is passed
        over (the person was listed at its newest row, before it), and rows are read on until
        ``limit`` people are. The count of people (``count``) groups all the observer's rows, so it
        is read only when asked (the service asks on a listing's first page); None otherwise."""
        async with self.pool.acquire() as conn, conn.transaction(isolation="repeatable_read", readonly=True):
            people: list[list[Profile]] = []
            cursor = after
            while len(people) < limit:
                # A page of rows each time (not just the people missing): a run of rows passed
                # over costs a few reads, not one a row.
                at, at_id = cursor if cursor else (None, None)
                rows = [_profile(r) for r in await conn.fetch(SQL["page"], company, observer, at, at_id, limit)]
                of = await self._people(conn, company, observer, rows)
                people += [of[row.id] for row in rows if newest(of[row.id]).id == row.id]
                if len(rows) < limit:
                    break
                cursor = (rows[-1].update_time, rows[-1].id)
            total = None
            if count:
                shared = [_profile(r) for r in await conn.fetch(SQL["shared"], company, observer)]
                hidden = sum(len(rows) - 1 for rows in grouped(shared))
                total = int(await conn.fetchval(SQL["count"], company, observer)) - hidden
        return ProfilePage(people[:limit], total)

    @staticmethod
    async def _people(
        conn: asyncpg.Connection, company: str, observer: str, rows: Sequence[Profile]
    ) -> dict[uuid.UUID, list[Profile]]:
        """Each row's person (``grouped``): the rows sharing an identifier with it on its platform,
        and those sharing one with them, until no row adds one; read through the identifier
        indexes (``named_pairs``)."""
        known = {(p.subject.platform, x) for p in rows for x in identifiers_of(p)}
        found: list[Profile] = []
        while known:
            pairs = sorted(known)
            found = [
                _profile(r)
                for r in await conn.fetch(
                    SQL["named_pairs"], company, observer, [p for p, _ in pairs], [x for _, x in pairs]
                )
            ]
            more = {(p.subject.platform, x) for p in found for x in identifiers_of(p)} - known
            if not more:
                break
            known |= more
        return {p.id: mine for mine in grouped(found) for p in mine}
