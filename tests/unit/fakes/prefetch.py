"""An in-memory fake of the prefetch's store port (services/prefetch/ports.py).

It decides what ``store.PostgresPrefetchStore``'s statements decide: the first claim of a run wins
and every later one loses until the claim is released; a built context is answered as it was
frozen; a claim older than the stale mark is taken over, a fresh one is not; the ledger answers a
repeat of an answered hint from its rows without spending, refuses at the cap, and spends one slot
otherwise (a failed hint spent its slot and is not cached); the company keeps its newest
``keep_runs`` runs, a hint recorded for an evicted run is dropped; a seat has one onboarding marker.
Each operation is one step of the event loop (no await inside), as each statement is atomic.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import grpc

from agentlearn.diary.v1 import diary_service_pb2 as diary_pb
from libs.common.events import Bookkeeping
from libs.common.grpcserver import _Status, rpc_error
from services.prefetch.store import FrozenContext, LedgerEntry, Reservation, RunKey

Run = tuple[str, str, str]


@dataclass
class _Hint:
    hint: str
    status: str
    notes: list[dict[str, Any]]
    shown: int


@dataclass
class _LedgerRun:
    seq: int
    spent: int = 0
    hints: dict[str, _Hint] = field(default_factory=dict)


class FakePrefetchStore:
    def __init__(self) -> None:
        self.markers: dict[tuple[str, str], tuple[str, list[str], datetime]] = {}
        self.contexts: dict[Run, FrozenContext] = {}
        self.context_times: dict[Run, datetime] = {}
        self.ledger: dict[Run, _LedgerRun] = {}
        self.bookkeeping: list[Bookkeeping] = []
        self._seq = itertools.count(1)
        self._locks: dict[str, asyncio.Lock] = {}

    @contextlib.asynccontextmanager
    async def one_at_a_time(self, run: Run, *, hold_for: float, keep_runs: int, now: datetime) -> AsyncIterator[None]:
        async with self._locks.setdefault("\x1f".join(run), asyncio.Lock()):
            yield

    # ---- onboarding markers

    async def marker(self, company: str, seat: str) -> str | None:
        found = self.markers.get((company, seat))
        return found[0] if found else None

    async def mark_onboarded(self, company: str, seat: str, chain_hash: str, chain: list[str], now: datetime) -> None:
        self.markers[(company, seat)] = (chain_hash, list(chain), now)

    # ---- refresh ledger

    async def reserve(
        self, company: str, seat: str, turn_id: str, hint_key: str, cap: int, keep_runs: int, now: datetime
    ) -> Reservation:
        run_key = (company, seat, turn_id)
        if run_key not in self.ledger:
            self.ledger[run_key] = _LedgerRun(next(self._seq))
            mine = sorted((r.seq, k) for k, r in self.ledger.items() if k[0] == company)
            for _, old in mine[: max(0, len(mine) - keep_runs)]:
                del self.ledger[old]
        run = self.ledger.get(run_key)
        if run is None:
            raise RuntimeError("refresh ledger keeps no runs (refresh_ledger_runs < 1)")
        hint = run.hints.get(hint_key)
        if hint is not None and hint.status == "answered":
            return Reservation("cached", run.spent, LedgerEntry(copy.deepcopy(hint.notes), hint.shown))
        if run.spent >= cap:
            return Reservation("refused", run.spent)
        run.spent += 1
        return Reservation("reserved", run.spent)

    def _put(self, run_key: Run, hint_key: str, hint: _Hint) -> None:
        run = self.ledger.get(run_key)
        if run is not None:  # an evicted run: nothing to remember
            run.hints[hint_key] = hint

    async def record_answer(
        self, company: str, seat: str, turn_id: str, hint_key: str, hint: str, answer: LedgerEntry, now: datetime
    ) -> None:
        cached = _Hint(hint, "answered", copy.deepcopy(answer.notes), answer.shown)
        self._put((company, seat, turn_id), hint_key, cached)

    async def record_failure(
        self, company: str, seat: str, turn_id: str, hint_key: str, hint: str, now: datetime
    ) -> None:
        self._put((company, seat, turn_id), hint_key, _Hint(hint, "failed", [], 0))

    async def record_shown(
        self, company: str, seat: str, turn_id: str, hint_key: str, shown: int, now: datetime
    ) -> None:
        run = self.ledger.get((company, seat, turn_id))
        if run is not None and hint_key in run.hints:
            run.hints[hint_key].shown = max(run.hints[hint_key].shown, shown)

    async def runs(self, company: str) -> int:
        return sum(1 for k in self.ledger if k[0] == company)

    # ---- frozen turn contexts

    async def claim_context(self, run: RunKey, now: datetime) -> bool:
        if run in self.contexts:
            return False
        self.contexts[run] = FrozenContext("building", None, now)
        self.context_times[run] = now
        return True

    async def claim_context_reading_marker(self, run: RunKey, now: datetime) -> tuple[bool, str | None]:
        return await self.claim_context(run, now), await self.marker(run.company, run.seat)

    async def frozen_context(self, run: RunKey) -> FrozenContext | None:
        return copy.deepcopy(self.contexts.get(run))

    async def take_over_context(self, run: RunKey, stale_before: datetime, now: datetime) -> datetime | None:
        frozen = self.contexts.get(run)
        if frozen is None or frozen.state != "building" or not frozen.claim_time < stale_before:
            return None
        claim = max(now, frozen.claim_time + timedelta(microseconds=1))  # always a new claim
        self.contexts[run] = FrozenContext("building", None, claim)
        return claim

    def _claimed_by(self, run: RunKey, claim: datetime) -> bool:
        frozen = self.contexts.get(run)
        return frozen is not None and frozen.state == "building" and frozen.claim_time == claim

    async def save_context(
        self,
        run: RunKey,
        context: dict[str, Any],
        now: datetime,
        claim: datetime,
        bookkeeping: Bookkeeping | None = None,
    ) -> bool:
        # The statement updates the row only while the caller's claim holds it, and writes the
        # bookkeeping only with it; one that does not land leaves the batch held (open) as it was.
        if not self._claimed_by(run, claim):
            return False
        self.contexts[run] = FrozenContext("built", copy.deepcopy(context), claim)
        self.context_times[run] = now
        if bookkeeping is not None:
            await self.write_bookkeeping(bookkeeping)
        return True

    async def release_context(self, run: RunKey, claim: datetime) -> None:
        if self._claimed_by(run, claim):
            del self.contexts[run]

    async def prune_contexts(self, before: datetime, limit: int = 500) -> int:
        old = sorted((t, k) for k, t in self.context_times.items() if t < before and k in self.contexts)[:limit]
        for _, key in old:
            del self.contexts[key]
            del self.context_times[key]
        return len(old)

    async def write_bookkeeping(self, batch: Bookkeeping) -> None:
        batch.closed = True
        self.bookkeeping.append(batch)


@dataclass
class FakeDiaryClient:
    """The diary's two RPCs the refresh tool calls, at the client boundary (``Clients.diary``): a
    pool of candidates for every query, the uses recorded; ``down`` answers UNAVAILABLE."""

    candidates: list[Any] = field(default_factory=list)
    used: list[str] = field(default_factory=list)
    recalls: int = 0
    down: bool = False

    async def RecallNotes(self, request: Any, timeout: float | None = None) -> Any:
        self.recalls += 1
        if self.down:
            raise rpc_error(_Status(grpc.StatusCode.UNAVAILABLE, "diary is down"))
        return diary_pb.RecallNotesResponse(candidates=self.candidates)

    async def MarkNotesUsed(self, request: Any, timeout: float | None = None) -> Any:
        self.used.extend(request.note_ids)
        return diary_pb.MarkNotesUsedResponse()


@dataclass
class FakeClients:
    """``libs.common.clients.Clients`` as far as the refresh tool reaches: the diary and a deadline."""

    diary: FakeDiaryClient
    timeout: float = 5.0


class _DownStub:
    def __init__(self, service: str, down: DownstreamDown):
        self._service, self._down = service, down

    def __getattr__(self, rpc: str) -> Any:
        async def call(request: Any, timeout: float | None = None, **_: Any) -> Any:
            await self._down.answer(f"{self._service}.{rpc}")
            raise rpc_error(_Status(grpc.StatusCode.UNAVAILABLE, f"{self._service} is down"))

        return call


class DownstreamDown:
    """Every service the turn start reads, at its client boundary (``Clients``' stubs and the
    knowledge ``Searcher``), answering UNAVAILABLE: each block degrades, the turn still starts.
    ``calls`` says what was asked (``service.Rpc``), so a test can tell a build from a frozen read."""

    def __init__(self, timeout: float = 5.0) -> None:
        self.calls: list[str] = []
        self.timeout = timeout
        self.stalled: asyncio.Event | None = None
        """While set to an event, a call made waits for it before answering (a slow service)."""

    async def answer(self, call: str) -> None:
        self.calls.append(call)
        gate = self.stalled
        if gate is not None:
            await gate.wait()

    def __getattr__(self, service: str) -> Any:
        if service.startswith("_"):
            raise AttributeError(service)
        return _DownStub(service, self)

    async def can_search(self, *args: Any, **kwargs: Any) -> bool:
        await self.answer("knowledge.can_search")
        raise rpc_error(_Status(grpc.StatusCode.UNAVAILABLE, "knowledge is down"))

    async def search(self, *args: Any, **kwargs: Any) -> Any:
        await self.answer("knowledge.search")
        raise rpc_error(_Status(grpc.StatusCode.UNAVAILABLE, "knowledge is down"))

    async def onboarding_pages(self, *args: Any, **kwargs: Any) -> Any:
        await self.answer("knowledge.onboarding_pages")
        raise rpc_error(_Status(grpc.StatusCode.UNAVAILABLE, "knowledge is down"))
