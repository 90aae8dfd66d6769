"""PostgreSQL store of ``knowledge_pages``: named queries, ``$n`` parameters, driver errors kept inside.

Every search read is scoped to one company and a list of containers, and carries the auto-draft
exclusion itself (``_VISIBLE``): a page under the Auto-Drafted Skills parent, the parent page
itself, and any page titled ``[Auto-draft]…`` never leave the store through a search, whichever
half found it. Reads by id (``get``) and listings return drafts only when asked; the service
decides who may ask (an operator).
"""

from __future__ import annotations

import builtins
import json
import re
import uuid
from collections.abc import Sequence

import asyncpg
import numpy as np

from libs.common.db import as_array
from libs.common.errors import AlreadyExists, InvalidArgument
from libs.common.rows import Conversions, RowReader
from services.knowledge.domain import (
    AUTO_DRAFT_TITLE_PREFIX,
    AUTO_DRAFTED_PARENT,
    DOMAIN,
    ONBOARDING_PARENT,
    DraftOrigin,
    Page,
    PageQuery,
    ServedMode,
)
from services.knowledge.ports import PageWrite, VectorHits

__all__ = ["SQL", "PostgresDraftProvenance", "PostgresPageStore", "StoreUnavailable", "body_too_large_error"]


class StoreUnavailable(Exception):
    """The pages could not be read (connection refused, pool closed, query timed out)."""


TSVECTOR_MAX_BYTES = 1_048_575
"""PostgreSQL's bound on one tsvector (its lexemes and their positions), which the generated
``tsv`` column must fit: a body within ``Limits.body_chars`` of many distinct words can pass it."""

_TSVECTOR_TOO_LONG = re.compile(r"too long for tsvector \((\d+) bytes, max (\d+) bytes\)")


def body_too_large_error(message: str) -> InvalidArgument:
    """The refusal of a body whose words do not fit the page's full-text index: Postgres's
    ``string is too long for tsvector (N bytes, max M bytes)``, said as the caller's ``body``."""
    sizes = _TSVECTOR_TOO_LONG.search(message)
    size, limit = (int(sizes[1]), int(sizes[2])) if sizes else (None, TSVECTOR_MAX_BYTES)
    measured = f" ({size:,} bytes)" if size is not None else ""
    return InvalidArgument.of_field(
        "body",
        "BODY_TOO_LARGE",
        f"body has too many distinct words for the full-text index: its words and their positions"
        f"{measured} pass the index's limit of {limit:,} bytes; split the page into smaller pages",
        domain=DOMAIN,
        limit_bytes=limit,
        **({"size_bytes": size} if size is not None else {}),
    )


def _literal(text: str) -> str:
    assert "'" not in text and "\\" not in text
    return f"'{text}'"


_COLUMNS = """p.id, p.company, p.container, p.title, p.body, p.parent_titles, p.create_time, p.update_time,
              p.embedding_model, p.embedding_dims"""
# Case- and blank-insensitive on purpose: fail closed on a parent typed "auto-drafted skills ".
_VISIBLE = f"""
    NOT EXISTS (SELECT 1 FROM unnest(p.parent_titles) AS a(t)
                WHERE lower(btrim(a.t)) = {_literal(AUTO_DRAFTED_PARENT.lower())})
    AND lower(btrim(p.title)) <> {_literal(AUTO_DRAFTED_PARENT.lower())}
    AND lower(ltrim(p.title)) NOT LIKE {_literal(AUTO_DRAFT_TITLE_PREFIX.lower() + "%")}"""
_SCOPE = "p.company = $1 AND p.container = ANY($2::text[])"
# The query's English lexemes OR-ed: a page matches when it shares any of them.
_ANY_LEXEME = (
    "(SELECT string_agg(quote_literal(l), ' | ')::tsquery "
    "FROM unnest(tsvector_to_array(to_tsvector('english', $3))) AS l)"
)
# A snippet around the first matches; a page matched by its vector alone opens with its first words.
_HEADLINE = (
    "ts_headline('english', p.body, {q}, "
    '\'StartSel="", StopSel="", MaxWords=35, MinWords=15, MaxFragments=2, FragmentDelimiter=" … "\')'
)

SQL = {
    "by_title": f"SELECT {_COLUMNS} FROM knowledge_pages p WHERE p.company = $1 AND p.container = $2 AND p.title = $3",
    "stored_vector": """SELECT embedding FROM knowledge_pages WHERE id = $1""",
    # Insert or replace by (company, container, title); xmax = 0 only on a row this statement inserted.
    "upsert": f"""
        INSERT INTO knowledge_pages AS p (id, company, container, title, body, parent_titles, create_time,
                                          update_time, embedding, embedding_model, embedding_dims, indexed)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $7, $8, $9, $10, false)
        ON CONFLICT (company, container, title) DO UPDATE
        SET body = EXCLUDED.body, parent_titles = EXCLUDED.parent_titles, update_time = EXCLUDED.update_time,
            embedding = EXCLUDED.embedding, embedding_model = EXCLUDED.embedding_model,
            embedding_dims = EXCLUDED.embedding_dims, indexed = false,
            fill_held_until = NULL, fill_held_fingerprint = NULL, fill_alone = false
        RETURNING {_COLUMNS}, (xmax = 0) AS created""",
    "get": f"SELECT {_COLUMNS} FROM knowledge_pages p WHERE p.company = $1 AND p.id = $2",
    # The lexical half, IDF-weighted as the diary's: a page matches when it shares any English
    # lexeme with the query, ranked by the summed inverse document frequency (over the matched
    # pages in scope) of the lexemes it shares, a lexeme found in the title counting half again.
    "lexical": f"""
        WITH q AS (
            SELECT lexeme, quote_literal(lexeme)::tsquery AS lq, (quote_literal(lexeme) || ':A')::tsquery AS lqa
            FROM unnest(tsvector_to_array(to_tsvector('english', $3))) AS lexeme),
        m AS MATERIALIZED (
            SELECT p.id, p.tsv FROM knowledge_pages p
            WHERE {_SCOPE} AND {_VISIBLE}
              AND p.tsv @@ (SELECT string_agg(quote_literal(lexeme), ' | ')::tsquery FROM q)),
        n AS MATERIALIZED (SELECT count(*)::float8 AS n FROM m),
        w AS MATERIALIZED (
            SELECT q.lq, q.lqa, ln(1 + (n.n - count(*) + 0.5) / (count(*) + 0.5)) AS idf
            FROM q JOIN m ON m.tsv @@ q.lq, n
            GROUP BY q.lexeme, q.lq, q.lqa, n.n),
        s AS (
            SELECT m.id, sum(w.idf) + 0.5 * coalesce(sum(w.idf) FILTER (WHERE m.tsv @@ w.lqa), 0) AS rank
            FROM m JOIN w ON m.tsv @@ w.lq GROUP BY m.id)
        SELECT {_COLUMNS}, s.rank, {_HEADLINE.format(q=_ANY_LEXEME)} AS snippet
        FROM s JOIN knowledge_pages p ON p.id = s.id
        ORDER BY s.rank DESC, p.update_time DESC, p.id LIMIT $4""",
    # Vector hits from the index, re-read in scope (a stale or foreign point is simply not found)
    # and only while the page still holds a vector of the query's model; with, in the same round
    # trip, the count of searchable pages of the scope with a vector of the query's model and width
    # ($6) the index does not hold yet (written while it was down: the index's answer misses them,
    # so the exact scan answers instead). The count reads the partial index of unindexed pages,
    # empty while the index keeps up. It is on every row; the LEFT JOIN keeps one row (with a NULL
    # id) when no hit is found.
    "hydrate": f"""
        SELECT u.unindexed, h.* FROM (
            SELECT count(*) AS unindexed FROM knowledge_pages p
            WHERE {_SCOPE} AND p.embedding IS NOT NULL AND NOT p.indexed
              AND p.embedding_model = $5 AND p.embedding_dims = $6::int AND {_VISIBLE}) AS u
        LEFT JOIN LATERAL (
            SELECT {_COLUMNS}, {_HEADLINE.format(q=_ANY_LEXEME)} AS snippet
            FROM knowledge_pages p
            WHERE {_SCOPE} AND {_VISIBLE} AND p.id = ANY($4::uuid[])
              AND p.embedding IS NOT NULL AND p.embedding_model = $5) AS h ON true""",
    # The exact scan that answers when the index cannot.
    "exact": f"""
        SELECT {_COLUMNS}, 1 - (p.embedding <=> $5) AS similarity, {_HEADLINE.format(q=_ANY_LEXEME)} AS snippet
        FROM knowledge_pages p
        WHERE {_SCOPE} AND {_VISIBLE}
          AND p.embedding IS NOT NULL AND p.embedding_model = $6 AND p.embedding_dims = $7
        ORDER BY p.embedding <=> $5 LIMIT $4""",
    # Onboarding pages of the named containers: under an "Onboarding" page, or titled "Onboarding…".
    "onboarding": f"""
        SELECT {_COLUMNS}, array_position($2::text[], p.container) AS chain_pos
        FROM knowledge_pages p
        WHERE {_SCOPE} AND {_VISIBLE}
          AND (EXISTS (SELECT 1 FROM unnest(p.parent_titles) AS a(t)
                       WHERE lower(btrim(a.t)) = {_literal(ONBOARDING_PARENT.lower())})
               OR lower(ltrim(p.title)) LIKE {_literal(ONBOARDING_PARENT.lower() + "%")})
        ORDER BY chain_pos, array_length(p.parent_titles, 1) NULLS FIRST, p.title, p.id
        LIMIT $3""",
    # A listing, in (container, title, id) order after the cursor; the body only when asked.
    "list": f"""
        SELECT p.id, p.company, p.container, p.title,
               CASE WHEN $9 THEN p.body ELSE '' END AS body,
               p.parent_titles, p.create_time, p.update_time, p.embedding_model, p.embedding_dims
        FROM knowledge_pages p
        WHERE p.company = $1
          AND ($2::text[] IS NULL OR p.container = ANY($2::text[]))
          AND ($3::text IS NULL OR (cardinality(p.parent_titles) > 0
               AND lower(btrim(p.parent_titles[cardinality(p.parent_titles)])) = lower(btrim($3))))
          AND ($4 OR ({_VISIBLE}))
          AND ($5::text IS NULL OR (p.container, p.title, p.id) > ($5::text, $6::text, $7::uuid))
        ORDER BY p.container, p.title, p.id
        LIMIT $8""",
    # The vector fill and the index.
    "set_indexed": "UPDATE knowledge_pages SET indexed = true WHERE id = ANY($1)",
}

_WS = re.compile(r"\s+")


_PAGE_COLUMNS: Conversions = {"id": str, "parent_titles": lambda v: tuple(v or ())}
# A page read from this store is served by the native backend, whatever the row says.
_READ_PAGE = RowReader(Page, _PAGE_COLUMNS, computed={"backend": lambda _row: ServedMode.NATIVE})


def _page(row: asyncpg.Record) -> Page:
    return _READ_PAGE(row)


def one_line(text: str | None, limit: int = 400) -> str:
    """A snippet as one line of at most ``limit`` characters (cut between words)."""
    flat = _WS.sub(" ", text or "").strip()
    if len(flat) <= limit:
        return flat
    cut = flat[:limit].rsplit(" ", 1)[0]
    return cut + " …"


class PostgresPageStore:
    """Pages in PostgreSQL. Search reads raise :class:`StoreUnavailable` when the database cannot
    be read; no asyncpg exception leaves a search read."""

    def __init__(self, pool: asyncpg.Pool):
        self.pool = pool

    async def _fetch(self, name: str, *args: object) -> list[asyncpg.Record]:
        try:
            rows: list[asyncpg.Record] = await self.pool.fetch(SQL[name], *args)
            return rows
        except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, TimeoutError) as err:
            raise StoreUnavailable(f"{type(err).__name__}: {err}") from err

    # ------------------------------------------------------------------ writes and reads by key

    async def by_title(self, company: str, container: str, title: str) -> Page | None:
        row = await self.pool.fetchrow(SQL["by_title"], company, container, title)
        return _page(row) if row else None

    async def stored_vector(self, page_id: uuid.UUID) -> np.ndarray | None:
        value = await self.pool.fetchval(SQL["stored_vector"], page_id)
        return None if value is None else as_array(value)

    async def upsert(self, write: PageWrite) -> tuple[Page, bool]:
        """Raises :func:`body_too_large_error` (nothing stored) when the body's words do not fit
        the generated full-text column: only Postgres knows the tsvector's size, so it is caught
        here rather than guessed from the body; ``AlreadyExists`` (``PAGE_ID_TAKEN``) when the id a
        caller asked for is another page's."""
        vector = write.vector
        args = (
            write.page_id,
            write.company,
            write.container,
            write.title,
            write.body,
            list(write.parent_titles),
            write.now,
            None if vector is None else vector.astype(np.float32),
            write.model if vector is not None else None,
            int(vector.shape[0]) if vector is not None else None,
        )
        for attempt in (1, 2):
            try:
                row = await self.pool.fetchrow(SQL["upsert"], *args)
                break
            except asyncpg.ProgramLimitExceededError as err:
                if "tsvector" not in str(err):
                    raise
                raise body_too_large_error(str(err)) from None
            except asyncpg.UniqueViolationError as err:
                if err.constraint_name != "knowledge_pages_pkey":
                    raise
                # Two writers of one page asking for the same id (a workspace lesson written by two
                # checks at once) race past the title's conflict check and meet on the id: the
                # second, tried again, finds the first's page by its title and replaces it. An id
                # still taken then is another page's.
                if attempt == 1:
                    continue
                raise AlreadyExists.of_field(
                    "page_id",
                    "PAGE_ID_TAKEN",
                    f"page_id {write.page_id} is another page's",
                    domain=DOMAIN,
                    page_id=str(write.page_id),
                ) from None
        assert row is not None
        return _page(row), bool(row["created"])

    async def get(self, company: str, page_id: uuid.UUID) -> Page | None:
        """Raises :class:`StoreUnavailable` when the pages cannot be read."""
        rows = await self._fetch("get", company, page_id)
        return _page(rows[0]) if rows else None

    async def list(
        self, company: str, query: PageQuery, after: tuple[str, str, uuid.UUID] | None, limit: int
    ) -> list[Page]:
        """``query``'s pages in (container, title, id) order after ``after``; ``containers`` None: all."""
        a = after or (None, None, None)
        containers = query.containers
        rows = await self._fetch(
            "list",
            company,
            None if containers is None else list(containers),
            query.parent_title,
            query.include_drafts,
            a[0],
            a[1],
            a[2],
            limit,
            query.with_body,
        )
        return [_page(r) for r in rows]

    # ------------------------------------------------------------------ search reads

    async def lexical(
        self, company: str, containers: Sequence[str], query: str, limit: int
    ) -> builtins.list[tuple[Page, float, str]]:
        rows = await self._fetch("lexical", company, list(containers), query, limit)
        return [(_page(r), float(r["rank"]), one_line(r["snippet"])) for r in rows]

    async def hydrate(
        self, company: str, containers: Sequence[str], query: str, ids: Sequence[uuid.UUID], model: str, dims: int
    ) -> VectorHits:
        rows = await self._fetch("hydrate", company, list(containers), query, list(ids), model, dims)
        pages = {r["id"]: (_page(r), one_line(r["snippet"])) for r in rows if r["id"] is not None}
        return VectorHits(pages, int(rows[0]["unindexed"]) if rows else 0)

    async def exact(
        self, company: str, containers: Sequence[str], query: str, vector: np.ndarray, model: str, limit: int
    ) -> builtins.list[tuple[Page, float, str]]:
        rows = await self._fetch(
            "exact",
            company,
            list(containers),
            query,
            limit,
            vector.astype(np.float32),
            model,
            int(vector.shape[0]),
        )
        return [(_page(r), float(r["similarity"]), one_line(r["snippet"])) for r in rows]

    async def onboarding(self, company: str, containers: Sequence[str], limit: int) -> builtins.list[Page]:
        return [_page(r) for r in await self._fetch("onboarding", company, list(containers), limit)]

    # ------------------------------------------------------------------ the index's bookkeeping

    async def set_indexed(self, ids: Sequence[uuid.UUID]) -> None:
        if ids:
            await self.pool.execute(SQL["set_indexed"], list(ids))


_DRAFT_SQL = {
    # A draft filed again under the same page (a lead deleted it and the team converged again)
    # names its newest sources.
    "record": """
        INSERT INTO draft_provenance (company, page_id, backend, container, title, unit, seats, turn_ids, sources,
                                      provenance, record_time)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9::jsonb, $10::jsonb, $11)
        ON CONFLICT (company, page_id) DO UPDATE
        SET backend = EXCLUDED.backend, container = EXCLUDED.container, title = EXCLUDED.title, unit = EXCLUDED.unit,
            seats = EXCLUDED.seats, turn_ids = EXCLUDED.turn_ids, sources = EXCLUDED.sources,
            provenance = EXCLUDED.provenance, record_time = EXCLUDED.record_time""",
    "get": """
        SELECT company, page_id, backend, container, title, unit, seats, turn_ids, sources, provenance, record_time
        FROM draft_provenance WHERE company = $1 AND page_id = $2""",
    # The newest filing of a unit's convergence: under one of its titles, or resting on its runs.
    "prior": """
        SELECT company, page_id, backend, container, title, unit, seats, turn_ids, sources, provenance, record_time
        FROM draft_provenance
        WHERE company = $1 AND container = $2 AND unit = $3 AND (title = ANY($4::text[]) OR turn_ids && $5::text[])
        ORDER BY record_time DESC, page_id LIMIT 1""",
}


def _draft_sources(value: str | list[dict[str, str]]) -> tuple[tuple[str, str], ...]:
    sources = json.loads(value) if isinstance(value, str) else list(value)
    return tuple((s["seat"], s["turn_id"]) for s in sources)


_READ_DRAFT_ORIGIN = RowReader(
    DraftOrigin,
    {
        "sources": _draft_sources,
        # jsonb arrives decoded or as text, depending on the pool's codecs.
        "provenance": lambda v: v if isinstance(v, str) else json.dumps(v),
    },
)


class PostgresDraftProvenance:
    """The ``draft_provenance`` rows (issue 17): where each promotion draft came from."""

    def __init__(self, pool: asyncpg.Pool):
        self.pool = pool

    async def record(self, origin: DraftOrigin) -> None:
        """Keep a written draft's sources ((seat, run id) of each run) and provenance."""
        sources = origin.sources
        await self.pool.execute(
            _DRAFT_SQL["record"],
            origin.company,
            origin.page_id,
            origin.backend,
            origin.container,
            origin.title,
            origin.unit,
            sorted({seat for seat, _ in sources}),
            [turn for _, turn in sources],
            json.dumps([{"seat": seat, "turn_id": turn} for seat, turn in sources]),
            origin.provenance,
            origin.record_time,
        )

    async def get(self, company: str, page_id: str) -> DraftOrigin | None:
        row = await self.pool.fetchrow(_DRAFT_SQL["get"], company, page_id)
        return None if row is None else _READ_DRAFT_ORIGIN(row)

    async def prior(
        self, company: str, container: str, unit: str, titles: Sequence[str], run_ids: Sequence[str]
    ) -> DraftOrigin | None:
        """The newest record of a draft the unit filed in ``container`` under one of ``titles`` or
        resting on one of ``run_ids``, whether or not its page is still there (a lead rejects a
        draft by deleting it; the record stays unless an erasure took it)."""
        row = await self.pool.fetchrow(_DRAFT_SQL["prior"], company, container, unit, list(titles), list(run_ids))
        return None if row is None else _READ_DRAFT_ORIGIN(row)
