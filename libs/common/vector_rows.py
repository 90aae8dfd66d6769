"""Tables whose rows keep their own vector (pgvector) and a copy of it in the vector index: diary
notes, raw episodes, knowledge pages. What they share lives here, described once per table by a
:class:`VectorRows`:

* :func:`index_pending` — index the rows whose vector is stored but not in the index yet (written
  while the index was unreachable, or filled but not yet upserted);
* :func:`rebuild_index` — restore the index from the vectors Postgres keeps, without one embedding
  call (``./run rebuild-index``);
* :class:`TableFillSource` — the table as the shared vector fill (``libs.common.fill``) sees it:
  live rows with no vector of the current model and width, not held back under the current
  provider, their text, and where a filled vector goes.

Each table needs the columns ``id, company, <seat column>, embedding, embedding_model,
embedding_dims, indexed, fill_held_until, fill_held_fingerprint, fill_alone`` (``embedding_model`` is
NULL exactly when ``embedding`` is), and an index on ``(embedding_model, embedding_dims, company,
<seat column>)`` so an idle fill minute costs an index probe.
"""

from __future__ import annotations

import functools
import logging
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

import asyncpg
import numpy as np

from libs.common.clock import Clock
from libs.common.db import as_array
from libs.common.embeddings import Vector
from libs.common.fill import FillRow
from libs.common.vectorindex import IndexPoint, IndexUnavailable, VectorIndex, collection_name

__all__ = ["TableFillSource", "VectorRows", "drop_points", "index_pending", "rebuild_index"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VectorRows:
    """How one table keeps its vectors."""

    name: str
    """The row family's name (the fill's state is kept under it)."""
    table: str
    seat_column: str
    """The column the fill walks by: a seat, or a knowledge page's container."""
    collection_base: str
    """The index collection (one per width: ``<base>_<dims>``)."""
    order_column: str
    """The fill embeds a seat's rows oldest first by this column."""
    text_columns: tuple[str, ...]
    text: Callable[[asyncpg.Record], str]
    """The row's vector text, from ``text_columns``."""
    point_columns: tuple[str, ...]
    point: Callable[[asyncpg.Record, np.ndarray, str], IndexPoint]
    """The row's index point, from ``point_columns`` (plus id, company and the seat column), its
    vector and model."""
    live: str = "true"
    """Which rows are indexed and filled at all; ``$NOW`` stands for the current time."""
    unchanged: str | None = None
    """A predicate that still holds only if the row's text is the text a filled vector is of
    (``$TEXT``); a row rewritten meanwhile keeps its own vector."""

    def _live(self, now_param: str) -> str:
        # The time parameter is typed here even when the table's predicate does not read it.
        return f"({self.live.replace('$NOW', now_param)} AND {now_param}::timestamptz IS NOT NULL)"

    def _select(self) -> str:
        cols = dict.fromkeys(("id", "company", self.seat_column, "embedding", "embedding_model", *self.point_columns))
        return ", ".join(cols)

    @functools.cached_property
    def sql(self) -> dict[str, str]:
        """This table's named statements, written once from its description (the table, seat and
        column names are the spec's, never a caller's value)."""
        t, seat, select = self.table, self.seat_column, self._select()
        # $1 now, $2 model, $3 dims (NULL: any width), $4 the provider's fingerprint. The model and
        # width tests are ranges rather than IS DISTINCT FROM, so an index on (embedding_model,
        # embedding_dims) answers a minute with nothing to fill without reading the table.
        pending = f"""
            {self._live("$1")}
            AND (embedding_model IS NULL OR embedding_model < $2 OR embedding_model > $2
                 OR (embedding_model = $2 AND $3::int IS NOT NULL AND (embedding_dims < $3 OR embedding_dims > $3)))
            AND NOT (fill_held_until IS NOT NULL AND fill_held_until > $1 AND fill_held_fingerprint = $4)"""
        guard = f"AND {self.unchanged.replace('$TEXT', '$5')}" if self.unchanged else "AND $5::text IS NOT NULL"
        return {
            "set_indexed": f"UPDATE {t} SET indexed = true WHERE id = ANY($1) AND embedding IS NOT NULL",
            "unindexed": f"""
                SELECT {select} FROM {t}
                WHERE embedding IS NOT NULL AND NOT indexed AND {self._live("$1")}
                ORDER BY company, {seat}, id LIMIT $2""",
            "unindex_all": f"UPDATE {t} SET indexed = false WHERE indexed",
            "with_vectors": f"""
                SELECT {select} FROM {t}
                WHERE embedding IS NOT NULL AND {self._live("$1")} AND ($2::uuid IS NULL OR id > $2)
                ORDER BY id LIMIT $3""",
            "fill_companies": f"SELECT DISTINCT company FROM {t} WHERE {pending} ORDER BY company",
            "fill_backlog": f"SELECT count(*) FROM {t} WHERE {pending}",
            "fill_seats": f"SELECT DISTINCT {seat} FROM {t} WHERE company = $5 AND {pending} ORDER BY {seat}",
            "fill_pending": f"""
                SELECT id, {", ".join(self.text_columns)}, fill_alone AND fill_held_fingerprint = $4 AS alone
                FROM {t}
                WHERE company = $5 AND {seat} = $6 AND {pending}
                ORDER BY {self.order_column}, id LIMIT $7""",
            "store_vector": f"""
                UPDATE {t}
                   SET embedding = $2, embedding_model = $3, embedding_dims = $4, indexed = false,
                       fill_held_until = NULL, fill_held_fingerprint = NULL, fill_alone = false
                 WHERE id = $1 {guard}
             RETURNING {select}""",
            "hold": f"UPDATE {t} SET fill_held_until = $2, fill_held_fingerprint = $3, fill_alone = $4 WHERE id = $1",
        }


def _points(rows: VectorRows, records: Sequence[asyncpg.Record]) -> dict[int, list[IndexPoint]]:
    by_dims: dict[int, list[IndexPoint]] = defaultdict(list)
    for r in records:
        vec = as_array(r["embedding"])
        by_dims[int(vec.shape[0])].append(rows.point(r, vec, r["embedding_model"]))
    return by_dims


async def _set_indexed(pool: asyncpg.Pool, rows: VectorRows, ids: Sequence[uuid.UUID]) -> None:
    if ids:
        await pool.execute(rows.sql["set_indexed"], list(ids))


async def index_pending(
    rows: VectorRows, pool: asyncpg.Pool, index: VectorIndex, clock: Clock, batch: int = 1000
) -> int:
    """Index the rows whose vector is stored but not in the index; stops when the index still
    cannot be reached (the rows keep waiting). Returns how many were indexed."""
    done = 0
    while True:
        records = await pool.fetch(rows.sql["unindexed"], clock.now(), batch)
        if not records:
            return done
        try:
            for dims, points in _points(rows, records).items():
                await index.upsert(collection_name(rows.collection_base, dims), points)
        except IndexUnavailable as err:
            _log.warning("index still unreachable; %d %s rows wait to be indexed: %s", len(records), rows.name, err)
            return done
        await _set_indexed(pool, rows, [r["id"] for r in records])
        done += len(records)


async def rebuild_index(
    rows: VectorRows, pool: asyncpg.Pool, index: VectorIndex, clock: Clock, batch: int = 1000
) -> int:
    """Restore the index from the vectors Postgres keeps: every collection of the table is emptied
    and refilled from the rows, with no embedding call. Returns how many points were written."""
    await pool.execute(rows.sql["unindex_all"])
    reset: set[int] = set()
    after: uuid.UUID | None = None
    total = 0
    while True:
        records = await pool.fetch(rows.sql["with_vectors"], clock.now(), after, batch)
        if not records:
            return total
        for dims, points in _points(rows, records).items():
            if dims not in reset:
                await index.reset(collection_name(rows.collection_base, dims))
                reset.add(dims)
            await index.upsert(collection_name(rows.collection_base, dims), points)
        await _set_indexed(pool, rows, [r["id"] for r in records])
        total += len(records)
        after = records[-1]["id"]


async def drop_points(
    index: VectorIndex, collection_base: str, gone: Iterable[tuple[uuid.UUID, int | None]], what: str
) -> None:
    """Remove deleted rows' points, one delete per vector width (a row without a vector has none).
    Best effort: every hit is re-read from Postgres, which no longer has the row, and a rebuild
    clears what stays; ``what`` names the rows in the warning."""
    by_dims: dict[int, list[uuid.UUID]] = defaultdict(list)
    for row_id, dims in gone:
        if dims:
            by_dims[dims].append(row_id)
    for dims, ids in by_dims.items():
        try:
            await index.delete(collection_name(collection_base, dims), ids)
        except IndexUnavailable as err:
            _log.warning("%d %s keep stale points until a rebuild: %s", len(ids), what, err)


class TableFillSource:
    """A :class:`VectorRows` table as the shared fill sees it (the ``FillSource`` port)."""

    def __init__(self, rows: VectorRows, pool: asyncpg.Pool, index: VectorIndex):
        self.name = rows.name
        self._rows = rows
        self._pool = pool
        self._index = index
        self._sql = rows.sql

    async def companies(self, model: str, dims: int | None, fingerprint: str, now: datetime) -> list[str]:
        records = await self._pool.fetch(self._sql["fill_companies"], now, model, dims, fingerprint)
        return [r["company"] for r in records]

    async def backlog(self, model: str, dims: int | None, fingerprint: str, now: datetime) -> int:
        return int(await self._pool.fetchval(self._sql["fill_backlog"], now, model, dims, fingerprint))

    async def seats(self, company: str, model: str, dims: int | None, fingerprint: str, now: datetime) -> list[str]:
        seat = self._rows.seat_column
        records = await self._pool.fetch(
            self._sql["fill_seats"],
            now,
            model,
            dims,
            fingerprint,
            company,
        )
        return [r[seat] for r in records]

    async def pending(
        self, company: str, seat: str, model: str, dims: int | None, fingerprint: str, now: datetime, limit: int
    ) -> list[FillRow]:
        rows = self._rows
        records = await self._pool.fetch(
            self._sql["fill_pending"],
            now,
            model,
            dims,
            fingerprint,
            company,
            seat,
            limit,
        )
        return [FillRow(r["id"], company, seat, rows.text(r), bool(r["alone"])) for r in records]

    async def store_vector(self, row: FillRow, vector: Vector) -> None:
        rows = self._rows
        record = await self._pool.fetchrow(
            self._sql["store_vector"],
            row.id,
            vector.values.astype(np.float32),
            vector.model,
            vector.dimensions,
            row.text,
        )
        if record is None:
            return  # deleted (or rewritten) meanwhile
        try:
            await self._index.upsert(
                collection_name(rows.collection_base, vector.dimensions),
                [rows.point(record, vector.values, vector.model)],
            )
        except IndexUnavailable as err:
            _log.warning("filled %s row %s waits for the index: %s", rows.name, row.id, err)
            return
        await _set_indexed(self._pool, rows, [row.id])

    async def hold(self, row: FillRow, until: datetime, fingerprint: str, alone: bool) -> None:
        await self._pool.execute(
            self._sql["hold"],
            row.id,
            until,
            fingerprint,
            alone,
        )
