"""The vector fill: once a minute, embed the live rows that have no vector of the current model and
width (spec: "The holder fills what is missing"), shared by diary notes and episodes.

One minute, as :meth:`VectorFill.run_minute` runs it:

* It walks every company with rows to fill and, inside one, every seat in order starting at the
  seat where the previous minute ran out.
* What it may send is bounded by what it sends, refused requests included: ``requests_per_minute``
  requests for the deployment (every fill of every process on the database shares them, counted
  in Postgres by :class:`PostgresRequestLedger`: "sixteen requests a node" — on Kubernetes the
  diary, episode and knowledge fills are three pods), and
  ``company_bytes_per_minute`` bytes of text for the whole company, counted in a Postgres ledger
  every runner and row family shares. A budget that runs out ends the
  minute and the next starts at that seat.
* A rate limit, a timeout, an unreachable endpoint, a refused key or an unknown model ends the
  minute for every seat, not for one — and for every fill (the request ledger remembers it), so
  the episodes' fill does not keep sending in a minute the diary's fill was told "not now".
* A refused batch is split in halves until the row it refuses is alone; that row is held back an
  hour, then offered again alone.
* A vector with no direction costs only its row: held back an hour
  (``memory_fill_vector_unusable`` names it with its size), then offered again with its neighbours.
* A refusal that is the minute's first answer is judged by one plain word sent alone: refused
  too, the configuration is at fault (``memory_fill_configuration_refused``) and nothing is sent
  for an hour or until the provider's model, width, limits or endpoint change; accepted, the rows
  are, and they are isolated as above.
* Holds and the pause are stamped with the provider fingerprint; a change of any of the four
  releases them all at once.
* A row longer than a minute's byte budget (an episode's ask is bounded only by the event that
  carried it) is sent a request at a time across minutes; its embedded pieces are kept
  (``memory_fill_input_continued`` names the row and how many are in), a refused or direction-less
  piece holds the row with the pieces before it kept, so the retry resumes at that piece. Once a
  chunk of a long row is refused, its pieces go one per request, so the refused piece is found
  even when the refused chunk spent the minute's bytes.
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

import asyncpg
import numpy as np

from libs.common.clock import Clock
from libs.common.config import EmbeddingsConfig, FillConfig
from libs.common.db import as_array
from libs.common.embeddings import Embedder, EmbeddingError, Vector, pool, usable
from libs.common.events import EventSink
from libs.common.metrics import FILL_BACKLOG

if TYPE_CHECKING:
    from libs.common.infra import Infra

__all__ = [
    "FILL_SQL",
    "FillLedger",
    "FillReport",
    "FillRow",
    "FillSource",
    "FillState",
    "FillStore",
    "PostgresRequestLedger",
    "RequestBudget",
    "RequestLedger",
    "VectorFill",
    "build_fill",
]

_log = logging.getLogger(__name__)
_GLOBAL = "*"
_COMPANIES = ""  # the fill_state row (per source) whose cursor is the company a spent minute stopped at


@dataclass(frozen=True)
class FillRow:
    id: uuid.UUID
    company: str
    seat: str
    text: str
    alone: bool = False

    @property
    def size(self) -> int:
        return len(self.text.encode())


class FillSource(Protocol):
    """A row family the fill serves (diary notes, episodes). Holds live on the owner's rows."""

    name: str

    async def companies(self, model: str, dims: int | None, fingerprint: str, now: datetime) -> list[str]: ...

    async def seats(self, company: str, model: str, dims: int | None, fingerprint: str, now: datetime) -> list[str]:
        """Seats of ``company`` with rows to fill, sorted."""
        ...

    async def backlog(self, model: str, dims: int | None, fingerprint: str, now: datetime) -> int:
        """How many rows wait for a vector of (model, dims), held ones aside (a metric)."""
        ...

    async def pending(
        self, company: str, seat: str, model: str, dims: int | None, fingerprint: str, now: datetime, limit: int
    ) -> list[FillRow]:
        """Live rows with no vector of (model, dims), not held under ``fingerprint``."""
        ...

    async def store_vector(self, row: FillRow, vector: Vector) -> None:
        """Set the row's vector (clearing its hold) and put it in the index."""
        ...

    async def hold(self, row: FillRow, until: datetime, fingerprint: str, alone: bool) -> None: ...


@dataclass
class FillReport:
    requests: int = 0
    bytes: int = 0
    filled: int = 0
    refused_held: int = 0
    unusable_held: int = 0
    continued: int = 0
    ended_by: str | None = None
    """Why the minute ended early: rate_limited, timeout, unavailable, configuration, requests,
    bytes, configuration_refused, paused."""
    seats_done: list[str] = field(default_factory=list)


class RequestBudget(Protocol):
    """The fill's minute as every fill shares it: the requests sent (the node's sixteen, refused
    ones included) and whether the provider ended the minute. A rate limit, a timeout, an
    unreachable endpoint or a refused configuration "ends the minute for every seat rather than for
    one" — so for every fill too: a fill that starts later in the same minute sends nothing.
    :class:`PostgresRequestLedger` is the one a process uses (on ``Infra``): one count for every
    process on the database, as the three fill pods of a Kubernetes deployment are;
    :class:`RequestLedger` keeps the same rules in memory (tests)."""

    async def ended(self, now: datetime) -> str | None:
        """Why the minute of ``now`` was ended, if it was."""
        ...

    async def end(self, now: datetime, why: str) -> None:
        """The provider ended the minute of ``now`` (``why``: rate_limited, timeout, ...); the first
        reason given is kept."""
        ...

    async def take(self, now: datetime, limit: int, needed: int) -> str | None:
        """Count one request in the minute of ``now`` if the minute was not ended and ``needed``
        more (the request, and the probe that may have to follow it) fit under ``limit``. None
        when counted; else why not: the reason the minute was ended, or ``requests``."""
        ...


class RequestLedger:
    """:class:`RequestBudget` in one process's memory: the rules of ``REQUEST_SQL`` (unit tests,
    and a fill built with no ledger)."""

    def __init__(self) -> None:
        self._window: datetime | None = None
        self._sent = 0
        self._ended: str | None = None

    def _roll(self, now: datetime) -> None:
        window = _window(now)
        if window != self._window:
            self._window, self._sent, self._ended = window, 0, None

    async def end(self, now: datetime, why: str) -> None:
        self._roll(now)
        self._ended = self._ended or why

    async def ended(self, now: datetime) -> str | None:
        self._roll(now)
        return self._ended

    async def take(self, now: datetime, limit: int, needed: int) -> str | None:
        self._roll(now)
        if self._ended is not None:
            return self._ended
        if self._sent + needed > limit:
            return "requests"
        self._sent += 1
        return None


REQUEST_SQL = {
    # Counted only if the minute was not ended and the request (and the probe it may need) fit:
    # a row back means counted, as ``spend_bytes``. One statement a request.
    "take": """INSERT INTO fill_requests AS f (window_start, sent) SELECT $1, 1 WHERE $3::int <= $2::int
               ON CONFLICT (window_start) DO UPDATE SET sent = f.sent + 1
               WHERE f.ended IS NULL AND f.sent + $3 <= $2
               RETURNING sent""",
    "end": """INSERT INTO fill_requests AS f (window_start, ended) VALUES ($1, $2)
              ON CONFLICT (window_start) DO UPDATE SET ended = COALESCE(f.ended, EXCLUDED.ended)""",
    "ended": "SELECT ended FROM fill_requests WHERE window_start = $1",
    # Read once a fill's minute starts; the rows of minutes long gone go then too, the byte
    # budget's with them (one row a company a minute, never read past its minute).
    "ended_pruning": """WITH pruned AS (DELETE FROM fill_requests WHERE window_start < $2),
                             spent AS (DELETE FROM fill_budget WHERE window_start < $2)
                        SELECT ended FROM fill_requests WHERE window_start = $1""",
}
"""fill_requests: one row a minute, the requests every fill on the database sent in it and why the
provider ended it, if it did."""

_REQUESTS_KEPT = timedelta(hours=1)
"""How long a minute's row outlives its minute: well past any clock skew between the processes
that share it (a row pruned while a process whose clock lags still counts in it would give that
process a fresh sixteen)."""


class PostgresRequestLedger:
    """:class:`RequestBudget` in Postgres (``fill_requests``): every process on the database shares
    the minute's sixteen and its end — on Kubernetes the diary, episode and knowledge fills run in
    three pods, and a count per process sent up to three times the sixteen, and a rate limit met by
    one fill did not stop the other two. Keyed by each process's clock, as the byte budget is."""

    def __init__(self, db: asyncpg.Pool):
        self._db = db

    async def ended(self, now: datetime) -> str | None:
        window = _window(now)
        why: str | None = await self._db.fetchval(REQUEST_SQL["ended_pruning"], window, window - _REQUESTS_KEPT)
        return why

    async def end(self, now: datetime, why: str) -> None:
        await self._db.execute(REQUEST_SQL["end"], _window(now), why)

    async def take(self, now: datetime, limit: int, needed: int) -> str | None:
        window = _window(now)
        if await self._db.fetchval(REQUEST_SQL["take"], window, limit, needed) is not None:
            return None
        # Not counted: the provider ended the minute, or the sixteen are spent (a second statement
        # only then: once a fill's minute).
        why: str | None = await self._db.fetchval(REQUEST_SQL["ended"], window)
        return why or "requests"


@dataclass(frozen=True)
class _Ended:
    """Why a step stopped the walk: returned up through seat, company and source (never raised),
    so each level decides what the stop means to it. ``company_only``: this company's bytes for
    the minute are spent, so the minute goes on for the other companies."""

    why: str
    company_only: bool = False


_NOT_THE_PROVIDERS = frozenset({"requests", "bytes", "paused"})
"""Why a minute ends that is not the provider ending it: the budgets (already shared: the request
count on the ledger, the bytes in Postgres) and the configuration pause (in Postgres)."""


@dataclass
class _Minute:
    """One minute's run, passed to every step: its report and whether its first answer from the
    provider is still pending (a refusal then is judged by the probe word). Lives for one
    :meth:`VectorFill.run_minute`, never on the fill between minutes."""

    report: FillReport
    fingerprint: str
    first_answer: bool = True

    def probe_reserve(self, probe_word: str) -> int:
        """Bytes kept back for the probe word while the minute's first answer is pending: a
        refusal must always be judgeable in the minute it happens, or a refused row would be sent
        again every minute without ever being judged."""
        return len(probe_word.encode()) if self.first_answer else 0


FILL_SQL = {
    "state": "SELECT cursor_seat, paused_until, paused_fingerprint FROM fill_state WHERE source = $1 AND company = $2",
    "set_cursor": """INSERT INTO fill_state (source, company, cursor_seat) VALUES ($1, $2, $3)
                     ON CONFLICT (source, company) DO UPDATE SET cursor_seat = EXCLUDED.cursor_seat""",
    "pause": """INSERT INTO fill_state (source, company, paused_until, paused_fingerprint) VALUES ($1, $1, $2, $3)
                ON CONFLICT (source, company) DO UPDATE
                SET paused_until = EXCLUDED.paused_until, paused_fingerprint = EXCLUDED.paused_fingerprint""",
    "spend_bytes": """INSERT INTO fill_budget (company, window_start, bytes)
                      SELECT $1, $2, $3::bigint WHERE $3::bigint <= $4::bigint
                      ON CONFLICT (company, window_start) DO UPDATE SET bytes = fill_budget.bytes + EXCLUDED.bytes
                      WHERE fill_budget.bytes + EXCLUDED.bytes <= $4
                      RETURNING bytes""",
    "bytes_spent": "SELECT bytes FROM fill_budget WHERE company = $1 AND window_start = $2",
    "kept_pieces": """SELECT piece, vector FROM fill_pieces
                      WHERE source = $1 AND row_id = $2 AND fingerprint = $3 AND text_sha256 = $4 ORDER BY piece""",
    "drop_stale_pieces": """DELETE FROM fill_pieces
                            WHERE source = $1 AND row_id = $2 AND (fingerprint <> $3 OR text_sha256 <> $4)""",
    "keep_piece": """INSERT INTO fill_pieces (source, row_id, fingerprint, text_sha256, piece, vector)
                     VALUES ($1, $2, $3, $4, $5, $6)
                     ON CONFLICT (source, row_id, piece) DO UPDATE SET vector = EXCLUDED.vector,
                         fingerprint = EXCLUDED.fingerprint, text_sha256 = EXCLUDED.text_sha256""",
    "drop_pieces": "DELETE FROM fill_pieces WHERE source = $1 AND row_id = $2",
}
"""The fill's own tables: the walk's cursors and the configuration pause (fill_state), the company
byte budget every runner shares (fill_budget), a long row's embedded pieces (fill_pieces)."""


@dataclass(frozen=True)
class FillState:
    """One fill_state row: the walk's cursor for (source, company), and for the global row the
    configuration pause and the provider fingerprint it was stamped with."""

    cursor_seat: str | None = None
    paused_until: datetime | None = None
    paused_fingerprint: str | None = None


class FillStore(Protocol):
    """The fill's bookkeeping port: what :class:`VectorFill` reads and writes besides the rows.
    :class:`FillLedger` is the Postgres adapter; a unit test runs the minute on an in-memory one."""

    async def state(self, source: str, company: str) -> FillState | None: ...

    async def set_cursor(self, source: str, company: str, seat: str | None) -> None: ...

    async def pause(self, until: datetime, fingerprint: str) -> None:
        """Pause every fill until ``until`` for the provider ``fingerprint`` (the global row)."""
        ...

    async def spend_bytes(self, company: str, window: datetime, size: int, limit: int) -> bool:
        """Charge ``size`` bytes to the company's window, or nothing if that would pass ``limit``."""
        ...

    async def bytes_spent(self, company: str, window: datetime) -> int: ...

    async def kept_pieces(self, source: str, row: uuid.UUID, fp: str, digest: str) -> list[np.ndarray]:
        """The row's pieces embedded so far under ``fp`` for this text, in order without a gap."""
        ...

    async def keep_pieces(
        self, source: str, row: uuid.UUID, fp: str, digest: str, start: int, vectors: list[np.ndarray]
    ) -> None:
        """Keep ``vectors`` as pieces ``start``..., dropping pieces of another provider or text."""
        ...

    async def drop_pieces(self, source: str, row: uuid.UUID) -> None: ...


class FillLedger:
    """The fill's bookkeeping in Postgres, by named query: cursors, the pause, the byte budget and a
    long row's kept pieces. The rows themselves are the sources'."""

    def __init__(self, db: asyncpg.Pool):
        self._db = db

    async def state(self, source: str, company: str) -> FillState | None:
        r = await self._db.fetchrow(FILL_SQL["state"], source, company)
        if r is None:
            return None
        return FillState(r["cursor_seat"], r["paused_until"], r["paused_fingerprint"])

    async def set_cursor(self, source: str, company: str, seat: str | None) -> None:
        await self._db.execute(FILL_SQL["set_cursor"], source, company, seat)

    async def pause(self, until: datetime, fingerprint: str) -> None:
        await self._db.execute(FILL_SQL["pause"], _GLOBAL, until, fingerprint)

    async def spend_bytes(self, company: str, window: datetime, size: int, limit: int) -> bool:
        """Charge ``size`` bytes to the company's window, or nothing if that would pass ``limit``."""
        return await self._db.fetchrow(FILL_SQL["spend_bytes"], company, window, size, limit) is not None

    async def bytes_spent(self, company: str, window: datetime) -> int:
        return int(await self._db.fetchval(FILL_SQL["bytes_spent"], company, window) or 0)

    async def kept_pieces(self, source: str, row: uuid.UUID, fp: str, digest: str) -> list[np.ndarray]:
        """The row's pieces embedded so far under ``fp`` for this text, in order without a gap."""
        kept: list[np.ndarray] = []
        for r in await self._db.fetch(FILL_SQL["kept_pieces"], source, row, fp, digest):
            if r["piece"] != len(kept):
                break
            kept.append(as_array(r["vector"]))
        return kept

    async def keep_pieces(
        self, source: str, row: uuid.UUID, fp: str, digest: str, start: int, vectors: list[np.ndarray]
    ) -> None:
        """Keep ``vectors`` as pieces ``start``..., dropping pieces of another provider or text."""
        async with self._db.acquire() as conn, conn.transaction():
            await conn.execute(FILL_SQL["drop_stale_pieces"], source, row, fp, digest)
            await conn.executemany(
                FILL_SQL["keep_piece"],
                [(source, row, fp, digest, start + i, v.astype(np.float32)) for i, v in enumerate(vectors)],
            )

    async def drop_pieces(self, source: str, row: uuid.UUID) -> None:
        await self._db.execute(FILL_SQL["drop_pieces"], source, row)


def _window(now: datetime) -> datetime:
    return now.replace(second=0, microsecond=0)


class VectorFill:
    def __init__(
        self,
        ledger: FillStore,
        sources: Sequence[FillSource],
        embedder: Embedder,
        config: FillConfig,
        embeddings: EmbeddingsConfig,
        clock: Clock,
        events: EventSink,
        requests: RequestBudget | None = None,
    ):
        self._ledger = ledger
        self._sources = list(sources)
        self._embedder = embedder
        self._config = config
        self._embeddings = embeddings
        self._clock = clock
        self._events = events
        self._requests = requests or RequestLedger()

    # ------------------------------------------------------------------ state

    async def paused_until(self) -> datetime | None:
        """When the configuration pause ends, if one holds for the current provider."""
        row = await self._ledger.state(_GLOBAL, _GLOBAL)
        if row is None or row.paused_until is None:
            return None
        if row.paused_fingerprint != self._embeddings.fingerprint() or row.paused_until <= self._clock.now():
            return None
        return row.paused_until

    async def _bytes_left(self, company: str) -> int:
        spent = await self._ledger.bytes_spent(company, _window(self._clock.now()))
        return self._config.company_bytes_per_minute - spent

    # ------------------------------------------------------------------ the minute

    async def run_minute(self) -> FillReport:
        report = FillReport()
        if await self.paused_until() is not None:
            report.ended_by = "paused"
            return report
        ended = await self._requests.ended(self._clock.now())
        if ended is not None:
            # Another fill (of any process on the database) met the provider's "not now" this minute.
            report.ended_by = ended
            return report
        minute = _Minute(report, self._embeddings.fingerprint())
        for source in self._sources:
            stop = await self._run_source(minute, source)
            if stop is not None:
                report.ended_by = stop.why
                if stop.why not in _NOT_THE_PROVIDERS:
                    await self._requests.end(self._clock.now(), stop.why)
                break
        await self._record_backlog()
        return report

    async def _record_backlog(self) -> None:
        """``agentlearn.fill.backlog`` per source, after the minute; measurement never fails it."""
        model, dims, fp = self._embedder.model, self._embedder.dimensions, self._embeddings.fingerprint()
        for source in self._sources:
            try:
                left = await source.backlog(model, dims, fp, self._clock.now())
            except Exception as exc:
                _log.debug("fill backlog of %s unreadable: %s", source.name, exc)
                continue
            FILL_BACKLOG.set(left, {"agentlearn.fill.source": source.name})

    async def _run_source(self, minute: _Minute, source: FillSource) -> _Ended | None:
        """Every company of ``source``; the stop that ends the minute, if one did."""
        now = self._clock.now()
        model, dims, fp = self._embedder.model, self._embedder.dimensions, minute.fingerprint
        companies = await source.companies(model, dims, fp, now)
        # The walk over companies resumes, like the one over seats, where a spent minute stopped:
        # one company's backlog does not take every minute's requests from the others.
        state = await self._ledger.state(source.name, _COMPANIES)
        start = state.cursor_seat if state else None
        if start is not None:
            companies = [c for c in companies if c >= start] + [c for c in companies if c < start]
        for company in companies:
            stop = await self._run_company(minute, source, company, model, dims, now)
            if stop is None:
                continue
            if stop.company_only:
                # This company's bytes are spent (its seat cursor is kept); the others go on.
                minute.report.ended_by = minute.report.ended_by or stop.why
                continue
            await self._ledger.set_cursor(source.name, _COMPANIES, company)
            return stop
        await self._ledger.set_cursor(source.name, _COMPANIES, None)
        return None

    async def _run_company(
        self, minute: _Minute, source: FillSource, company: str, model: str, dims: int | None, now: datetime
    ) -> _Ended | None:
        """Every seat of ``company`` from its cursor; a stop keeps the cursor at the seat it hit."""
        state = await self._ledger.state(source.name, company)
        cursor = state.cursor_seat if state else None
        seats = await source.seats(company, model, dims, minute.fingerprint, now)
        if cursor is not None:
            seats = [s for s in seats if s >= cursor] + [s for s in seats if s < cursor]
        for seat in seats:
            stop = await self._fill_seat(minute, source, company, seat, model, dims)
            if stop is not None:
                await self._ledger.set_cursor(source.name, company, seat)
                return stop
            minute.report.seats_done.append(f"{company}/{seat}")
        await self._ledger.set_cursor(source.name, company, None)
        return None

    async def _fill_seat(
        self, minute: _Minute, source: FillSource, company: str, seat: str, model: str, dims: int | None
    ) -> _Ended | None:
        now = self._clock.now()
        long_bound = self._config.company_bytes_per_minute
        while True:
            rows = await source.pending(company, seat, model, dims, minute.fingerprint, now, 1000)
            if not rows:
                return None
            work: deque[list[FillRow] | FillRow] = deque()
            batch: list[FillRow] = []
            for row in rows:
                if row.size > long_bound:
                    work.append(row)  # a long row goes a request at a time
                elif row.alone:
                    work.append([row])
                else:
                    batch.append(row)
                    if len(batch) >= self._config.batch_size:
                        work.append(batch)
                        batch = []
            if batch:
                work.append(batch)
            while work:
                unit = work.popleft()
                if isinstance(unit, FillRow):
                    stop = await self._fill_long(minute, source, unit)
                else:
                    stop = await self._fill_batch(minute, source, unit, work)
                if stop is not None:
                    return stop
            if len(rows) < 1000:
                return None

    async def _send(self, minute: _Minute, company: str, size: int, *, probe: bool = False) -> _Ended | None:
        """Charge one request of ``size`` bytes; the stop when a budget is spent (nothing charged)."""
        # While the first answer is pending, a request is sent only if the probe could follow it.
        # The request budget is the deployment's (the ledger every fill shares), not this pass's;
        # a minute another fill met the provider's "not now" in meanwhile sends nothing more.
        needed = 1 if probe or not minute.first_answer else 2
        refused = await self._requests.take(self._clock.now(), self._config.requests_per_minute, needed)
        if refused is not None:
            return _Ended(refused)
        limit = self._config.company_bytes_per_minute
        if not await self._ledger.spend_bytes(company, _window(self._clock.now()), size, limit):
            return _Ended("bytes", company_only=True)
        minute.report.requests += 1
        minute.report.bytes += size
        return None

    async def _judge_refusal(self, minute: _Minute, company: str) -> _Ended | None:
        """A minute's first answer was a refusal: is it the configuration's (the minute ends) or
        the rows' (None: go on isolating them)?"""
        minute.first_answer = False
        word = self._config.probe_word
        stop = await self._send(minute, company, len(word.encode()), probe=True)
        if stop is not None:
            return stop
        try:
            await self._embedder.embed_pieces([word])
        except EmbeddingError as err:
            if not err.about_input and err.kind != "configuration":
                return _Ended(err.kind)
            until = self._clock.now() + timedelta(seconds=self._config.hold_back_seconds)
            await self._ledger.pause(until, minute.fingerprint)
            await self._events.emit(
                "memory_fill_configuration_refused",
                company=company,
                model=self._embedder.model,
                error=str(err)[:500],
                paused_until=until.isoformat(),
            )
            _log.warning("embeddings configuration refused (%s); fill paused until %s", err, until)
            return _Ended("configuration_refused")
        return None

    async def _fill_batch(
        self, minute: _Minute, source: FillSource, rows: list[FillRow], work: deque[list[FillRow] | FillRow]
    ) -> _Ended | None:
        company = rows[0].company
        # A batch is bounded by the bytes the minute has left, not only by its count: the rest goes
        # in the next request (or the next minute), so a batch can never be too big to send at all.
        left = await self._bytes_left(company) - minute.probe_reserve(self._config.probe_word)
        fits, used = 0, 0
        while fits < len(rows) and used + rows[fits].size <= left:
            used += rows[fits].size
            fits += 1
        if fits == 0:
            return _Ended("bytes", company_only=True)
        if fits < len(rows):
            work.appendleft(rows[fits:])
            rows = rows[:fits]
        stop = await self._send(minute, company, sum(r.size for r in rows))
        if stop is not None:
            return stop
        try:
            vectors = await self._embedder.embed([r.text for r in rows])
        except EmbeddingError as err:
            if not err.about_input:
                return _Ended(err.kind)
            if minute.first_answer and (stop := await self._judge_refusal(minute, company)) is not None:
                return stop
            if len(rows) == 1:
                await self._hold(source, rows[0], minute.fingerprint, alone=True)
                minute.report.refused_held += 1
                await self._row_event("memory_fill_input_refused", source, rows[0], bytes=rows[0].size)
            else:
                half = len(rows) // 2
                work.appendleft(rows[half:])
                work.appendleft(rows[:half])
            return None
        minute.first_answer = False
        for row, vec in zip(rows, vectors, strict=True):
            if vec is None:
                await self._unusable(minute, source, row)
            else:
                await source.store_vector(row, vec)
                minute.report.filled += 1
        return None

    async def _unusable(self, minute: _Minute, source: FillSource, row: FillRow) -> None:
        # Held, not stored: stored, it reads as a row that has a vector; forgotten, it is sent
        # again every minute for ever. Offered again with its neighbours after the hour.
        await self._hold(source, row, minute.fingerprint, alone=False)
        minute.report.unusable_held += 1
        await self._row_event("memory_fill_vector_unusable", source, row, bytes=row.size)

    async def _row_event(self, kind: str, source: FillSource, row: FillRow, **details: Any) -> None:
        """A fill event about one row: its company, seat, id and row family, and ``details``."""
        await self._events.emit(
            kind, company=row.company, seat=row.seat, row=str(row.id), source=source.name, **details
        )

    async def _hold(self, source: FillSource, row: FillRow, fp: str, *, alone: bool) -> None:
        until = self._clock.now() + timedelta(seconds=self._config.hold_back_seconds)
        await source.hold(row, until, fp, alone)

    # ------------------------------------------------------------------ long rows

    async def _fill_long(self, minute: _Minute, source: FillSource, row: FillRow) -> _Ended | None:
        fp = minute.fingerprint
        pieces = await self._embedder.split_async(row.text) or [row.text]
        digest = hashlib.sha256(row.text.encode()).hexdigest()
        kept = await self._ledger.kept_pieces(source.name, row.id, fp, digest)
        # Once a chunk of this row was refused its pieces go one per request, remembered on the
        # row: a minute whose bytes the refused chunk spent must not start it over.
        cap = 1 if row.alone else self._config.batch_size
        while len(kept) < len(pieces):
            start = len(kept)
            chunk = pieces[start : start + cap]
            # As many pieces as the minute's bytes still allow (at least one: if even that does not
            # fit, the send below ends the minute and the next one resumes here).
            left = await self._bytes_left(row.company) - minute.probe_reserve(self._config.probe_word)
            while len(chunk) > 1 and sum(len(p.encode()) for p in chunk) > left:
                chunk = chunk[:-1]
            stop = await self._send(minute, row.company, sum(len(p.encode()) for p in chunk))
            if stop is not None:
                return stop
            try:
                vectors = await self._embedder.embed_pieces(chunk)
            except EmbeddingError as err:
                if not err.about_input:
                    return _Ended(err.kind)
                if minute.first_answer and (stop := await self._judge_refusal(minute, row.company)) is not None:
                    return stop  # the configuration is at fault
                if len(chunk) > 1:
                    cap = 1
                    await source.hold(row, self._clock.now(), fp, True)  # alone from now on, not held
                    continue
                await self._hold(source, row, fp, alone=True)
                minute.report.refused_held += 1
                await self._row_event(
                    "memory_fill_input_refused", source, row, piece=start, bytes=len(chunk[0].encode())
                )
                return None
            minute.first_answer = False
            good = []
            for vec in vectors:
                if not usable(vec):
                    break
                good.append(vec)
            if good:
                await self._ledger.keep_pieces(source.name, row.id, fp, digest, start, good)
                kept.extend(good)
                minute.report.continued += 1
                await self._row_event(
                    "memory_fill_input_continued", source, row, pieces_in=len(kept), pieces_total=len(pieces)
                )
            if len(good) < len(vectors):
                await self._unusable(minute, source, row)
                return None
        pooled = pool(kept, [len(p) for p in pieces])
        if pooled is None:
            await self._unusable(minute, source, row)
            return None
        await source.store_vector(row, Vector(pooled, self._embedder.model))
        await self._ledger.drop_pieces(source.name, row.id)
        minute.report.filled += 1
        return None


def build_fill(infra: Infra, sources: Sequence[FillSource]) -> VectorFill | None:
    """The fill a service's pass runs over its row families; None when no embedder is configured."""
    if infra.embedder is None:
        return None
    return VectorFill(
        FillLedger(infra.pool),
        sources,
        infra.embedder,
        infra.settings.learning.fill,
        infra.settings.providers.embeddings,
        infra.clock,
        infra.events,
        infra.fill_requests,
    )
