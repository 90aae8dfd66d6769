"""Events: rows in the ``events`` table plus a span event on the current trace (the kind and the
payload's ids, counts and states only: :data:`SPAN_PAYLOAD_KEYS`).

Publishing is best-effort (spec: "Best-effort rule"): a failure is logged once per kind and
swallowed, so measurement never breaks the path it measures. Use :meth:`EventLog.emit_strict`
where a failed write must itself be reported (the caller announces it).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping
from datetime import datetime
from typing import Any, Protocol, TypeVar

import asyncpg
from opentelemetry import trace

from libs.common.clock import Clock, SystemClock
from libs.common.db import refused_by_server

__all__ = [
    "SPAN_PAYLOAD_KEYS",
    "Bookkeeping",
    "EventLog",
    "EventSink",
    "PostgresEventLog",
    "bookkeeping",
    "current_bookkeeping",
    "held_events",
    "write_bookkeeping",
]

_log = logging.getLogger(__name__)


_EventRow = tuple[datetime, str, str | None, str | None, str | None, str | None, str | None, str]
"""An event_log row: time, kind, company, seat, turn id, trace id, span id, payload (JSON)."""


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


def _trace_and_span_ids() -> tuple[str | None, str | None]:
    """The current span's trace id and span id (hex), the event's place in the trace: a
    ``skill_used`` is correlated to the host turn by both (spec), the span being the call that
    resolved the skill."""
    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return None, None
    return format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")


_READ_EVENTS = """SELECT kind, company, seat, turn_id, trace_id, span_id, payload FROM events
                  WHERE ($1::text IS NULL OR kind = $1) AND ($2::text IS NULL OR company = $2) ORDER BY id"""
_BOOKKEEPING_ALONE = "WITH {ctes} SELECT 1"
"""A batch written on its own: its common table expressions (below) and nothing else."""
_INSERT_EVENT = """INSERT INTO events (time, kind, company, seat, turn_id, trace_id, span_id, payload)
                   VALUES ($1, $2, $3, $4, $5, $6, $7, $8::jsonb)"""
# A request's bookkeeping as common table expressions of ONE statement (with the writer's own
# statement as its main query, or ``SELECT 1``): one round trip and one commit for all of it. The
# placeholders ({}) are the positions of the array parameters. Charges are summed per key first (an
# upsert may not touch a row twice) and sorted, so two requests charging the same company take its
# row's lock in the same order and cannot deadlock. ``{when}``: nothing, or a WHERE clause that
# writes the rows only with the statement's own write (``held_events``).
_EVENTS_CTE = """bookkeeping_events AS (
    INSERT INTO events (time, kind, company, seat, turn_id, trace_id, span_id, payload)
    SELECT t, k, c, s, tu, tr, sp, p::jsonb
    FROM unnest(${}::timestamptz[], ${}::text[], ${}::text[], ${}::text[], ${}::text[], ${}::text[], ${}::text[],
                ${}::text[])
         AS u(t, k, c, s, tu, tr, sp, p){when})"""
_CHARGES_CTE = """bookkeeping_charges AS (
    INSERT INTO token_spend (company, seat, window_start, tokens)
    SELECT * FROM unnest(${}::text[], ${}::text[], ${}::timestamptz[], ${}::bigint[]) AS u(c, s, w, n){when}
    ON CONFLICT (company, seat, window_start) DO UPDATE SET tokens = token_spend.tokens + EXCLUDED.tokens)"""


def _ctes(
    events: list[_EventRow], charges: dict[tuple[str, str, datetime], int], first: int, when: str
) -> tuple[list[str], list[Any]]:
    ctes: list[str] = []
    args: list[Any] = []
    if events:
        ctes.append(_EVENTS_CTE.format(*range(first, first + 8), when=when))
        args += [list(column) for column in zip(*events, strict=True)]
    if charges:
        keys = sorted(charges)
        at = first + len(args)
        ctes.append(_CHARGES_CTE.format(*range(at, at + 4), when=when))
        args += [[k[0] for k in keys], [k[1] for k in keys], [k[2] for k in keys], [charges[k] for k in keys]]
    return ctes, args


def _row(
    kind: str, at: datetime, company: str | None, seat: str | None, turn_id: str | None, payload: dict[str, Any]
) -> _EventRow:
    return (at, kind, company, seat, turn_id, *_trace_and_span_ids(), json.dumps(payload, default=str))


SPAN_PAYLOAD_KEYS = frozenset(
    {
        # ids
        "check_id", "episode_id", "erasure_id", "page_id", "profile_id", "proposal_id", "row",
        "session_id", "skill_id", "skill_ids",
        # states, kinds and enums
        "backend", "cause", "classification", "container_key", "created", "embedding_model",
        "embedding_skipped_reason", "episode_kind", "erasure_kind", "failure", "gate", "line", "model",
        "origin", "outcome", "provider", "purpose", "role", "source", "stage", "state", "superseded",
        "trigger", "trigger_requires_recon", "turn_embedding", "unit", "workers", "write", "written",
        # counts and times
        "attempts", "block_count", "cap", "completion_tokens", "counterparty_blocks",
        "counterparty_bytes", "counts", "distinct_agents", "evicted", "hits", "interactions",
        "max_raw_episodes", "members", "next_attempt_time", "observation_count", "partial_failures",
        "paused_until", "prompt_tokens", "raw_episodes", "relevant_knowledge_selection_count",
        "seats_failed", "sibling_count", "tool_calls", "ttl_until",
    }
)  # fmt: skip
"""The payload keys an event copies onto the current span: ids, counts, states and enums only.

A span leaves the process (an exporter, a tracing backend) where no erasure reaches it, so what may
quote or name a person — a turn's label, a search's query, a profile's subject, a failure's text, a
skill's or page's name, a reviewer — stays in the event's row (which an erasure reaches) and off the
span. A key not listed here is left off: a new payload key is private until someone lists it."""
_SPAN_KEY_SUFFIXES = ("_hit", "_bytes")
"""``prefetch_summary``'s per-block flags and sizes (``skills_hit``, ``personal_memory_bytes``)."""


def span_attributes(payload: Mapping[str, Any]) -> dict[str, str]:
    """The part of an event's payload its span event carries (:data:`SPAN_PAYLOAD_KEYS`)."""
    return {
        k: str(v)
        for k, v in payload.items()
        if v is not None and (k in SPAN_PAYLOAD_KEYS or k.endswith(_SPAN_KEY_SUFFIXES))
    }


def _on_span(kind: str, payload: dict[str, Any]) -> None:
    span = trace.get_current_span()
    if span.is_recording():
        span.add_event(kind, span_attributes(payload))


class Bookkeeping:
    """The bookkeeping rows of one request — best-effort events (``EventLog.emit``) and the token
    charges of its auxiliary calls (``BudgetLedger.charge``) — held while the request runs and
    written together by :meth:`write` in the caller's transaction: one multi-row insert each and
    one commit, instead of a statement and a commit per row on the request's path. Every row keeps
    the time, trace and window it had when it was recorded. A row recorded after the batch was
    written (a detached task finishing late) is written on its own, as without a batch."""

    def __init__(self) -> None:
        self.events: list[_EventRow] = []
        self.charges: dict[tuple[str, str, datetime], int] = {}
        self.closed = False
        self.followers: list[asyncio.Future[Any]] = []
        """Writes the request started and let run beside it (a use stamped on another service):
        its writer waits for them with the batch, so they land before the request answers."""
        self.announced: list[tuple[_EventRow, dict[str, Any]]] = []
        """Events announcing the write this batch is about to ride on (:meth:`announce`): written by
        that write's statement only when it moves (:func:`held_events`), never alone."""

    def follow(self, write: asyncio.Future[Any]) -> None:
        self.followers.append(write)

    def __len__(self) -> int:
        return len(self.events) + len(self.charges)

    def charge(self, company: str, seat: str, window_start: datetime, tokens: int) -> None:
        """``tokens`` on the seat's and the company's counters of that window."""
        for key in ((company, seat, window_start), (company, "", window_start)):
            self.charges[key] = self.charges.get(key, 0) + tokens

    def announce(
        self,
        kind: str,
        at: datetime,
        *,
        company: str | None = None,
        seat: str | None = None,
        turn_id: str | None = None,
        **payload: Any,
    ) -> None:
        """Hold an event that announces the write the batch rides on next (a turn queued, a pass
        closed): that write's statement inserts it only if the write moves (:func:`held_events`), so
        it is written exactly when the write is, with no statement of its own. One the write does not
        take (an in-memory store, a combined statement that failed) is left for :meth:`withdraw`."""
        self.announced.append((_row(kind, at, company, seat, turn_id, payload), payload))

    def withdraw(self) -> bool:
        """Drop the announcements still held; True if there were any: the write did not carry them,
        so the announcer emits them itself (``EventLog.emit``, best-effort) if the write moved."""
        pending = bool(self.announced)
        self.announced.clear()
        return pending

    def settle(self, written: bool) -> None:
        """After the statement that took the batch (:func:`held_events`): ``written``, every row held
        went in with the write (the announcements also become events on the span); else nothing did
        (the write did not move): the batch opens again and keeps its rows for its own writer, and
        the announcements are dropped (what they announce did not happen)."""
        if written:
            for row, payload in self.announced:
                _on_span(row[1], payload)
            self.events.clear()
            self.charges.clear()
        else:
            self.closed = False
        self.announced.clear()

    def reopen(self) -> None:
        """The statement that took the batch failed: nothing in it was written; the batch keeps its
        rows (and its announcements, for :meth:`withdraw`) and takes new ones again."""
        self.closed = False

    def abandon(self) -> None:
        """The statement that took the batch has an outcome unknown here (the connection lost, the
        caller cancelled, after the server may have committed): its rows are dropped, so they are
        written at most once, as :func:`write_bookkeeping` writes (it never retries either)."""
        self.events.clear()
        self.charges.clear()
        self.closed = False

    def ctes(self, first: int) -> tuple[list[str], list[Any]]:
        """The rows held as common table expressions for the writer's statement, their parameters
        numbered from ``$first``. Closes the batch: a row recorded later is written alone."""
        self.closed = True
        return _ctes(self.events, self.charges, first, "")

    async def write(self, conn: asyncpg.Connection | asyncpg.Pool) -> None:
        """Write every row held in one statement (its own transaction, or the caller's)."""
        ctes, args = self.ctes(1)
        if ctes:
            await conn.execute(_BOOKKEEPING_ALONE.format(ctes=", ".join(ctes)), *args)


def held_events(batch: Bookkeeping, first: int, when: str) -> tuple[str, list[Any]]:
    """``batch``'s rows — its held events and charges and its announcements — as common table
    expressions (joined, each led by a comma) for a writer's statement, each row inserted only
    ``when`` (an SQL condition on the statement's own expressions: "the write moved"); their
    parameters numbered from ``$first``. One statement and one commit for the write and its
    bookkeeping; a write that does not move writes none of it. Closes the batch; the writer then
    calls :meth:`Bookkeeping.settle` (or :meth:`Bookkeeping.reopen` should the statement fail)."""
    batch.closed = True
    ctes, args = _ctes(batch.events + [row for row, _ in batch.announced], batch.charges, first, f" WHERE {when}")
    return "".join(f",\n    {cte}" for cte in ctes), args


_T = TypeVar("_T")


async def written_together(batch: Bookkeeping, write: Callable[[], Awaitable[_T]], what: str) -> tuple[bool, _T | None]:
    """Run ``write``, a statement carrying ``batch``'s rows (``held_events``): (True, its result).
    (False, None) when PostgreSQL refused it (rolled back, nothing written): the batch is open
    again and the caller writes its row alone, the bookkeeping following on its own, best-effort
    (``write_bookkeeping``, ``EventLog.emit``). A lost connection or a cancellation raises, as the
    write alone would; whether the rows went in is unknown, so they are dropped: at most once.
    ``what`` names the write in the log line. Every writer that carries its bookkeeping in its own
    statement (the reflector's moves, an episode's insert and supersede) goes through here."""
    try:
        return True, await write()
    except BaseException as err:
        # A lost connection is a PostgresError too, but its outcome is unknown: refused only when
        # the server answered the statement with an error.
        if not refused_by_server(err):
            batch.abandon()
            raise
        batch.reopen()
        _log.warning("%s and its bookkeeping not written together (%s); writing them apart", what, err)
        return False, None


async def write_bookkeeping(pool: asyncpg.Pool, batch: Bookkeeping) -> None:
    """Write ``batch`` in a transaction of its own, best-effort (spec "Best-effort rule": a failure
    is logged and swallowed; the path it measures goes on)."""
    if not len(batch):
        batch.closed = True
        return
    try:
        await batch.write(pool)
    except Exception as exc:
        _log.warning("bookkeeping of a request not recorded (%d rows): %s", len(batch), exc)


_batch: contextvars.ContextVar[Bookkeeping | None] = contextvars.ContextVar("agentlearn_bookkeeping", default=None)


def current_bookkeeping() -> Bookkeeping | None:
    """The open batch of the request being served (None: write at once)."""
    batch = _batch.get()
    return batch if batch is not None and not batch.closed else None


@contextlib.contextmanager
def bookkeeping() -> Iterator[Bookkeeping]:
    """Hold this request's bookkeeping rows (tasks it starts inherit the batch, and so do the
    services it calls in-process) until the caller writes them with :meth:`Bookkeeping.write`."""
    batch = Bookkeeping()
    token = _batch.set(batch)
    try:
        yield batch
    finally:
        _batch.reset(token)


class PostgresEventLog:
    def __init__(self, pool: asyncpg.Pool, clock: Clock | None = None):
        self._pool = pool
        self._clock = clock or SystemClock()
        self._warned: set[str] = set()

    def _event_row(
        self, kind: str, company: str | None, seat: str | None, turn_id: str | None, payload: dict[str, Any]
    ) -> _EventRow:
        """The event as the request's span records it (an event on the span) and as its row is
        inserted, whether now (:meth:`emit_strict`) or with the request's bookkeeping."""
        _on_span(kind, payload)
        return _row(kind, self._clock.now(), company, seat, turn_id, payload)

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
        args = self._event_row(kind, company, seat, turn_id, payload)
        if conn is not None:
            await conn.execute(_INSERT_EVENT, *args)
        else:
            await self._pool.execute(_INSERT_EVENT, *args)

    async def emit(
        self,
        kind: str,
        *,
        company: str | None = None,
        seat: str | None = None,
        turn_id: str | None = None,
        **payload: Any,
    ) -> None:
        batch = current_bookkeeping()
        if batch is not None:
            # Held for the request's one bookkeeping transaction; a failure of that write is
            # logged by its writer, as this one would be.
            batch.events.append(self._event_row(kind, company, seat, turn_id, payload))
            return
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
    rows = await pool.fetch(_READ_EVENTS, kind, company)
    return [{**dict(r), "payload": json.loads(r["payload"])} for r in rows]
