"""Events: rows in the ``events`` table plus a span event on the current trace.

Publishing is best-effort (spec: "Best-effort rule"): a failure is logged once per kind and
swallowed, so measurement never breaks the path it measures. Use :meth:`EventLog.emit_strict`
where a failed write must itself be reported (the caller announces it).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any, Protocol

import asyncpg
from opentelemetry import trace

from libs.common.clock import Clock, SystemClock

__all__ = ["EventLog", "EventSink", "PostgresEventLog"]

_log = logging.getLogger(__name__)


class EventSink(Protocol):
    async def emit(
        self,
        kind: str,
        *,
        company: str | None = None,
        seat: str | None = None,
        turn_id: str | None = None,
        **payload: Any,
    ) -> None: ...


def _trace_id() -> str | None:
    ctx = trace.get_current_span().get_span_context()
    return format(ctx.trace_id, "032x") if ctx.is_valid else None


class PostgresEventLog:
    def __init__(self, pool: asyncpg.Pool, clock: Clock | None = None):
        self._pool = pool
        self._clock = clock or SystemClock()
        self._warned: set[str] = set()

    async def emit_strict(
        self,
        kind: str,
        *,
        company: str | None = None,
        seat: str | None = None,
        turn_id: str | None = None,
        conn: asyncpg.Connection | None = None,
        **payload: Any,
    ) -> None:
        span = trace.get_current_span()
        if span.is_recording():
            span.add_event(kind, {k: str(v) for k, v in payload.items() if v is not None})
        sql = """INSERT INTO events (time, kind, company, seat, turn_id, trace_id, payload)
                 VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb)"""
        args = (self._clock.now(), kind, company, seat, turn_id, _trace_id(), json.dumps(payload, default=str))
        if conn is not None:
            await conn.execute(sql, *args)
        else:
            await self._pool.execute(sql, *args)

    async def emit(
        self,
        kind: str,
        *,
        company: str | None = None,
        seat: str | None = None,
        turn_id: str | None = None,
        **payload: Any,
    ) -> None:
        try:
            await self.emit_strict(kind, company=company, seat=seat, turn_id=turn_id, **payload)
        except Exception as exc:
            if kind not in self._warned:
                self._warned.add(kind)
                _log.warning("event %s not recorded: %s", kind, exc)


EventLog = PostgresEventLog


async def read_events(
    pool: asyncpg.Pool, kind: str | None = None, *, company: str | None = None
) -> list[Mapping[str, Any]]:
    """Events in order of writing (tests and operators)."""
    rows = await pool.fetch(
        """SELECT kind, company, seat, turn_id, trace_id, payload FROM events
           WHERE ($1::text IS NULL OR kind = $1) AND ($2::text IS NULL OR company = $2) ORDER BY id""",
        kind,
        company,
    )
    return [{**dict(r), "payload": json.loads(r["payload"])} for r in rows]
