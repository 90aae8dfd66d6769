"""The vector fill: once a minute, embed the live rows that have no vector of the current model and
width (spec: "The holder fills what is missing"), shared by diary notes and episodes.

One minute, as :meth:`VectorFill.run_minute` runs it:

* It walks every company with rows to fill and, inside one, every seat in order starting at the
  seat where the previous minute ran out.
* What it may send is bounded by what it sends, refused requests included: ``requests_per_minute``
  requests for this process (every fill it runs shares them, on one :class:`RequestLedger`:
  "sixteen requests a node"), and
  ``company_bytes_per_minute`` bytes of text for the whole company, counted in a Postgres ledger
  every runner and row family shares. A budget that runs out ends the
  minute and the next starts at that seat.
* A rate limit, a timeout, an unreachable endpoint, a refused key or an unknown model ends the
  minute for every seat, not for one — and for every fill of the process (the ledger remembers it),
  so the episodes' fill does not keep sending in a minute the diary's fill was told "not now".
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
from typing import TYPE_CHECKING, Protocol

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

__all__ = ["FillReport", "FillRow", "FillSource", "RequestLedger", "VectorFill", "build_fill"]

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


class RequestLedger:
    """The minute of one process, shared by every fill it runs (diary notes, episodes, pages): the
    requests sent (a node's sixteen, refused ones included) and whether the provider ended the
    minute. A rate limit, a timeout, an unreachable endpoint or a refused configuration "ends the
    minute for every seat rather than for one" — so for every fill of the process too: a fill that
    starts later in the same minute sends nothing. One per process: it lives on ``Infra``."""

    def __init__(self) -> None:
        self._window: datetime | None = None
        self._sent = 0
        self._ended: str | None = None

    def _roll(self, now: datetime) -> None:
        window = now.replace(second=0, microsecond=0)
        if window != self._window:
            self._window, self._sent, self._ended = window, 0, None

    def end(self, now: datetime, why: str) -> None:
        """The provider ended this minute (``why``: rate_limited, timeout, ...)."""
        self._roll(now)
        self._ended = self._ended or why

    def ended(self, now: datetime) -> str | None:
        """Why this minute was ended, if it was."""
        self._roll(now)
        return self._ended

    def available(self, now: datetime, limit: int) -> int:
        self._roll(now)
        return max(0, limit - self._sent)

    def take(self, now: datetime, limit: int) -> bool:
        self._roll(now)
        if self._sent >= limit:
            return False
        self._sent += 1
        return True


class _EndMinute(Exception):
    def __init__(self, why: str):
        self.why = why


class _CompanySpent(_EndMinute):
    """This company's bytes for the minute are spent: the minute goes on for the others."""


_NOT_THE_PROVIDERS = frozenset({"requests", "bytes", "paused"})
"""Why a minute ends that is not the provider ending it: the budgets (already shared: the request
count on the ledger, the bytes in Postgres) and the configuration pause (in Postgres)."""


class VectorFill:
    def __init__(
        self,
        db: asyncpg.Pool,
        sources: Sequence[FillSource],
        embedder: Embedder,
        config: FillConfig,
        embeddings: EmbeddingsConfig,
        clock: Clock,
        events: EventSink,
        requests: RequestLedger | None = None,
    ):
        self._db = db
        self._sources = list(sources)
        self._embedder = embedder
        self._config = config
        self._embeddings = embeddings
        self._clock = clock
        self._events = events
        self._requests = requests or RequestLedger()

    # ------------------------------------------------------------------ state

    async def _state(self, source: str, company: str) -> asyncpg.Record | None:
        return await self._db.fetchrow(
            "SELECT cursor_seat, paused_until, paused_fingerprint FROM fill_state WHERE source = $1 AND company = $2",
            source,
            company,
        )

    async def _set_cursor(self, source: str, company: str, seat: str | None) -> None:
        await self._db.execute(
            """INSERT INTO fill_state (source, company, cursor_seat) VALUES ($1, $2, $3)
               ON CONFLICT (source, company) DO UPDATE SET cursor_seat = EXCLUDED.cursor_seat""",
            source,
            company,
            seat,
        )

    async def _pause(self, until: datetime, fingerprint: str) -> None:
        await self._db.execute(
            """INSERT INTO fill_state (source, company, paused_until, paused_fingerprint) VALUES ($1, $1, $2, $3)
               ON CONFLICT (source, company) DO UPDATE
               SET paused_until = EXCLUDED.paused_until, paused_fingerprint = EXCLUDED.paused_fingerprint""",
            _GLOBAL,
            until,
            fingerprint,
        )

    async def paused_until(self) -> datetime | None:
        """When the configuration pause ends, if one holds for the current provider."""
        row = await self._state(_GLOBAL, _GLOBAL)
        if row is None or row["paused_until"] is None:
            return None
        if row["paused_fingerprint"] != self._embeddings.fingerprint() or row["paused_until"] <= self._clock.now():
            return None
        until: datetime = row["paused_until"]
        return until

    async def _spend_bytes(self, company: str, size: int, now: datetime) -> bool:
        window = now.replace(second=0, microsecond=0)
        row = await self._db.fetchrow(
            """INSERT INTO fill_budget (company, window_start, bytes)
               SELECT $1, $2, $3::bigint WHERE $3::bigint <= $4::bigint
               ON CONFLICT (company, window_start) DO UPDATE SET bytes = fill_budget.bytes + EXCLUDED.bytes
               WHERE fill_budget.bytes + EXCLUDED.bytes <= $4
               RETURNING bytes""",
            company,
            window,
            size,
            self._config.company_bytes_per_minute,
        )
        return row is not None

    async def _bytes_left(self, company: str) -> int:
        window = self._clock.now().replace(second=0, microsecond=0)
        spent = await self._db.fetchval(
            "SELECT bytes FROM fill_budget WHERE company = $1 AND window_start = $2", company, window
        )
        return self._config.company_bytes_per_minute - int(spent or 0)

    # ------------------------------------------------------------------ the minute

    async def run_minute(self) -> FillReport:
        report = FillReport()
        if await self.paused_until() is not None:
            report.ended_by = "paused"
            return report
        ended = self._requests.ended(self._clock.now())
        if ended is not None:
            # Another fill of this process met the provider's "not now" this minute.
            report.ended_by = ended
            return report
        self._first_answer = True
        self._report = report
        try:
            for source in self._sources:
                await self._run_source(source)
        except _EndMinute as end:
            report.ended_by = end.why
            if end.why not in _NOT_THE_PROVIDERS:
                self._requests.end(self._clock.now(), end.why)
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

    async def _run_source(self, source: FillSource) -> None:
        now = self._clock.now()
        model, dims, fp = self._embedder.model, self._embedder.dimensions, self._embeddings.fingerprint()
        companies = await source.companies(model, dims, fp, now)
        # The walk over companies resumes, like the one over seats, where a spent minute stopped:
        # one company's backlog does not take every minute's requests from the others.
        state = await self._state(source.name, _COMPANIES)
        start = state["cursor_seat"] if state else None
        if start is not None:
            companies = [c for c in companies if c >= start] + [c for c in companies if c < start]
        for company in companies:
            try:
                await self._run_company(source, company, model, dims, fp, now)
            except _CompanySpent as spent:
                # This company's bytes are spent (its seat cursor is kept); the others go on.
                self._report.ended_by = self._report.ended_by or spent.why
            except _EndMinute:
                await self._set_cursor(source.name, _COMPANIES, company)
                raise
        await self._set_cursor(source.name, _COMPANIES, None)

    async def _run_company(
        self, source: FillSource, company: str, model: str, dims: int | None, fp: str, now: datetime
    ) -> None:
        state = await self._state(source.name, company)
        cursor = state["cursor_seat"] if state else None
        seats = await source.seats(company, model, dims, fp, now)
        if cursor is not None:
            seats = [s for s in seats if s >= cursor] + [s for s in seats if s < cursor]
        for seat in seats:
            try:
                await self._fill_seat(source, company, seat, model, dims, fp)
            except _EndMinute:
                await self._set_cursor(source.name, company, seat)
                raise
            self._report.seats_done.append(f"{company}/{seat}")
        await self._set_cursor(source.name, company, None)

    async def _fill_seat(
        self, source: FillSource, company: str, seat: str, model: str, dims: int | None, fp: str
    ) -> None:
        now = self._clock.now()
        long_bound = self._config.company_bytes_per_minute
        while True:
            rows = await source.pending(company, seat, model, dims, fp, now, 1000)
            if not rows:
                return
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
                    await self._fill_long(source, unit, fp)
                else:
                    await self._fill_batch(source, unit, fp, work)
            if len(rows) < 1000:
                return

    def _probe_reserve(self) -> int:
        """Bytes kept back for the probe word while the minute's first answer is pending: a
        refusal must always be judgeable in the minute it happens, or a refused row would be sent
        again every minute without ever being judged."""
        return len(self._config.probe_word.encode()) if self._first_answer else 0

    async def _send(self, company: str, size: int, *, probe: bool = False) -> None:
        """Charge one request of ``size`` bytes, or end the minute when a budget is spent."""
        now = self._clock.now()
        ended = self._requests.ended(now)
        if ended is not None:  # another fill of this process met the provider's "not now" meanwhile
            raise _EndMinute(ended)
        # While the first answer is pending, a request is sent only if the probe could follow it.
        # The request budget is the process's (the ledger every fill shares), not this pass's.
        needed = 1 if probe or not self._first_answer else 2
        if self._requests.available(now, self._config.requests_per_minute) < needed:
            raise _EndMinute("requests")
        self._requests.take(now, self._config.requests_per_minute)
        if not await self._spend_bytes(company, size, self._clock.now()):
            raise _CompanySpent("bytes")
        self._report.requests += 1
        self._report.bytes += size

    async def _judge_refusal(self, company: str, fp: str) -> None:
        """A minute's first answer was a refusal: is it the configuration's or the rows'?"""
        self._first_answer = False
        word = self._config.probe_word
        await self._send(company, len(word.encode()), probe=True)
        try:
            await self._embedder.embed_pieces([word])
        except EmbeddingError as err:
            if not err.about_input and err.kind != "configuration":
                raise _EndMinute(err.kind) from err
            until = self._clock.now() + timedelta(seconds=self._config.hold_back_seconds)
            await self._pause(until, fp)
            await self._events.emit(
                "memory_fill_configuration_refused",
                company=company,
                model=self._embedder.model,
                error=str(err)[:500],
                paused_until=until.isoformat(),
            )
            _log.warning("embeddings configuration refused (%s); fill paused until %s", err, until)
            raise _EndMinute("configuration_refused") from err

    async def _fill_batch(
        self, source: FillSource, rows: list[FillRow], fp: str, work: deque[list[FillRow] | FillRow]
    ) -> None:
        company = rows[0].company
        # A batch is bounded by the bytes the minute has left, not only by its count: the rest goes
        # in the next request (or the next minute), so a batch can never be too big to send at all.
        left = await self._bytes_left(company) - self._probe_reserve()
        fits, used = 0, 0
        while fits < len(rows) and used + rows[fits].size <= left:
            used += rows[fits].size
            fits += 1
        if fits == 0:
            raise _CompanySpent("bytes")
        if fits < len(rows):
            work.appendleft(rows[fits:])
            rows = rows[:fits]
        await self._send(company, sum(r.size for r in rows))
        try:
            vectors = await self._embedder.embed([r.text for r in rows])
        except EmbeddingError as err:
            if not err.about_input:
                raise _EndMinute(err.kind) from err
            if self._first_answer:
                await self._judge_refusal(company, fp)
            if len(rows) == 1:
                await self._hold(source, rows[0], fp, alone=True)
                self._report.refused_held += 1
                await self._events.emit(
                    "memory_fill_input_refused",
                    company=company,
                    seat=rows[0].seat,
                    row=str(rows[0].id),
                    source=source.name,
                    bytes=rows[0].size,
                )
            else:
                half = len(rows) // 2
                work.appendleft(rows[half:])
                work.appendleft(rows[:half])
            return
        self._first_answer = False
        for row, vec in zip(rows, vectors, strict=True):
            if vec is None:
                await self._unusable(source, row, fp)
            else:
                await source.store_vector(row, vec)
                self._report.filled += 1

    async def _unusable(self, source: FillSource, row: FillRow, fp: str) -> None:
        # Held, not stored: stored, it reads as a row that has a vector; forgotten, it is sent
        # again every minute for ever. Offered again with its neighbours after the hour.
        await self._hold(source, row, fp, alone=False)
        self._report.unusable_held += 1
        await self._events.emit(
            "memory_fill_vector_unusable",
            company=row.company,
            seat=row.seat,
            row=str(row.id),
            source=source.name,
            bytes=row.size,
        )

    async def _hold(self, source: FillSource, row: FillRow, fp: str, *, alone: bool) -> None:
        until = self._clock.now() + timedelta(seconds=self._config.hold_back_seconds)
        await source.hold(row, until, fp, alone)

    # ------------------------------------------------------------------ long rows

    async def _kept_pieces(self, source: str, row: FillRow, fp: str, digest: str) -> list[np.ndarray]:
        rows = await self._db.fetch(
            """SELECT piece, vector FROM fill_pieces
               WHERE source = $1 AND row_id = $2 AND fingerprint = $3 AND text_sha256 = $4 ORDER BY piece""",
            source,
            row.id,
            fp,
            digest,
        )
        kept: list[np.ndarray] = []
        for r in rows:
            if r["piece"] != len(kept):
                break
            kept.append(as_array(r["vector"]))
        return kept

    async def _keep_pieces(
        self, source: str, row: FillRow, fp: str, digest: str, start: int, vectors: list[np.ndarray]
    ) -> None:
        async with self._db.acquire() as conn, conn.transaction():
            await conn.execute(
                """DELETE FROM fill_pieces
                   WHERE source = $1 AND row_id = $2 AND (fingerprint <> $3 OR text_sha256 <> $4)""",
                source,
                row.id,
                fp,
                digest,
            )
            await conn.executemany(
                """INSERT INTO fill_pieces (source, row_id, fingerprint, text_sha256, piece, vector)
                   VALUES ($1, $2, $3, $4, $5, $6)
                   ON CONFLICT (source, row_id, piece) DO UPDATE SET vector = EXCLUDED.vector,
                       fingerprint = EXCLUDED.fingerprint, text_sha256 = EXCLUDED.text_sha256""",
                [(source, row.id, fp, digest, start + i, v.astype(np.float32)) for i, v in enumerate(vectors)],
            )

    async def _fill_long(self, source: FillSource, row: FillRow, fp: str) -> None:
        pieces = await self._embedder.split_async(row.text) or [row.text]
        digest = hashlib.sha256(row.text.encode()).hexdigest()
        kept = await self._kept_pieces(source.name, row, fp, digest)
        # Once a chunk of this row was refused its pieces go one per request, remembered on the
        # row: a minute whose bytes the refused chunk spent must not start it over.
        cap = 1 if row.alone else self._config.batch_size
        while len(kept) < len(pieces):
            start = len(kept)
            chunk = pieces[start : start + cap]
            # As many pieces as the minute's bytes still allow (at least one: if even that does not
            # fit, the send below ends the minute and the next one resumes here).
            left = await self._bytes_left(row.company) - self._probe_reserve()
            while len(chunk) > 1 and sum(len(p.encode()) for p in chunk) > left:
                chunk = chunk[:-1]
            await self._send(row.company, sum(len(p.encode()) for p in chunk))
            try:
                vectors = await self._embedder.embed_pieces(chunk)
            except EmbeddingError as err:
                if not err.about_input:
                    raise _EndMinute(err.kind) from err
                if self._first_answer:
                    await self._judge_refusal(row.company, fp)  # ends the minute if the config is at fault
                if len(chunk) > 1:
                    cap = 1
                    await source.hold(row, self._clock.now(), fp, True)  # alone from now on, not held
                    continue
                await self._hold(source, row, fp, alone=True)
                self._report.refused_held += 1
                await self._events.emit(
                    "memory_fill_input_refused",
                    company=row.company,
                    seat=row.seat,
                    row=str(row.id),
                    source=source.name,
                    piece=start,
                    bytes=len(chunk[0].encode()),
                )
                return
            self._first_answer = False
            good = []
            for vec in vectors:
                if not usable(vec):
                    break
                good.append(vec)
            if good:
                await self._keep_pieces(source.name, row, fp, digest, start, good)
                kept.extend(good)
                self._report.continued += 1
                await self._events.emit(
                    "memory_fill_input_continued",
                    company=row.company,
                    seat=row.seat,
                    row=str(row.id),
                    source=source.name,
                    pieces_in=len(kept),
                    pieces_total=len(pieces),
                )
            if len(good) < len(vectors):
                await self._unusable(source, row, fp)
                return
        pooled = pool(kept, [len(p) for p in pieces])
        if pooled is None:
            await self._unusable(source, row, fp)
            return
        await source.store_vector(row, Vector(pooled, self._embedder.model))
        await self._db.execute("DELETE FROM fill_pieces WHERE source = $1 AND row_id = $2", source.name, row.id)
        self._report.filled += 1


def build_fill(infra: Infra, sources: Sequence[FillSource]) -> VectorFill | None:
    """The fill a service's pass runs over its row families; None when no embedder is configured."""
    if infra.embedder is None:
        return None
    return VectorFill(
        infra.pool,
        sources,
        infra.embedder,
        infra.settings.learning.fill,
        infra.settings.providers.embeddings,
        infra.clock,
        infra.events,
        infra.fill_requests,
    )
