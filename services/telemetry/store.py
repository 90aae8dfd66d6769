"""PostgreSQL reads of the shared ``events`` table: named queries, ``$n`` parameters, every one
scoped to one company. The aggregations run in the database (one row per day and block, per day
and purpose, per seat), so a chart never pages through raw events.

Payloads are written by our own services, but a reader must not fail on a row another version
wrote differently: a block list that is not a list, a token count that is not a number, reads as
nothing rather than as an error.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import asyncpg

from libs.common.rows import RowReader
from services.telemetry.domain import (
    AUXILIARY_SPEND,
    PREFETCH_SUMMARY,
    TURN_COMPLETED,
    BlockTotal,
    Day,
    Event,
    PurposeTotal,
    SeatActivity,
)

__all__ = ["SQL", "PostgresEventReader"]

_DAY = "(date_trunc('day', {t} AT TIME ZONE 'UTC') AT TIME ZONE 'UTC')"


def _tokens(key: str) -> str:
    """A token count of an auxiliary_spend payload, 0 when it is not a plain number."""
    return f"CASE WHEN payload->>'{key}' ~ '^[0-9]{{1,15}}$' THEN (payload->>'{key}')::bigint ELSE 0 END"


_IN_WINDOW = "time >= $3 AND time < $4"
# A company's seats matching the query text, or only the one seat a bound credential may see
# ({only}: the parameter number it takes in each query).
_SEAT_MATCH = (
    "company = $1 AND seat IS NOT NULL AND seat <> '' AND ($2::text = '' OR strpos(lower(seat), lower($2)) > 0)"
    " AND ({only}::text IS NULL OR seat = {only})"
)

SQL = {
    # One row per (UTC day, block): turns whose summary listed the block, and those it hit in. A
    # turn lists a block once (the counterparty block once per counterparty: counted once per turn).
    "hit_rates": f"""
        SELECT {_DAY.format(t="e.time")} AS day,
               b.value->>'block' AS block,
               count(DISTINCT e.id) AS turns,
               count(DISTINCT e.id) FILTER (WHERE b.value->>'hit' = 'true') AS hits
        FROM events e
        CROSS JOIN LATERAL jsonb_array_elements(
            CASE WHEN jsonb_typeof(e.payload->'blocks') = 'array' THEN e.payload->'blocks' ELSE '[]'::jsonb END
        ) AS b(value)
        WHERE e.company = $1 AND e.kind = '{PREFETCH_SUMMARY}' AND ($2::text IS NULL OR e.seat = $2)
          AND e.time >= $3 AND e.time < $4
          AND jsonb_typeof(b.value) = 'object' AND jsonb_typeof(b.value->'block') = 'string'
        GROUP BY 1, 2
        ORDER BY 1, 2""",
    "spend": f"""
        SELECT {_DAY.format(t="time")} AS day,
               coalesce(payload->>'purpose', '') AS purpose,
               count(*) AS calls,
               coalesce(sum({_tokens("prompt_tokens")}), 0)::bigint AS prompt_tokens,
               coalesce(sum({_tokens("completion_tokens")}), 0)::bigint AS completion_tokens
        FROM events
        WHERE company = $1 AND kind = '{AUXILIARY_SPEND}' AND ($2::text IS NULL OR seat = $2)
          AND {_IN_WINDOW}
        GROUP BY 1, 2
        ORDER BY 1, 2""",
    # Every seat with an event at any time (so a quiet seat is still listed), its counts the
    # window's; keyset-paged by handle.
    "seats": f"""
        SELECT seat,
               count(*) FILTER (WHERE {_IN_WINDOW}) AS events,
               count(*) FILTER (WHERE kind = '{TURN_COMPLETED}' AND {_IN_WINDOW}) AS turns,
               count(*) FILTER (WHERE kind = '{PREFETCH_SUMMARY}' AND {_IN_WINDOW}) AS prefetches,
               count(*) FILTER (WHERE kind = '{AUXILIARY_SPEND}' AND {_IN_WINDOW}) AS aux_calls,
               coalesce(sum({_tokens("prompt_tokens")} + {_tokens("completion_tokens")})
                        FILTER (WHERE kind = '{AUXILIARY_SPEND}' AND {_IN_WINDOW}), 0)::bigint AS aux_tokens,
               max(time) AS last_event_time
        FROM events
        WHERE {_SEAT_MATCH.format(only="$7")} AND ($5::text IS NULL OR seat > $5)
        GROUP BY seat
        ORDER BY seat
        LIMIT $6""",
    "seat_count": f"SELECT count(DISTINCT seat) FROM events WHERE {_SEAT_MATCH.format(only='$3')}",
    "events": """
        SELECT id, time, kind, company, seat, turn_id, trace_id, span_id, payload
        FROM events
        WHERE company = $1 AND ($2::text IS NULL OR seat = $2)
          AND (cardinality($3::text[]) = 0 OR kind = ANY($3::text[]))
          AND ($4::text IS NULL OR turn_id = $4)
          AND ($5::timestamptz IS NULL OR time >= $5) AND ($6::timestamptz IS NULL OR time < $6)
          AND ($7::timestamptz IS NULL OR (time, id) < ($7, $8))
        ORDER BY time DESC, id DESC
        LIMIT $9""",
}


def _payload(raw: object) -> dict[str, Any]:
    value = json.loads(raw) if isinstance(raw, str | bytes) else raw
    return value if isinstance(value, dict) else {"value": value}


_READ_EVENT = RowReader(Event, {"payload": _payload})


class PostgresEventReader:
    """Reads of ``events`` (common migration 0001; this service's 0001 adds its index)."""

    def __init__(self, pool: asyncpg.Pool):
        self.pool = pool

    async def hit_rates(self, company: str, seat: str | None, start: datetime, end: datetime) -> list[Day[BlockTotal]]:
        rows = await self.pool.fetch(SQL["hit_rates"], company, seat, start, end)
        return [Day(r["day"], BlockTotal(r["block"], r["turns"], r["hits"])) for r in rows]

    async def spend(self, company: str, seat: str | None, start: datetime, end: datetime) -> list[Day[PurposeTotal]]:
        rows = await self.pool.fetch(SQL["spend"], company, seat, start, end)
        return [
            Day(r["day"], PurposeTotal(r["purpose"], r["calls"], r["prompt_tokens"], r["completion_tokens"]))
            for r in rows
        ]

    async def seats(
        self,
        company: str,
        query: str,
        only: str | None,
        start: datetime,
        end: datetime,
        after: str | None,
        limit: int,
    ) -> list[SeatActivity]:
        rows = await self.pool.fetch(SQL["seats"], company, query, start, end, after, limit, only)
        return [
            SeatActivity(
                company=company,
                seat=r["seat"],
                events=r["events"],
                turns=r["turns"],
                prefetches=r["prefetches"],
                auxiliary_calls=r["aux_calls"],
                auxiliary_tokens=r["aux_tokens"],
                last_event_time=r["last_event_time"],
            )
            for r in rows
        ]

    async def seat_count(self, company: str, query: str, only: str | None) -> int:
        return int(await self.pool.fetchval(SQL["seat_count"], company, query, only))

    async def events(
        self,
        company: str,
        seat: str | None,
        kinds: Sequence[str],
        turn_id: str | None,
        start: datetime | None,
        end: datetime | None,
        after: tuple[datetime, int] | None,
        limit: int,
    ) -> list[Event]:
        after_time, after_id = after if after is not None else (None, None)
        rows = await self.pool.fetch(
            SQL["events"], company, seat, list(kinds), turn_id, start, end, after_time, after_id, limit
        )
        return [_READ_EVENT(r) for r in rows]
