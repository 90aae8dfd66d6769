"""PostgreSQL store of ``agent_diary``: named queries, ``$n`` parameters, driver errors kept inside.

Every read is scoped to one (company, seat) and carries the expiry predicate itself, so an expired
SHORT note never takes a slot in any half of the pool, swept or not.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from datetime import datetime

import asyncpg
import numpy as np
from pgvector import Vector

from libs.common.coalescer import Coalescer
from libs.common.db import unflushed
from libs.common.rows import RowReader
from services.diary.domain import Note, NoteProvenance, NoteSource, NoteTier
from services.diary.ports import EarlierWrite, NoteListing, VectorReads

__all__ = ["PostgresNoteStore"]

_COLUMNS = """id, company, seat, content, tier, source, turn_id, create_time, expire_time, use_count,
              last_used_time, embedding_model, embedding_dims"""
_D_COLUMNS = ", ".join(f"d.{c.strip()}" for c in _COLUMNS.split(","))
_LIVE = "(expire_time IS NULL OR expire_time > $3)"

# The lexical half's top K (the ranking is explained at SQL["lexical"]): the CTEs ``q, m, h, hw, top``
# over $1 company, $2 seat, $3 now, $4 K, $5 the query. Written once: the lexical statement and the
# lexical-and-recency statement select from the same ``top``.
_LEXICAL_TOP = """WITH q AS (
            SELECT lexeme, quote_literal(lexeme)::tsquery AS lq
            FROM unnest(tsvector_to_array(to_tsvector('english', $5))) AS lexeme),
        m AS MATERIALIZED (
            SELECT d.id, d.create_time, d.tsv FROM agent_diary d
            WHERE d.company = $1 AND d.seat = $2 AND (d.expire_time IS NULL OR d.expire_time > $3)
              AND d.tsv @@ (SELECT string_agg(quote_literal(lexeme), ' | ')::tsquery FROM q)),
        h AS MATERIALIZED (SELECT m.id, m.create_time, q.lexeme FROM m JOIN q ON m.tsv @@ q.lq),
        hw AS (
            SELECT h.id, h.create_time,
                   ln(1 + ((SELECT count(*) FROM m)::float8 - count(*) OVER w + 0.5) / (count(*) OVER w + 0.5)) AS idf
            FROM h WINDOW w AS (PARTITION BY h.lexeme)),
        top AS MATERIALIZED (
            SELECT hw.id, max(hw.create_time) AS ct, round(sum(hw.idf) * 1e9) / 1e9 AS rank
            FROM hw GROUP BY hw.id
            ORDER BY rank DESC, ct DESC LIMIT $4)"""

SQL = {
    # The note, its key and its provenance (issue 17) in one statement, so one commit: a note is
    # never stored without the provenance it was written with ($14 subjects, $15 the JSON; NULL:
    # none), nor without its key ($13, with its request's digest $16) claimed in
    # ``diary_requests``, which outlives it: a key claimed before (a concurrent claim of it is
    # waited for) stores nothing, unless its SHORT note's expiry has passed (the key is then claimed
    # again for this note). The provenance row's foreign key is checked at the statement's end,
    # when the note is there.
    "insert": f"""
        WITH claim AS (
            INSERT INTO diary_requests (company, seat, request_id, note_id, create_time, expire_time, request_digest)
            SELECT $2, $3, $13::text, $1, $8, $9, $16::bytea WHERE $13::text IS NOT NULL
            ON CONFLICT (company, seat, request_id) DO UPDATE
            SET note_id = EXCLUDED.note_id, create_time = EXCLUDED.create_time, expire_time = EXCLUDED.expire_time,
                request_digest = EXCLUDED.request_digest
            WHERE diary_requests.expire_time <= EXCLUDED.create_time
            RETURNING note_id),
        ins AS (
            INSERT INTO agent_diary (id, company, seat, content, tier, source, turn_id, create_time, expire_time,
                                     embedding, embedding_model, embedding_dims, request_id)
            SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13::text
            WHERE $13::text IS NULL OR EXISTS (SELECT 1 FROM claim)
            RETURNING {_COLUMNS}),
        kept AS (
            INSERT INTO note_provenance (note_id, company, seat, subjects, provenance, record_time)
            SELECT id, company, seat, $14::text[], $15::jsonb, create_time FROM ins WHERE $15::jsonb IS NOT NULL
            ON CONFLICT (note_id) DO NOTHING)
        SELECT {_COLUMNS} FROM ins""",
    # Concurrent writers' notes in one statement (PostgresNoteStore.insert gathers them): the
    # columns of "insert" as arrays, one element per note. A note whose request_id was used before
    # (by a note stored, or gone since, or an earlier one of the same statement) is not returned,
    # as with "insert". The provenances likewise: $14 each note's subjects as a JSON array (the
    # arrays differ in length, which one text[][] cannot hold), $15 the JSON (NULL: none).
    "insert_many": f"""
        WITH given AS (
            SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[],
                                 $8::timestamptz[], $9::timestamptz[], $10::vector[], $11::text[], $12::int[],
                                 $13::text[], $14::jsonb[], $15::jsonb[], $16::bytea[]) WITH ORDINALITY
                AS g(id, company, seat, content, tier, source, turn_id, create_time, expire_time,
                     embedding, embedding_model, embedding_dims, request_id, subjects, provenance, digest, n)),
        claim AS (
            INSERT INTO diary_requests (company, seat, request_id, note_id, create_time, expire_time, request_digest)
            SELECT DISTINCT ON (company, seat, request_id) company, seat, request_id, id, create_time, expire_time,
                   digest
            FROM given WHERE request_id IS NOT NULL ORDER BY company, seat, request_id, n
            ON CONFLICT (company, seat, request_id) DO UPDATE
            SET note_id = EXCLUDED.note_id, create_time = EXCLUDED.create_time, expire_time = EXCLUDED.expire_time,
                request_digest = EXCLUDED.request_digest
            WHERE diary_requests.expire_time <= EXCLUDED.create_time
            RETURNING note_id),
        ins AS (
            INSERT INTO agent_diary (id, company, seat, content, tier, source, turn_id, create_time, expire_time,
                                     embedding, embedding_model, embedding_dims, request_id)
            SELECT id, company, seat, content, tier, source, turn_id, create_time, expire_time,
                   embedding, embedding_model, embedding_dims, request_id FROM given
            WHERE request_id IS NULL OR id IN (SELECT note_id FROM claim)
            RETURNING {_COLUMNS}),
        kept AS (
            INSERT INTO note_provenance (note_id, company, seat, subjects, provenance, record_time)
            SELECT ins.id, ins.company, ins.seat, ARRAY(SELECT jsonb_array_elements_text(g.subjects)), g.provenance,
                   ins.create_time
            FROM ins JOIN given g ON g.id = ins.id WHERE g.provenance IS NOT NULL
            ON CONFLICT (note_id) DO NOTHING)
        SELECT {_COLUMNS} FROM ins""",
    # What a key names: the note its write stored, when still live at $4 (its columns NULL when
    # the note was deleted, swept, erased, or expired unswept: GetNote's NOT_FOUND too), and
    # whether the key is spent at $4 (until that note's own expiry; a LONG note's, for good), and
    # the digest of the request that claimed it (NULL: claimed before digests were kept).
    "by_request": f"""
        SELECT (r.expire_time IS NULL OR r.expire_time > $4) AS spent, r.request_digest, {_D_COLUMNS}
        FROM diary_requests r
        LEFT JOIN agent_diary d ON d.id = r.note_id AND (d.expire_time IS NULL OR d.expire_time > $4)
        WHERE r.company = $1 AND r.seat = $2 AND r.request_id = $3""",
    "get": f"SELECT {_COLUMNS} FROM agent_diary WHERE company = $1 AND seat = $2 AND {_LIVE} AND id = $4",
    "hydrate": f"SELECT {_COLUMNS} FROM agent_diary WHERE company = $1 AND seat = $2 AND {_LIVE} AND id = ANY($4)",
    "recent": f"""SELECT {_COLUMNS} FROM agent_diary WHERE company = $1 AND seat = $2 AND {_LIVE}
                  ORDER BY create_time DESC, id DESC LIMIT $4""",
    # The lexical half. A note matches when it shares any English lexeme with the query (a question
    # rarely shares all of its words with the note that answers it); matches are ranked by the
    # summed inverse document frequency of the lexemes they share, computed over this seat's matched
    # notes only, so a name that is on every note weighs little and a rare word a lot. On LoCoMo
    # this lifts the lexical top-50 from 70% to 74% of the evidence over ts_rank (bench/locomo.py).
    # Its cost is the matches (a question's date or a speaker's name can match most of a seat): each
    # (matched note, query lexeme) pair is tested once (h); the document frequencies are a window
    # over those pairs and the sums a grouping of them, so no step joins the matches to themselves
    # (the planner cannot estimate a CTE's rows and chose nested loops: a join of the matches with
    # their sums cost |matches|² comparisons, ~100 ms at 419 matches); only (id, create_time, tsv)
    # of the matches is kept while ranking and the whole row is read for the top K alone, by key.
    # The rank is rounded so notes holding the same lexemes tie exactly whatever order the sum ran
    # in (ties: newest first). The CTEs stay MATERIALIZED: inlined, PostgreSQL re-ran the seat
    # count per row.
    "lexical": f"""
        {_LEXICAL_TOP}
        SELECT {_D_COLUMNS}, top.rank FROM top JOIN agent_diary d ON d.id = top.id
        ORDER BY top.rank DESC, top.ct DESC""",
    # The lexical and recency halves in one statement (one round trip and one pooled connection
    # instead of two): the lexical statement above with its top K tagged 'lexical', then the
    # seat's newest live notes tagged 'recency'. A note may come back once per half.
    "lexical_recent": f"""
        {_LEXICAL_TOP}
        (SELECT 'lexical' AS half, {_D_COLUMNS}, top.rank FROM top JOIN agent_diary d ON d.id = top.id
         ORDER BY top.rank DESC, top.ct DESC)
        UNION ALL
        (SELECT 'recency' AS half, {_COLUMNS}, 0::float8 AS rank FROM agent_diary
         WHERE company = $1 AND seat = $2 AND {_LIVE}
         ORDER BY create_time DESC, id DESC LIMIT $6)""",
    # The vector half's re-read of its hits and two counts of the seat's live notes, in one round
    # trip (all follow the index search): those the query's model cannot reach, and those with a
    # vector of it the index does not hold yet (written while it was down: the index's answer
    # misses them, so the exact scan answers instead). Both counts come from the one pass over the
    # seat's notes. They are on every row; the LEFT JOIN keeps one row (with a NULL id) when no hit
    # is still live.
    "hydrate_unreachable": f"""
        SELECT u.unreachable, u.unindexed, d.* FROM (
            SELECT count(*) FILTER (WHERE embedding IS NULL OR embedding_model IS DISTINCT FROM $5
                                          OR embedding_dims IS DISTINCT FROM $6) AS unreachable,
                   count(*) FILTER (WHERE embedding IS NOT NULL AND embedding_model = $5 AND embedding_dims = $6
                                          AND NOT indexed) AS unindexed
            FROM agent_diary
            WHERE company = $1 AND seat = $2 AND {_LIVE}) AS u
        LEFT JOIN LATERAL (
            SELECT {_COLUMNS} FROM agent_diary
            WHERE company = $1 AND seat = $2 AND {_LIVE} AND id = ANY($4)) AS d ON true""",
    # The neighbours half: for each anchor (create_time, id), the seat's live note just before it and
    # just after it in (create_time, id) order — two index probes of the recency index each.
    "neighbours": f"""
        SELECT DISTINCT ON (x.id) x.* FROM unnest($4::timestamptz[], $5::uuid[]) AS a(t, id),
        LATERAL (
            (SELECT {_COLUMNS} FROM agent_diary d
             WHERE d.company = $1 AND d.seat = $2 AND (d.expire_time IS NULL OR d.expire_time > $3)
               AND (d.create_time, d.id) < (a.t, a.id)
             ORDER BY d.create_time DESC, d.id DESC LIMIT $6)
            UNION ALL
            (SELECT {_COLUMNS} FROM agent_diary d
             WHERE d.company = $1 AND d.seat = $2 AND (d.expire_time IS NULL OR d.expire_time > $3)
               AND (d.create_time, d.id) > (a.t, a.id)
             ORDER BY d.create_time ASC, d.id ASC LIMIT $6)) AS x""",
    # The exact per-seat scan that answers when the index cannot.
    "exact": f"""
        SELECT {_COLUMNS}, 1 - (embedding <=> $5) AS similarity
        FROM agent_diary
        WHERE company = $1 AND seat = $2 AND {_LIVE}
          AND embedding IS NOT NULL AND embedding_model = $6 AND embedding_dims = $7
        ORDER BY embedding <=> $5 LIMIT $4""",
    "unreachable": f"""
        SELECT count(*) FROM agent_diary
        WHERE company = $1 AND seat = $2 AND {_LIVE}
          AND (embedding IS NULL OR embedding_model IS DISTINCT FROM $4 OR embedding_dims IS DISTINCT FROM $5)""",
    "mark_used": """
        UPDATE agent_diary SET use_count = use_count + 1, last_used_time = $4
        WHERE company = $1 AND seat = $2 AND id = ANY($3) AND (expire_time IS NULL OR expire_time > $4)""",
    "count": f"""SELECT count(*) FROM agent_diary WHERE company = $1 AND seat = $2 AND {_LIVE}
                 AND ($4::text IS NULL OR tier = $4)""",
    "page": f"""
        SELECT {_COLUMNS} FROM agent_diary
        WHERE company = $1 AND seat = $2 AND {_LIVE} AND ($4::text IS NULL OR tier = $4)
          AND ($5::timestamptz IS NULL OR (create_time, id) < ($5, $6::uuid))
        ORDER BY create_time DESC, id DESC LIMIT $7""",
    # The note whether live or expired unswept (the caller wants it gone: it goes now, not at the
    # sweep), and whether it was live at $4 (an expired one is gone to every read: NOT_FOUND).
    "delete": """
        DELETE FROM agent_diary WHERE company = $1 AND seat = $2 AND id = $3
        RETURNING embedding_dims, (expire_time IS NULL OR expire_time > $4) AS live""",
    "set_indexed": "UPDATE agent_diary SET indexed = true WHERE id = ANY($1)",
    "sweep_expired": """
        DELETE FROM agent_diary WHERE id IN (
            SELECT id FROM agent_diary WHERE expire_time IS NOT NULL AND expire_time <= $1 LIMIT $2)
        RETURNING id, embedding_dims""",
    "seats_over_cap": """
        SELECT company, seat FROM agent_diary WHERE tier = 'long'
        GROUP BY company, seat HAVING count(*) > $1""",
    # Past the cap: least-retrieved first, then least-recently-retrieved (never retrieved first),
    # then oldest. What survives is what the seat reaches for.
    # An evicted note's key goes with it: evicted for disuse, the fact may be learned again (a
    # deleted note's key stays, so a retry does not bring back what someone removed).
    "evict_over_cap": """
        WITH gone AS (
            DELETE FROM agent_diary WHERE id IN (
                SELECT id FROM agent_diary WHERE company = $1 AND seat = $2 AND tier = 'long'
                ORDER BY use_count DESC, last_used_time DESC NULLS LAST, create_time DESC, id DESC
                OFFSET $3)
            RETURNING id, embedding_dims),
        keys AS (DELETE FROM diary_requests WHERE company = $1 AND seat = $2 AND note_id IN (SELECT id FROM gone))
        SELECT id, embedding_dims FROM gone""",
}


# By value: a dict lookup is a quarter of an enum call, and a recall hydrates ~200 rows.
_TIERS = {t.value: t for t in NoteTier}
_SOURCES = {s.value: s for s in NoteSource}


_note = RowReader(
    Note,
    convert={
        "tier": lambda v: _TIERS.get(v) or NoteTier(v),
        "source": lambda v: _SOURCES.get(v) or NoteSource(v),
        "use_count": int,
    },
)
"""A note from its row (every column named as its field)."""


def _listing_params(listing: NoteListing) -> tuple[str, str, datetime, str | None]:
    """$1..$4 of ``count`` and ``page``: the same rows, so the total counts what the pages hold."""
    return listing.company, listing.seat, listing.now, str(listing.tier) if listing.tier else None


_Insert = tuple[Note, np.ndarray | None, str | None, NoteProvenance | None, bytes | None]


def _insert_params(
    note: Note,
    vector: np.ndarray | None,
    request_id: str | None,
    provenance: NoteProvenance | None,
    request_digest: bytes | None,
) -> tuple[object, ...]:
    """$1..$16 of "insert" for one note (an element of each array of "insert_many", where $14 is
    the subjects as a JSON array)."""
    return (
        note.id,
        note.company,
        note.seat,
        note.content,
        str(note.tier),
        str(note.source),
        note.turn_id,
        note.create_time,
        note.expire_time,
        None if vector is None else vector.astype(np.float32),
        note.embedding_model if vector is not None else None,
        int(vector.shape[0]) if vector is not None else None,
        request_id,
        None if provenance is None else provenance.subjects,
        None if provenance is None else provenance.json,
        request_digest,
    )


class PostgresNoteStore:
    def __init__(self, pool: asyncpg.Pool, *, insert_batch: int = 64, insert_statements: int = 2):
        self.pool = pool
        # Concurrent writes go to PostgreSQL together: one statement and one commit for what waited
        # while up to ``insert_statements`` inserts were in flight (issue 14: WriteNote at 16 writers).
        self._inserts: Coalescer[_Insert, Note | None] = Coalescer(
            self._insert_batch, max_batch=insert_batch, max_running=insert_statements
        )

    async def by_request(self, company: str, seat: str, request_id: str, now: datetime) -> EarlierWrite | None:
        row = await self.pool.fetchrow(SQL["by_request"], company, seat, request_id, now)
        if row is None or (row["id"] is None and not row["spent"]):
            return None  # never used, or its SHORT note's time is over: free again
        return EarlierWrite(_note(row) if row["id"] is not None else None, row["request_digest"])

    async def insert(
        self,
        note: Note,
        vector: np.ndarray | None,
        request_id: str | None = None,
        provenance: NoteProvenance | None = None,
        request_digest: bytes | None = None,
    ) -> Note | None:
        """The stored note, or ``None`` when ``request_id`` was already used (see ``by_request``);
        ``provenance`` is committed with it, ``request_digest`` with the key. Concurrent calls
        share one statement; each still gets its own note, ``None`` or error."""
        return await self._inserts.submit((note, vector, request_id, provenance, request_digest))

    async def _insert_one(
        self,
        note: Note,
        vector: np.ndarray | None,
        request_id: str | None,
        provenance: NoteProvenance | None,
        request_digest: bytes | None,
    ) -> Note | None:
        row = await self.pool.fetchrow(
            SQL["insert"], *_insert_params(note, vector, request_id, provenance, request_digest)
        )
        return _note(row) if row else None

    async def _insert_batch(self, items: list[_Insert]) -> list[Note | Exception | None]:
        """One statement for the notes that waited together. When it fails (nothing of it was
        stored), each note is tried alone, so one note's fault is its own writer's answer only."""
        if len(items) == 1:
            return [await self._insert_one(*items[0])]
        columns = list(zip(*(_insert_params(*item) for item in items), strict=True))
        # A vector as one element: asyncpg would read a bare ndarray as a nested array of floats.
        columns[9] = tuple(None if v is None else Vector(v) for v in columns[9])
        columns[13] = tuple(None if s is None else json.dumps(s) for s in columns[13])
        try:
            rows = await self.pool.fetch(SQL["insert_many"], *(list(c) for c in columns))
        except Exception:
            out: list[Note | Exception | None] = []
            for item in items:
                try:
                    out.append(await self._insert_one(*item))
                except Exception as exc:
                    out.append(exc)
            return out
        stored = {r["id"]: _note(r) for r in rows}
        return [stored.get(note.id) for note, *_ in items]

    async def get(self, company: str, seat: str, note_id: uuid.UUID, now: datetime) -> Note | None:
        row = await self.pool.fetchrow(SQL["get"], company, seat, now, note_id)
        return _note(row) if row else None

    async def hydrate(self, company: str, seat: str, ids: Sequence[uuid.UUID], now: datetime) -> dict[uuid.UUID, Note]:
        rows = await self.pool.fetch(SQL["hydrate"], company, seat, now, list(ids))
        return {r["id"]: _note(r) for r in rows}

    async def recent(self, company: str, seat: str, now: datetime, limit: int) -> list[Note]:
        return [_note(r) for r in await self.pool.fetch(SQL["recent"], company, seat, now, limit)]

    async def lexical(self, company: str, seat: str, now: datetime, query: str, limit: int) -> list[tuple[Note, float]]:
        rows = await self.pool.fetch(SQL["lexical"], company, seat, now, limit, query)
        return [(_note(r), float(r["rank"])) for r in rows]

    async def lexical_recent(
        self, company: str, seat: str, now: datetime, query: str, lexical_limit: int, recency_limit: int
    ) -> tuple[list[tuple[Note, float]], list[Note]]:
        """``lexical(query, lexical_limit)`` and ``recent(recency_limit)`` in one statement."""
        rows = await self.pool.fetch(SQL["lexical_recent"], company, seat, now, lexical_limit, query, recency_limit)
        lexical = [(_note(r), float(r["rank"])) for r in rows if r["half"] == "lexical"]
        return lexical, [_note(r) for r in rows if r["half"] == "recency"]

    async def hydrate_unreachable(
        self, company: str, seat: str, ids: Sequence[uuid.UUID], now: datetime, model: str, dims: int
    ) -> VectorReads:
        """``hydrate(ids)``, ``unreachable_by_vector(model, dims)`` and the unindexed count in one statement."""
        rows = await self.pool.fetch(SQL["hydrate_unreachable"], company, seat, now, list(ids), model, dims)
        unreachable, unindexed = (int(rows[0]["unreachable"]), int(rows[0]["unindexed"])) if rows else (0, 0)
        return VectorReads({r["id"]: _note(r) for r in rows if r["id"] is not None}, unreachable, unindexed)

    async def neighbours(
        self, company: str, seat: str, now: datetime, anchors: Sequence[Note], radius: int = 1
    ) -> list[Note]:
        """The seat's live notes written just before and just after each anchor (``radius`` each side)."""
        if not anchors:
            return []
        rows = await self.pool.fetch(
            SQL["neighbours"],
            company,
            seat,
            now,
            [a.create_time for a in anchors],
            [a.id for a in anchors],
            radius,
        )
        return [_note(r) for r in rows]

    async def exact(
        self, company: str, seat: str, now: datetime, vector: np.ndarray, model: str, limit: int
    ) -> list[tuple[Note, float]]:
        rows = await self.pool.fetch(
            SQL["exact"], company, seat, now, limit, vector.astype(np.float32), model, int(vector.shape[0])
        )
        return [(_note(r), float(r["similarity"])) for r in rows]

    async def unreachable_by_vector(self, company: str, seat: str, now: datetime, model: str, dims: int) -> int:
        return int(await self.pool.fetchval(SQL["unreachable"], company, seat, now, model, dims))

    async def mark_used(self, company: str, seat: str, ids: Sequence[uuid.UUID], now: datetime) -> int:
        # A use is best-effort telemetry by the spec and is written on a turn start's path: its
        # commit does not wait for the disk (``unflushed``).
        async with unflushed(self.pool) as conn:
            status = await conn.execute(SQL["mark_used"], company, seat, list(ids), now)
        return int(status.split()[-1])

    async def count(self, listing: NoteListing) -> int:
        return int(await self.pool.fetchval(SQL["count"], *_listing_params(listing)))

    async def page(self, listing: NoteListing, after: tuple[datetime, uuid.UUID] | None, limit: int) -> list[Note]:
        rows = await self.pool.fetch(
            SQL["page"],
            *_listing_params(listing),
            after[0] if after else None,
            after[1] if after else None,
            limit,
        )
        return [_note(r) for r in rows]

    async def delete(self, company: str, seat: str, note_id: uuid.UUID, now: datetime) -> tuple[bool, int | None]:
        row = await self.pool.fetchrow(SQL["delete"], company, seat, note_id, now)
        return (row is not None and bool(row["live"]), row["embedding_dims"] if row else None)

    async def set_indexed(self, ids: Sequence[uuid.UUID]) -> None:
        if ids:
            await self.pool.execute(SQL["set_indexed"], list(ids))

    async def sweep_expired(self, now: datetime, batch: int = 5000) -> list[tuple[uuid.UUID, int | None]]:
        rows = await self.pool.fetch(SQL["sweep_expired"], now, batch)
        return [(r["id"], r["embedding_dims"]) for r in rows]

    async def seats_over_cap(self, cap: int) -> list[tuple[str, str]]:
        return [(r["company"], r["seat"]) for r in await self.pool.fetch(SQL["seats_over_cap"], cap)]

    async def evict_over_cap(self, company: str, seat: str, cap: int) -> list[tuple[uuid.UUID, int | None]]:
        rows = await self.pool.fetch(SQL["evict_over_cap"], company, seat, cap)
        return [(r["id"], r["embedding_dims"]) for r in rows]
