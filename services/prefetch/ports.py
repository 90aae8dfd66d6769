"""The prefetch use cases' store port (issue 13): what the turn start (``turn_context``), the
refresh tool and the onboarding block (``builtins``, ``knowledge_block``) need of the prefetch's
own state — the frozen turn contexts, the refresh ledger, the onboarding markers — as a
``typing.Protocol``. ``store.PostgresPrefetchStore`` is the adapter; tests/unit/fakes/prefetch.py
holds an in-memory one, so the unit tier runs the store-level decisions (a run's context frozen
once and redelivered, a dead build taken over, the ledger's cached/refused/reserved answer, an
onboarding marker per seat) with no Postgres.

How each decision is made atomic (one statement, the run row's lock, a lease on the run's row
across replicas) is the adapter's job; the port promises the outcome: two callers racing for one run's
claim, or for its last refresh slot, never both win.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from datetime import datetime
from typing import Any, Protocol

from libs.common.events import Bookkeeping
from services.prefetch.store import FrozenContext, LedgerEntry, Reservation, RunKey

__all__ = ["PrefetchStore"]


class PrefetchStore(Protocol):
    def one_at_a_time(
        self, run: RunKey, *, hold_for: float, keep_runs: int, now: datetime
    ) -> AbstractAsyncContextManager[None]:
        """Work on ``run`` serialised across every replica while the context is held, for at most
        ``hold_for`` seconds (a holder that died lets the next in after that). Holds no connection
        while held. The run's ledger row is created if it has none (the seat keeps ``keep_runs``)."""
        ...

    # ---- onboarding markers

    async def marker(self, company: str, seat: str) -> str | None:
        """The chain hash the seat was last onboarded with (None: never)."""
        ...

    async def mark_onboarded(
        self, company: str, seat: str, chain_hash: str, chain: list[str], now: datetime
    ) -> None: ...

    # ---- refresh ledger

    async def reserve(
        self, company: str, seat: str, turn_id: str, hint_key: str, cap: int, keep_runs: int, now: datetime
    ) -> Reservation:
        """A repeat of an answered hint from the ledger (nothing spent), a refusal past ``cap``, or
        one slot spent. The company keeps its newest ``keep_runs`` runs' ledgers."""
        ...

    async def record_answer(
        self, company: str, seat: str, turn_id: str, hint_key: str, hint: str, answer: LedgerEntry, now: datetime
    ) -> None: ...

    async def record_failure(
        self, company: str, seat: str, turn_id: str, hint_key: str, hint: str, now: datetime
    ) -> None:
        """The hint's filter failed: its slot stays spent, nothing is cached."""
        ...

    async def record_shown(
        self, company: str, seat: str, turn_id: str, hint_key: str, shown: int, now: datetime
    ) -> None:
        """More of a cached answer shown (never fewer)."""
        ...

    async def runs(self, company: str) -> int: ...

    # ---- frozen turn contexts

    async def claim_context(self, run: RunKey, now: datetime) -> bool:
        """True for the first call of the run: it builds the context."""
        ...

    async def claim_context_reading_marker(self, run: RunKey, now: datetime) -> tuple[bool, str | None]:
        """:meth:`claim_context`, and the seat's onboarding marker (:meth:`marker`) read with it."""
        ...

    async def frozen_context(self, run: RunKey) -> FrozenContext | None: ...

    async def take_over_context(self, run: RunKey, stale_before: datetime, now: datetime) -> datetime | None:
        """Take a build claimed before ``stale_before`` (its builder died, or is slow): the new
        claim's time (later than the old one's), or None if not taken."""
        ...

    async def save_context(
        self,
        run: RunKey,
        context: dict[str, Any],
        now: datetime,
        claim: datetime,
        bookkeeping: Bookkeeping | None = None,
    ) -> bool:
        """Freeze the built context, and write the request's bookkeeping with it (when given), only
        if the run is still building under ``claim`` (the caller's claim time); True if it did.
        False: another builder took the claim over (this one was slow, not dead) or the run is
        built; the bookkeeping is then still held by the caller (or was dropped, the outcome of its
        write unknown: ``Bookkeeping.abandon``)."""
        ...

    async def release_context(self, run: RunKey, claim: datetime) -> None:
        """Give the caller's claim back (the build failed or was parked); a built context, or a
        claim another builder took over, stays."""
        ...

    async def prune_contexts(self, before: datetime, limit: int = 500) -> int: ...

    async def write_bookkeeping(self, batch: Bookkeeping) -> None:
        """A request's held events and charges, written on their own (best effort)."""
        ...
