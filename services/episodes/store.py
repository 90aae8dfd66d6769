"""PostgreSQL store of ``episodes``: named queries, ``$n`` parameters, driver errors kept inside.

Every read is scoped to one (company, seat). Similarity and the lexical half read raw rows only;
listings read both kinds. The lifecycle's statements are here too, each scoped to one seat, and a
fold is one transaction that re-checks its members under row locks before it deletes anything.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import asyncpg
import numpy as np

from libs.common.events import current_bookkeeping, held_events, written_together
from libs.common.rows import RowReader
from services.episodes.domain import Episode, EpisodeFilter, EpisodeKind, Sender, TurnOutcome
from services.episodes.ports import RawRows, SearchReads, Superseded

__all__ = ["SQL", "Dropped", "PostgresEpisodeStore", "senders_json"]

_log = logging.getLogger(__name__)

_COLUMNS = """id, company, seat, role, kind, turn_id, work_item, label, ask, what_it_did, outcome, review_outcome,
              tool_sequence, tools_called, skills_used, subjects, conversation_id, start_time, end_time, duration_ms,
              count, common_task_pattern, common_outcome, success_rate, done_count, subjects_involved,
              notable_patterns, exemplar_turn_ids, exemplar_of, consolidated_into_skill_id, embedding_model,
              embedding_dims, work_key"""
_SEAT = "company = $1 AND seat = $2"
_E_COLUMNS = ", ".join("e." + c.strip() for c in _COLUMNS.split(","))
"""The columns of alias ``e`` (a statement whose FROM names another table with some of them)."""
# A listing's filter: $3 kind, $4 outcomes, $5 min tool calls, $6 conversation, $7 exclude exemplars.
# The tool calls counted are the turn's run of tools: tools_called, or its final round
# (tool_sequence) when the engine reported no calls — the synthesizer gate's own count.
_FILTER = """($3::text IS NULL OR kind = $3) AND (cardinality($4::text[]) = 0 OR outcome = ANY($4::text[]))
             AND cardinality(CASE WHEN cardinality(tools_called) > 0 THEN tools_called ELSE tool_sequence END) >= $5
             AND ($6::text IS NULL OR conversation_id = $6)
             AND (NOT $7::boolean OR exemplar_of IS NULL)"""
# Rows the vector half cannot reach: no vector of the query's model and width.
_UNREACHABLE = "(embedding IS NULL OR embedding_model IS DISTINCT FROM $3 OR embedding_dims IS DISTINCT FROM $4)"
# Rows with a vector of the query's model and width the index does not hold yet (written while it
# was down): the index's answer misses them, so the exact scan answers while there are any.
_UNINDEXED = "(embedding IS NOT NULL AND embedding_model = $3 AND embedding_dims = $4 AND NOT indexed)"
# The parameters of a search's reads (SQL["lexical"], SQL["search_reads"]): $1 company, $2 seat,
# $3 the query vector's model, $4 its width, $5 the outcome (NULL: every outcome), $6 the query
# vector (NULL: none), $7 the query, $8 the lexical K, $9 the index hits' ids.
# The lexical half (the diary's): the query's own English lexemes OR-ed together, ranked by cover
# density, length-normalised; raw rows only. With a query vector each hit also says how similar it
# is in meaning, where its own vector is of the query's model and width (NULL otherwise): the
# relevance floor applies to it as to a vector hit.
_LEXICAL_CTES = f"""q AS (
            SELECT string_agg(quote_literal(lexeme), ' | ')::tsquery AS tsq
            FROM unnest(tsvector_to_array(to_tsvector('english', $7::text))) AS lexeme),
        lex AS (
            SELECT {_COLUMNS}, ts_rank(e.tsv, q.tsq, 1) AS rank,
                   CASE WHEN $6::vector IS NOT NULL AND e.embedding IS NOT NULL AND e.embedding_model = $3::text
                             AND e.embedding_dims = $4::int
                        THEN 1 - (e.embedding <=> $6::vector) END AS similarity
            FROM episodes e, q
            WHERE e.company = $1 AND e.seat = $2 AND e.kind = 'raw' AND ($5::text IS NULL OR e.outcome = $5)
              AND e.tsv @@ q.tsq
            ORDER BY rank DESC, e.end_time DESC, e.id DESC LIMIT $8)"""
# The end of the supersede's ``old`` (the mid-state it locks): an announcement's common table
# expressions go after it (``PostgresEpisodeStore.supersede``).
_SUPERSEDE_LOCKED = "kind = 'raw' AND outcome = 'self_iterate' FOR UPDATE)"
# A row a fold may take: old enough, settled, called a tool, not a summary's exemplar, not absorbed
# by a skill ($3 is the compaction horizon).
_FOLDABLE = """kind = 'raw' AND end_time < $3 AND exemplar_of IS NULL AND consolidated_into_skill_id IS NULL
               AND outcome <> 'self_iterate' AND (cardinality(tool_sequence) > 0 OR cardinality(tools_called) > 0)"""

SQL = {
    "insert": f"""
        INSERT INTO episodes (id, company, seat, role, kind, turn_id, work_item, label, ask, what_it_did, outcome,
                              review_outcome, tool_sequence, tools_called, skills_used, subjects, conversation_id,
                              start_time, end_time, duration_ms, record_time, embedding, embedding_model,
                              embedding_dims, work_key, senders)
        VALUES ($1, $2, $3, $4, 'raw', $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20,
                $21, $22, $23, $24, $25::jsonb)
        ON CONFLICT DO NOTHING
        RETURNING {_COLUMNS}""",
    "get": f"SELECT {_COLUMNS} FROM episodes WHERE {_SEAT} AND id = $3",
    # A run id names its own row, or the row its work was collapsed into (episode_runs).
    "get_by_turn": f"""
        SELECT {_COLUMNS} FROM episodes
        WHERE {_SEAT} AND (turn_id = $3 OR id = (
            SELECT episode_id FROM episode_runs r WHERE r.company = $1 AND r.seat = $2 AND r.turn_id = $3))
        ORDER BY turn_id = $3 DESC LIMIT 1""",
    "get_by_work_key": f"SELECT {_COLUMNS} FROM episodes WHERE {_SEAT} AND work_key = $3",
    # What a new record collides with, in one read: the run id's own row, the row it was filed
    # under, the row of its work key ($4, NULL: none).
    "prior": f"""
        WITH filed AS (SELECT episode_id FROM episode_runs r WHERE r.company = $1 AND r.seat = $2 AND r.turn_id = $3)
        SELECT {_COLUMNS}, id IN (SELECT episode_id FROM filed) AS aliased
        FROM episodes
        WHERE {_SEAT} AND (turn_id = $3 OR work_key = $4::text OR id IN (SELECT episode_id FROM filed))""",
    "alias_run": """
        INSERT INTO episode_runs (company, seat, turn_id, episode_id, record_time) VALUES ($1, $2, $3, $4, $5)
        ON CONFLICT (company, seat, turn_id) DO NOTHING""",
    # Field by field ($3 the row, $4.. the settled record):
    # - kept: id, turn_id and work_key (the keys the row is found by; a settled run id of its own is
    #   filed under it in episode_runs), record_time (when the work was first recorded), the
    #   lifecycle's and skills' stamps (a mid-state row is never folded nor drafted from);
    # - start_time: the earlier of the two (the work began with its first round; a round's record
    #   may carry its own start only), and duration_ms recomputed from it;
    # - taken whole: outcome, end_time, label, ask, what_it_did, review_outcome, tool_sequence,
    #   tools_called, skills_used, subjects, senders: the settled record is the turn's final account, and
    #   each round's record is a whole one, not a delta (its empty list says the end had none);
    # - role, work_item, conversation_id: the settled record's, or the row's where the record
    #   leaves it empty (they say where the turn sits, which a record not repeating it does not
    #   unsay);
    # - the vector: the settled text's (as an insert stores it), or none for the fill; not indexed
    #   yet; the fill's hold-backs cleared (they were about the old text).
    # One statement: the row is locked while it still is a mid-state (a concurrent supersede waits,
    # then finds it settled and changes nothing: no row back), and the width of the vector it had
    # comes back beside the new row (that point is of the old text).
    "supersede": f"""
        WITH old AS (
            SELECT id, embedding_dims FROM episodes
            WHERE {_SEAT} AND id = $3 AND {_SUPERSEDE_LOCKED}
        UPDATE episodes e SET
            outcome = $4, label = $5, ask = $6, what_it_did = $7, review_outcome = $8, tool_sequence = $9,
            tools_called = $10, skills_used = $11, subjects = $12, senders = $21::jsonb,
            role = coalesce($13, role), work_item = coalesce($14, work_item),
            conversation_id = coalesce($15, conversation_id),
            start_time = least(start_time, $16), end_time = $17,
            duration_ms = floor(extract(epoch FROM $17 - least(start_time, $16)) * 1000)::bigint,
            embedding = $18, embedding_model = $19, embedding_dims = $20, indexed = false,
            fill_held_until = NULL, fill_held_fingerprint = NULL, fill_alone = false
        FROM old WHERE e.id = old.id
        RETURNING {_E_COLUMNS}, old.embedding_dims AS previous_dims""",
    # The lexical half (the standalone statement: a search with no query vector).
    "lexical": f"WITH {_LEXICAL_CTES} SELECT * FROM lex",
    # A search's reads after the index search, in one statement (one round trip instead of three):
    # the vector half's re-read of its hits ($9, raw rows only: a stale point's id is simply
    # absent), the lexical half (above; $8 = 0 reads none) and two counts from one pass over the
    # seat's raw rows: those the query's model cannot reach, and those the index does not hold yet.
    # The counts are on every row; the LEFT JOIN keeps one row (with a NULL id) when there is
    # neither a hit nor a lexical match. Ordered here, so the lexical rows come back in the lexical
    # statement's order.
    "search_reads": f"""
        WITH {_LEXICAL_CTES}
        SELECT u.unreachable, u.unindexed, x.* FROM (
            SELECT count(*) FILTER (WHERE {_UNREACHABLE}) AS unreachable,
                   count(*) FILTER (WHERE {_UNINDEXED}) AS unindexed
            FROM episodes
            WHERE {_SEAT} AND kind = 'raw' AND ($5::text IS NULL OR outcome = $5)) AS u
        LEFT JOIN LATERAL (
            SELECT 'vector' AS half, {_COLUMNS}, 0::float4 AS rank, NULL::float8 AS similarity
            FROM episodes WHERE {_SEAT} AND kind = 'raw' AND id = ANY($9::uuid[])
            UNION ALL
            SELECT 'lexical' AS half, lex.* FROM lex) AS x ON true
        ORDER BY x.half, x.rank DESC, x.end_time DESC, x.id DESC""",
    # The exact per-seat scan that answers when the index cannot: raw rows of the query's model.
    "exact": f"""
        SELECT {_COLUMNS}, 1 - (embedding <=> $4) AS similarity
        FROM episodes
        WHERE {_SEAT} AND kind = 'raw' AND embedding IS NOT NULL AND embedding_model = $5 AND embedding_dims = $6
          AND ($7::text IS NULL OR outcome = $7)
        ORDER BY embedding <=> $4 LIMIT $3""",
    "count": f"SELECT count(*) FROM episodes WHERE {_SEAT} AND {_FILTER}",
    "page": f"""
        SELECT {_COLUMNS} FROM episodes
        WHERE {_SEAT} AND {_FILTER}
          AND ($8::timestamptz IS NULL OR (end_time, id) < ($8, $9::uuid))
        ORDER BY end_time DESC, id DESC LIMIT $10""",
    # Stamping is idempotent: a row already carrying this skill keeps its stamp time (the grace
    # runs from the first stamp); a row re-drafted into another skill starts a new grace.
    "mark_consolidated": f"""
        UPDATE episodes SET
            consolidated_time = CASE WHEN consolidated_into_skill_id IS NOT DISTINCT FROM $4
                                     THEN consolidated_time ELSE $5 END,
            consolidated_into_skill_id = $4
        WHERE {_SEAT} AND kind = 'raw' AND (turn_id = ANY($3) OR id IN (
            SELECT episode_id FROM episode_runs r WHERE r.company = $1 AND r.seat = $2 AND r.turn_id = ANY($3)))""",
    # Seats with raw rows, walked as a skip scan over episodes_seat_raw: one index probe per seat.
    "seats": """
        WITH RECURSIVE seats(company, seat) AS (
            (SELECT company, seat FROM episodes
             WHERE kind = 'raw' AND (company, seat) > ($1, $2) ORDER BY company, seat LIMIT 1)
            UNION ALL
            SELECT n.company, n.seat FROM seats s CROSS JOIN LATERAL (
                SELECT e.company, e.seat FROM episodes e
                WHERE e.kind = 'raw' AND (e.company, e.seat) > (s.company, s.seat)
                ORDER BY e.company, e.seat LIMIT 1) n)
        SELECT company, seat FROM seats LIMIT $3""",
    "seats_of_company": """
        WITH RECURSIVE seats(seat) AS (
            (SELECT seat FROM episodes WHERE kind = 'raw' AND company = $1 AND seat > $2 ORDER BY seat LIMIT 1)
            UNION ALL
            SELECT n.seat FROM seats s CROSS JOIN LATERAL (
                SELECT e.seat FROM episodes e
                WHERE e.kind = 'raw' AND e.company = $1 AND e.seat > s.seat ORDER BY e.seat LIMIT 1) n)
        SELECT $1::text AS company, seat FROM seats LIMIT $3""",
    # ---- the lifecycle (spec "Episode lifecycle")
    # The gate: one indexed count per seat (an index-only scan of episodes_seat_raw).
    "raw_count": f"SELECT count(*) FROM episodes WHERE {_SEAT} AND kind = 'raw'",
    "seat_role": f"SELECT role FROM episodes WHERE {_SEAT} ORDER BY end_time DESC, id DESC LIMIT 1",
    "drop_non_terminal": f"""
        DELETE FROM episodes WHERE {_SEAT} AND kind = 'raw' AND outcome = 'self_iterate' AND end_time < $3
        RETURNING id, embedding_dims""",
    "drop_tool_free": f"""
        DELETE FROM episodes WHERE {_SEAT} AND kind = 'raw' AND end_time < $3
          AND cardinality(tool_sequence) = 0 AND cardinality(tools_called) = 0
        RETURNING id, embedding_dims""",
    # A summary's exemplar is kept raw on purpose, stamped or not: it goes only with its summary.
    "drop_consolidated": f"""
        DELETE FROM episodes WHERE {_SEAT} AND kind = 'raw' AND consolidated_into_skill_id IS NOT NULL
          AND exemplar_of IS NULL AND end_time < $3 AND consolidated_time < $3
        RETURNING id, embedding_dims""",
    "fold_candidates": f"""
        SELECT {_COLUMNS} FROM episodes WHERE {_SEAT} AND {_FOLDABLE}
        ORDER BY end_time, id LIMIT $4""",
    "lock_members": f"SELECT id FROM episodes WHERE {_SEAT} AND {_FOLDABLE} AND id = ANY($4) FOR UPDATE",
    "insert_compacted": """
        INSERT INTO episodes (id, company, seat, role, kind, label, what_it_did, outcome, review_outcome,
                              tool_sequence, tools_called, skills_used, subjects, start_time, end_time, duration_ms,
                              record_time, count, common_task_pattern, common_outcome, success_rate, done_count,
                              subjects_involved, notable_patterns, exemplar_turn_ids, conversation_id)
        VALUES ($1, $2, $3, $4, 'compacted', $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19,
                $20, $21, $22, $23, $24, $25)""",
    "keep_exemplars": "UPDATE episodes SET exemplar_of = $2 WHERE id = ANY($1)",
    "compaction_by": "UPDATE episodes SET compaction_model = $2, compaction_prompt_version = $3 WHERE id = $1",
    # A member's runs: its own run id and the redeliveries collapsed into it (read before it goes);
    # its people, flat and as senders.
    "keep_member": """
        INSERT INTO compaction_members (compacted_id, position, company, turn_id, runs, subjects, record, senders)
        SELECT $1, $2, $3, coalesce(e.turn_id, ''),
               ARRAY(SELECT t FROM unnest(ARRAY[e.turn_id]) t WHERE t IS NOT NULL)
               || ARRAY(SELECT r.turn_id FROM episode_runs r WHERE r.episode_id = e.id ORDER BY r.turn_id),
               e.subjects, $5::jsonb, e.senders
        FROM episodes e WHERE e.id = $4""",
    "delete_ids": "DELETE FROM episodes WHERE id = ANY($1) RETURNING id, embedding_dims",
    "evict_compacted": f"""
        DELETE FROM episodes WHERE {_SEAT} AND kind = 'compacted' AND end_time < $3 RETURNING id""",
    "evict_exemplars": "DELETE FROM episodes WHERE exemplar_of = ANY($1) RETURNING id, embedding_dims",
    # ---- the index
    "set_indexed": "UPDATE episodes SET indexed = true WHERE id = ANY($1) AND embedding IS NOT NULL",
}


episode_of = RowReader(
    Episode,
    convert={
        "kind": EpisodeKind,
        "outcome": TurnOutcome,
        **dict.fromkeys(("duration_ms", "count", "done_count"), int),
        "success_rate": float,
        **dict.fromkeys(
            (
                "tool_sequence",
                "tools_called",
                "skills_used",
                "subjects",
                "subjects_involved",
                "notable_patterns",
                "exemplar_turn_ids",
            ),
            tuple,
        ),
    },
)
"""An episode from its row (every column is named as its field)."""


def senders_json(senders: Sequence[Sender]) -> str:
    """The ``senders`` column's JSON: one object per person, every field named (an empty one too)."""
    return json.dumps([{"handle": s.handle, "external_id": s.external_id, "platform": s.platform} for s in senders])


@dataclass(frozen=True)
class Dropped:
    """A deleted row and the width of the vector it had (to drop its point from the index)."""

    id: uuid.UUID
    dims: int | None


def _dropped(rows: Sequence[asyncpg.Record]) -> list[Dropped]:
    return [Dropped(r["id"], r["embedding_dims"]) for r in rows]


def _outcome_arg(rows: RawRows) -> str | None:
    """The outcome parameter of the raw reads (NULL reads every outcome)."""
    return str(rows.outcome) if rows.outcome else None


def _filter_args(f: EpisodeFilter) -> tuple[object, ...]:
    return (
        str(f.kind) if f.kind else None,
        [str(o) for o in f.outcomes],
        f.min_tool_calls,
        f.conversation_id,
        f.exclude_exemplars,
    )


@dataclass(frozen=True)
class Fold:
    """One cluster folded into a compacted row: what to insert, keep and delete."""

    compacted: Episode
    member_ids: list[uuid.UUID]
    exemplar_ids: list[uuid.UUID]
    members: list[dict[str, Any]] = field(default_factory=list)
    """What the summary read of each member, in ``member_ids`` order (kept for provenance and for
    re-deriving the row when a member's person is erased; ``compaction_members``)."""
    model: str = ""
    prompt_version: str = ""


class PostgresEpisodeStore:
    def __init__(self, pool: asyncpg.Pool):
        self.pool = pool

    # ---------------------------------------------------------------- writes

    async def insert_raw(
        self, ep: Episode, vector: np.ndarray | None, now: datetime, senders: Sequence[Sender] = ()
    ) -> Episode | None:
        """Insert a raw row; ``None`` when the seat already has a row for this run id or work key.

        Under a bookkeeping batch announcing the row (the service's ``episode_written``:
        ``Bookkeeping.announce``), the same statement writes the batch's rows, only if the row went
        in (:meth:`_with_announced`)."""
        args = [
            ep.id,
            ep.company,
            ep.seat,
            ep.role,
            ep.turn_id,
            ep.work_item,
            ep.label,
            ep.ask,
            ep.what_it_did,
            str(ep.outcome),
            ep.review_outcome,
            list(ep.tool_sequence),
            list(ep.tools_called),
            list(ep.skills_used),
            list(ep.subjects),
            ep.conversation_id,
            ep.start_time,
            ep.end_time,
            ep.duration_ms,
            now,
            None if vector is None else vector.astype(np.float32),
            ep.embedding_model if vector is not None else None,
            int(vector.shape[0]) if vector is not None else None,
            ep.work_key or None,
            senders_json(senders),
        ]
        row = await self._with_announced(
            SQL["insert"], args, lambda held: f"WITH ins AS ({SQL['insert']}){held} SELECT * FROM ins", "ins"
        )
        return episode_of(row) if row else None

    async def _with_announced(
        self, alone: str, args: list[Any], combined: Callable[[str], str], written: str
    ) -> asyncpg.Record | None:
        """Run the write ``alone`` (its one row back, or None), or — under a bookkeeping batch
        holding announcements (``Bookkeeping.announce``) — ``combined``: the same write with the
        batch's rows as common table expressions (``held_events``), each inserted only if the CTE
        ``written`` returned a row. One statement, one commit: a row and its announcement are
        written together or not at all, so no crash between two commits can lose the event.

        Refused by PostgreSQL (rolled back, nothing written): the batch opens again and the write
        runs alone; the announcement is left for ``Bookkeeping.withdraw`` (the service then emits
        it, best-effort, as before). An unknown outcome (a lost connection, a cancellation) drops
        the batch's rows (at most once) and raises, as the write alone would."""
        batch = current_bookkeeping()
        if batch is None or not batch.announced:
            return await self.pool.fetchrow(alone, *args)
        held, more = held_events(batch, len(args) + 1, f"EXISTS (SELECT 1 FROM {written})")
        together, row = await written_together(
            batch, lambda: self.pool.fetchrow(combined(held), *args, *more), "an episode row"
        )
        if not together:
            return await self.pool.fetchrow(alone, *args)
        batch.settle(row is not None)
        return row

    async def get_by_work_key(self, company: str, seat: str, work_key: str) -> Episode | None:
        row = await self.pool.fetchrow(SQL["get_by_work_key"], company, seat, work_key)
        return episode_of(row) if row else None

    async def prior(
        self, company: str, seat: str, turn_id: str, work_key: str | None
    ) -> tuple[Episode | None, Episode | None]:
        """(the row of this run id — its own, else the one it was filed under —, the row of this work
        key), in one statement."""
        rows = await self.pool.fetch(SQL["prior"], company, seat, turn_id, work_key or None)
        eps = [(episode_of(r), bool(r["aliased"])) for r in rows]
        run = next((e for e, _ in eps if e.turn_id == turn_id), None) or next((e for e, a in eps if a), None)
        work = next((e for e, _ in eps if work_key and e.work_key == work_key), None)
        return run, work

    async def alias_run(self, company: str, seat: str, turn_id: str, episode_id: uuid.UUID, now: datetime) -> None:
        """File another run id under a row: the run's work was recorded already (a redelivery)."""
        await self.pool.execute(SQL["alias_run"], company, seat, turn_id, episode_id, now)

    async def supersede(
        self, row_id: uuid.UUID, ep: Episode, vector: np.ndarray | None, now: datetime, senders: Sequence[Sender] = ()
    ) -> Superseded | None:
        """Settle the self_iterate row ``row_id`` with the record ``ep`` (SQL["supersede"] says which
        fields it takes), filing ``ep.turn_id`` under it when it is another run's, in one
        transaction; ``None`` when the row is no longer a mid-state (a concurrent record settled
        it, or it was deleted). An announcement of the batch rides on the supersede's statement,
        as on :meth:`insert_raw`'s."""
        args = [
            ep.company,
            ep.seat,
            row_id,
            str(ep.outcome),
            ep.label,
            ep.ask,
            ep.what_it_did,
            ep.review_outcome,
            list(ep.tool_sequence),
            list(ep.tools_called),
            list(ep.skills_used),
            list(ep.subjects),
            ep.role or None,
            ep.work_item or None,
            ep.conversation_id or None,
            ep.start_time,
            ep.end_time,
            None if vector is None else vector.astype(np.float32),
            ep.embedding_model if vector is not None else None,
            int(vector.shape[0]) if vector is not None else None,
            senders_json(senders),
        ]
        batch = current_bookkeeping()
        if batch is None or not batch.announced:
            return await self._supersede(args, ep, now, "")
        # The announcement rides on the supersede itself, inserted only if the row was still a
        # mid-state, in the transaction that also files the run under it (as insert_raw's does).
        held, more = held_events(batch, len(args) + 1, "EXISTS (SELECT 1 FROM old)")
        together, superseded = await written_together(
            batch, lambda: self._supersede([*args, *more], ep, now, held), "an episode row"
        )
        if not together:
            return await self._supersede(args, ep, now, "")
        batch.settle(superseded is not None)
        return superseded

    async def _supersede(self, args: list[Any], ep: Episode, now: datetime, held: str) -> Superseded | None:
        sql = SQL["supersede"].replace(_SUPERSEDE_LOCKED, _SUPERSEDE_LOCKED + held, 1)
        async with self.pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(sql, *args)
            if row is None:  # no longer a mid-state: another record settled it, or it is gone
                return None
            settled = episode_of(row)
            if ep.turn_id and settled.turn_id != ep.turn_id:
                await conn.execute(SQL["alias_run"], ep.company, ep.seat, ep.turn_id, settled.id, now)
        return Superseded(settled, row["previous_dims"])

    async def mark_consolidated(
        self, company: str, seat: str, turn_ids: Sequence[str], skill_id: str, now: datetime
    ) -> int:
        status = await self.pool.execute(SQL["mark_consolidated"], company, seat, list(turn_ids), skill_id, now)
        return int(status.split()[-1])

    # ---------------------------------------------------------------- reads

    async def get(self, company: str, seat: str, episode_id: uuid.UUID) -> Episode | None:
        row = await self.pool.fetchrow(SQL["get"], company, seat, episode_id)
        return episode_of(row) if row else None

    async def get_by_turn(self, company: str, seat: str, turn_id: str) -> Episode | None:
        row = await self.pool.fetchrow(SQL["get_by_turn"], company, seat, turn_id)
        return episode_of(row) if row else None

    async def lexical(self, rows: RawRows, query: str, limit: int) -> list[tuple[Episode, float, float | None]]:
        """The lexical half alone (no query vector: each hit's similarity is None)."""
        found = await self.pool.fetch(
            SQL["lexical"], rows.company, rows.seat, None, None, _outcome_arg(rows), None, query, limit
        )
        return [(episode_of(r), float(r["rank"]), None) for r in found]

    async def search_reads(
        self, rows: RawRows, vector: np.ndarray, model: str, ids: Sequence[uuid.UUID], query: str, lexical_limit: int
    ) -> SearchReads:
        found = await self.pool.fetch(
            SQL["search_reads"],
            rows.company,
            rows.seat,
            model,
            int(vector.shape[0]),
            _outcome_arg(rows),
            vector.astype(np.float32),
            query,
            lexical_limit,
            list(ids),
        )
        hits: dict[uuid.UUID, Episode] = {}
        lexical: list[tuple[Episode, float, float | None]] = []
        for r in found:
            if r["half"] == "vector":
                hits[r["id"]] = episode_of(r)
            elif r["half"] == "lexical":
                similarity = r["similarity"]
                lexical.append((episode_of(r), float(r["rank"]), None if similarity is None else float(similarity)))
        if not found:
            return SearchReads(hits, lexical, 0, 0)
        return SearchReads(hits, lexical, int(found[0]["unreachable"]), int(found[0]["unindexed"]))

    async def exact(self, rows: RawRows, vector: np.ndarray, model: str, limit: int) -> list[tuple[Episode, float]]:
        found = await self.pool.fetch(
            SQL["exact"],
            rows.company,
            rows.seat,
            limit,
            vector.astype(np.float32),
            model,
            int(vector.shape[0]),
            _outcome_arg(rows),
        )
        return [(episode_of(r), float(r["similarity"])) for r in found]

    async def count(self, company: str, seat: str, f: EpisodeFilter) -> int:
        return int(await self.pool.fetchval(SQL["count"], company, seat, *_filter_args(f)))

    async def page(
        self, company: str, seat: str, f: EpisodeFilter, after: tuple[datetime, uuid.UUID] | None, limit: int
    ) -> list[Episode]:
        rows = await self.pool.fetch(
            SQL["page"],
            company,
            seat,
            *_filter_args(f),
            after[0] if after else None,
            after[1] if after else None,
            limit,
        )
        return [episode_of(r) for r in rows]

    async def seats(self, company: str | None, after: tuple[str, str] | None, limit: int) -> list[tuple[str, str]]:
        """Seats with raw rows, ordered by (company, seat), after the cursor."""
        if company:
            start = after[1] if after else ""
            rows = await self.pool.fetch(SQL["seats_of_company"], company, start, limit)
        else:
            start_company, start_seat = after if after else ("", "")
            rows = await self.pool.fetch(SQL["seats"], start_company, start_seat, limit)
        return [(r["company"], r["seat"]) for r in rows]

    # ---------------------------------------------------------------- lifecycle

    async def raw_count(self, company: str, seat: str) -> int:
        return int(await self.pool.fetchval(SQL["raw_count"], company, seat))

    async def seat_role(self, company: str, seat: str) -> str | None:
        role: str | None = await self.pool.fetchval(SQL["seat_role"], company, seat)
        return role

    async def drop(self, which: str, company: str, seat: str, before: datetime) -> list[Dropped]:
        """``which``: non_terminal | tool_free | consolidated."""
        return _dropped(await self.pool.fetch(SQL[f"drop_{which}"], company, seat, before))

    async def fold_candidates(self, company: str, seat: str, before: datetime, limit: int) -> list[Episode]:
        rows = await self.pool.fetch(SQL["fold_candidates"], company, seat, before, limit)
        return [episode_of(r) for r in rows]

    async def fold(self, fold: Fold, before: datetime, now: datetime) -> list[Dropped] | None:
        """In one transaction: re-check the members under row locks, insert the compacted row, mark
        the exemplars, delete the rest. ``None`` (nothing changed) when a member is gone or no
        longer foldable (a skill stamped it meanwhile)."""
        c = fold.compacted
        async with self.pool.acquire() as conn, conn.transaction():
            locked = await conn.fetch(SQL["lock_members"], c.company, c.seat, before, fold.member_ids)
            if len(locked) != len(fold.member_ids):
                return None
            await conn.execute(
                SQL["insert_compacted"],
                c.id,
                c.company,
                c.seat,
                c.role,
                c.label,
                c.what_it_did,
                str(c.outcome),
                c.review_outcome,
                list(c.tool_sequence),
                list(c.tools_called),
                list(c.skills_used),
                list(c.subjects),
                c.start_time,
                c.end_time,
                c.duration_ms,
                now,
                c.count,
                c.common_task_pattern,
                c.common_outcome,
                c.success_rate,
                c.done_count,
                list(c.subjects_involved),
                list(c.notable_patterns),
                list(c.exemplar_turn_ids),
                c.conversation_id,
            )
            await conn.execute(SQL["keep_exemplars"], fold.exemplar_ids, c.id)
            await conn.execute(SQL["compaction_by"], c.id, fold.model, fold.prompt_version)
            for position, (member_id, record) in enumerate(zip(fold.member_ids, fold.members, strict=False)):
                await conn.execute(SQL["keep_member"], c.id, position, c.company, member_id, json.dumps(record))
            keep = set(fold.exemplar_ids)
            rows = await conn.fetch(SQL["delete_ids"], [i for i in fold.member_ids if i not in keep])
        return _dropped(rows)

    async def evict_compacted(self, company: str, seat: str, before: datetime) -> tuple[int, list[Dropped]]:
        """Delete compacted rows older than ``before`` and the exemplars they kept."""
        async with self.pool.acquire() as conn, conn.transaction():
            gone = [r["id"] for r in await conn.fetch(SQL["evict_compacted"], company, seat, before)]
            exemplars = await conn.fetch(SQL["evict_exemplars"], gone) if gone else []
        return len(gone), _dropped(exemplars)

    # ---------------------------------------------------------------- index bookkeeping

    async def set_indexed(self, ids: Sequence[uuid.UUID]) -> None:
        if ids:
            await self.pool.execute(SQL["set_indexed"], list(ids))
