"""PostgreSQL store of the prefetch's own state: onboarding markers and the refresh ledger.

Named queries, ``$n`` parameters, time from the service's clock. The ledger's reservation is one
transaction under the run row's lock, so two refreshes of one run racing each other cannot both
take the last slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, NamedTuple

import asyncpg

from libs.common.db import refused_by_server, unflushed
from libs.common.events import Bookkeeping, held_events, write_bookkeeping

__all__ = ["FrozenContext", "LedgerEntry", "PostgresPrefetchStore", "Reservation", "RunKey"]

_log = logging.getLogger(__name__)

SQL = {
    # ``one_at_a_time``'s lease on the run's row: taken when free or lapsed, on the database's clock
    # (the one clock every replica shares), and cleared only by its own holder.
    "lease_take": """
        UPDATE refresh_ledger_runs
           SET lease_holder = $4, busy_until = clock_timestamp() + make_interval(secs => $5::float8)
        WHERE company = $1 AND seat = $2 AND turn_id = $3
          AND (busy_until IS NULL OR busy_until <= clock_timestamp())
        RETURNING 1""",
    "lease_release": """
        UPDATE refresh_ledger_runs SET lease_holder = NULL, busy_until = NULL
        WHERE company = $1 AND seat = $2 AND turn_id = $3 AND lease_holder = $4""",
    "marker": "SELECT chain_hash FROM agent_onboarding_markers WHERE company = $1 AND seat = $2",
    "mark": """
        INSERT INTO agent_onboarding_markers (company, seat, chain_hash, unit_chain, marked_time)
        VALUES ($1, $2, $3, $4, $5)
        ON CONFLICT (company, seat) DO UPDATE
           SET chain_hash = EXCLUDED.chain_hash, unit_chain = EXCLUDED.unit_chain,
               marked_time = EXCLUDED.marked_time""",
    "run_insert": """
        INSERT INTO refresh_ledger_runs (company, seat, turn_id, spent, create_time) VALUES ($1, $2, $3, 0, $4)
        ON CONFLICT (company, seat, turn_id) DO NOTHING RETURNING seq""",
    "run_lock": "SELECT spent FROM refresh_ledger_runs WHERE company = $1 AND seat = $2 AND turn_id = $3 FOR UPDATE",
    "run_spend": "UPDATE refresh_ledger_runs SET spent = spent + 1 WHERE company = $1 AND seat = $2 AND turn_id = $3",
    # Keep the newest N runs of the SEAT (spec: "the most recent 256 turns, far more than a node
    # runs at once" -- one agent's turns); the hints go with their run (ON DELETE CASCADE). Per
    # company, a few hundred seats starting turns evicted a still-running turn's row, and its
    # per-turn cap started again from nothing.
    "run_evict": """
        DELETE FROM refresh_ledger_runs r
        WHERE r.company = $1 AND r.seat = $2 AND r.seq < (
            SELECT min(seq) FROM (
                SELECT seq FROM refresh_ledger_runs WHERE company = $1 AND seat = $2
                ORDER BY seq DESC LIMIT $3) newest)""",
    "hint_get": """
        SELECT status, notes, shown FROM refresh_ledger_hints
        WHERE company = $1 AND seat = $2 AND turn_id = $3 AND hint_key = $4""",
    "hint_put": """
        INSERT INTO refresh_ledger_hints (company, seat, turn_id, hint_key, hint, status, notes, shown, update_time)
        VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb, $8, $9)
        ON CONFLICT (company, seat, turn_id, hint_key) DO UPDATE
           SET status = EXCLUDED.status, notes = EXCLUDED.notes, shown = EXCLUDED.shown,
               hint = EXCLUDED.hint, update_time = EXCLUDED.update_time""",
    "hint_shown": """
        UPDATE refresh_ledger_hints SET shown = GREATEST(shown, $5), update_time = $6
        WHERE company = $1 AND seat = $2 AND turn_id = $3 AND hint_key = $4""",
    "runs_count": "SELECT count(*) FROM refresh_ledger_runs WHERE company = $1",
    # ---- frozen turn contexts (BuildTurnContext per run id)
    "context_claim": """
        INSERT INTO turn_contexts (company, seat, turn_id, state, claim_time, create_time)
        VALUES ($1, $2, $3, 'building', $4, $4)
        ON CONFLICT (company, seat, turn_id) DO NOTHING RETURNING 1""",
    # The claim and the seat's onboarding marker in one round trip (the first call of a run, nearly
    # every call, then needs no second statement for the onboarding block).
    "context_claim_marker": """
        WITH claim AS (
            INSERT INTO turn_contexts (company, seat, turn_id, state, claim_time, create_time)
            VALUES ($1, $2, $3, 'building', $4, $4)
            ON CONFLICT (company, seat, turn_id) DO NOTHING RETURNING 1)
        SELECT EXISTS (SELECT 1 FROM claim) AS claimed,
               (SELECT chain_hash FROM agent_onboarding_markers WHERE company = $1 AND seat = $2) AS marker""",
    "context_get": """
        SELECT state, context, claim_time FROM turn_contexts WHERE company = $1 AND seat = $2 AND turn_id = $3""",
    # A claim older than $4 is a build that died with its process: the caller takes it over. The new
    # claim is later than the old one even on a clock that did not move: a claim's time is its
    # owner's token (``context_save`` and ``context_release`` touch only their own claim's row).
    "context_take_over": """
        UPDATE turn_contexts SET claim_time = GREATEST($5, claim_time + interval '1 microsecond')
        WHERE company = $1 AND seat = $2 AND turn_id = $3 AND state = 'building' AND claim_time < $4
        RETURNING claim_time""",
    # Only the builder still holding the claim ($6) freezes the context: a builder whose claim was
    # taken over as stale (slow, not dead) saves nothing, so the context frozen is one and stays so.
    "context_save": """
        UPDATE turn_contexts SET state = 'built', context = $4::jsonb, create_time = $5
        WHERE company = $1 AND seat = $2 AND turn_id = $3 AND state = 'building' AND claim_time = $6
        RETURNING 1""",
    "context_release": """
        DELETE FROM turn_contexts
        WHERE company = $1 AND seat = $2 AND turn_id = $3 AND state = 'building' AND claim_time = $4""",
    "context_prune": """
        DELETE FROM turn_contexts WHERE ctid IN (
            SELECT ctid FROM turn_contexts WHERE create_time < $1 ORDER BY create_time LIMIT $2)""",
}


@dataclass(frozen=True)
class LedgerEntry:
    """A hint already answered this run: the selected notes (as rows) and how many were shown."""

    notes: list[dict[str, Any]]
    shown: int


@dataclass(frozen=True)
class Reservation:
    """What the ledger decided for one refresh.

    ``cached``: a repeat of an answered hint (``entry`` holds its rows; nothing spent);
    ``refused``: the run has spent its cap; ``reserved``: a slot was spent for a fresh filter run.
    ``spent`` is the run's count after the decision.
    """

    outcome: Literal["cached", "refused", "reserved"]
    spent: int
    entry: LedgerEntry | None = None


class RunKey(NamedTuple):
    """Which run a frozen turn context is of: one seat's run id."""

    company: str
    seat: str
    turn_id: str


@dataclass(frozen=True)
class FrozenContext:
    """A run's turn context as stored: ``building`` (claimed by a call still building it) or
    ``built`` (``context`` holds it)."""

    state: Literal["building", "built"]
    context: dict[str, Any] | None
    claim_time: datetime


LEASE_FIRST_PAUSE = 0.01
LEASE_LONGEST_PAUSE = 0.2
"""Seconds between a waiting guard's tries for a busy lease: doubling from the first to the longest
(each with jitter), no connection held in between."""


class PostgresPrefetchStore:
    def __init__(self, pool: asyncpg.Pool):
        self._pool = pool

    @property
    def pool(self) -> asyncpg.Pool:
        return self._pool

    @contextlib.asynccontextmanager
    async def one_at_a_time(
        self, run: RunKey, *, hold_for: float, keep_runs: int, now: datetime
    ) -> AsyncIterator[None]:
        """Serialise work on ``run`` across every replica: a lease on the run's ledger row, taken
        by one short statement, held for at most ``hold_for`` seconds (the guarded work's own
        bound), and cleared by its holder when the work is done. The row is created here when the
        run has none yet (and the seat's oldest runs evicted, as :meth:`reserve` does).

        No connection is held while the work runs. The guard was a transaction-level advisory lock
        on a pooled connection kept for the whole call, through the filter's model call (up to
        ``aux_timeout_seconds``): capped at half the pool so the work itself could get connections,
        one tenant's few slow refreshes then held every slot and every other tenant's refresh
        queued behind them. A caller finding the lease busy waits holding nothing and tries again
        (:data:`LEASE_FIRST_PAUSE` doubling to :data:`LEASE_LONGEST_PAUSE`), bounded by the
        holder's release or, should the holder die, its lease lapsing. Not LISTEN/NOTIFY: a
        listener needs a session of its own, which PgBouncer in transaction mode does not keep.

        Every statement is its own transaction, so a pooler in transaction mode keeps nothing
        between them. The per-turn cap does not rest on the lease (:meth:`reserve` spends a slot
        under the row's lock): a holder outliving its lease could at worst let a second call of
        the run run its filter alongside it."""
        if keep_runs < 1:
            raise RuntimeError("refresh ledger keeps no runs (refresh_ledger_runs < 1)")
        holder = uuid.uuid4()
        pause = LEASE_FIRST_PAUSE
        while not await self._take_lease(run, holder, hold_for, keep_runs, now):
            await asyncio.sleep(pause * random.uniform(0.5, 1.5))
            pause = min(pause * 2, LEASE_LONGEST_PAUSE)
        try:
            yield
        finally:
            try:
                await self._pool.execute(SQL["lease_release"], *run, holder)
            except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError) as err:
                # The work is done and its answer stands; the lease lapses at its bound instead.
                _log.warning("one_at_a_time: the lease of %s was not released (it lapses): %s", run.turn_id, err)

    async def _take_lease(self, run: RunKey, holder: uuid.UUID, hold_for: float, keep_runs: int, now: datetime) -> bool:
        async with self._pool.acquire() as conn, conn.transaction():
            created = await conn.fetchval(SQL["run_insert"], *run, now)
            if created is not None:
                await conn.execute(SQL["run_evict"], run.company, run.seat, keep_runs)
            return await conn.fetchval(SQL["lease_take"], *run, holder, hold_for) is not None

    # ------------------------------------------------------------------ onboarding markers

    async def marker(self, company: str, seat: str) -> str | None:
        marker: str | None = await self._pool.fetchval(SQL["marker"], company, seat)
        return marker

    async def mark_onboarded(self, company: str, seat: str, chain_hash: str, chain: list[str], now: datetime) -> None:
        await self._pool.execute(SQL["mark"], company, seat, chain_hash, chain, now)

    # ------------------------------------------------------------------ refresh ledger

    async def reserve(
        self, company: str, seat: str, turn_id: str, hint_key: str, cap: int, keep_runs: int, now: datetime
    ) -> Reservation:
        """Answer a repeat from the ledger, refuse past the cap, or spend one slot."""
        async with self._pool.acquire() as conn, conn.transaction():
            created = await conn.fetchval(SQL["run_insert"], company, seat, turn_id, now)
            if created is not None:
                await conn.execute(SQL["run_evict"], company, seat, keep_runs)
            spent = await conn.fetchval(SQL["run_lock"], company, seat, turn_id)
            if spent is None:  # evicted by its own insert: only when keep_runs < 1
                raise RuntimeError("refresh ledger keeps no runs (refresh_ledger_runs < 1)")
            row = await conn.fetchrow(SQL["hint_get"], company, seat, turn_id, hint_key)
            if row is not None and row["status"] == "answered":
                return Reservation("cached", spent, LedgerEntry(json.loads(row["notes"]), row["shown"]))
            if spent >= cap:
                return Reservation("refused", spent)
            await conn.execute(SQL["run_spend"], company, seat, turn_id)
            return Reservation("reserved", spent + 1)

    async def record_answer(
        self, company: str, seat: str, turn_id: str, hint_key: str, hint: str, answer: LedgerEntry, now: datetime
    ) -> None:
        await self._put(company, seat, turn_id, hint_key, hint, "answered", json.dumps(answer.notes), answer.shown, now)

    async def record_failure(
        self, company: str, seat: str, turn_id: str, hint_key: str, hint: str, now: datetime
    ) -> None:
        await self._put(company, seat, turn_id, hint_key, hint, "failed", "[]", 0, now)

    async def _put(self, *row: Any) -> None:
        """One hint's ledger row: ``hint_put``'s parameters in order (run, hint key, hint, status,
        notes as JSON, shown, time), as the two public writers above name them."""
        try:
            await self._pool.execute(SQL["hint_put"], *row)
        except asyncpg.ForeignKeyViolationError:
            pass  # the run was evicted meanwhile (257 newer runs of the seat): nothing to remember

    async def record_shown(
        self, company: str, seat: str, turn_id: str, hint_key: str, shown: int, now: datetime
    ) -> None:
        await self._pool.execute(SQL["hint_shown"], company, seat, turn_id, hint_key, shown, now)

    async def runs(self, company: str) -> int:
        count: int = await self._pool.fetchval(SQL["runs_count"], company)
        return count

    # ------------------------------------------------------------------ frozen turn contexts

    # The run's claim and its frozen context are a turn start's own records (a duplicate call and
    # a self_iterate round read them): their commits do not wait for the disk (``unflushed``).

    async def claim_context(self, run: RunKey, now: datetime) -> bool:
        """True when this call is the first for the run and now builds its context."""
        async with unflushed(self._pool) as conn:
            return await conn.fetchval(SQL["context_claim"], *run, now) is not None

    async def claim_context_reading_marker(self, run: RunKey, now: datetime) -> tuple[bool, str | None]:
        """:meth:`claim_context` and :meth:`marker` in one statement."""
        async with unflushed(self._pool) as conn:
            row = await conn.fetchrow(SQL["context_claim_marker"], *run, now)
        assert row is not None
        return bool(row["claimed"]), row["marker"]

    async def frozen_context(self, run: RunKey) -> FrozenContext | None:
        row = await self._pool.fetchrow(SQL["context_get"], *run)
        if row is None:
            return None
        context = json.loads(row["context"]) if row["context"] is not None else None
        return FrozenContext(row["state"], context, row["claim_time"])

    async def take_over_context(self, run: RunKey, stale_before: datetime, now: datetime) -> datetime | None:
        taken: datetime | None = await self._pool.fetchval(SQL["context_take_over"], *run, stale_before, now)
        return taken

    async def save_context(
        self,
        run: RunKey,
        context: dict[str, Any],
        now: datetime,
        claim: datetime,
        bookkeeping: Bookkeeping | None = None,
    ) -> bool:
        """Freeze the built context if the run is still claimed by ``claim`` (the caller's own);
        True if this call froze it. With ``bookkeeping``, the request's events and token charges
        are written by the same statement, and only if the context is (one round trip, one commit
        on the turn's path); a save that does not land leaves them held for the caller.

        Should PostgreSQL refuse the combined statement (nothing written), the context is saved
        alone and the bookkeeping written on its own, best-effort. Should its outcome be unknown
        (the connection lost, maybe after the commit), the bookkeeping is never written twice: see
        :meth:`_save_unknown`."""
        saved = json.dumps(context)
        if bookkeeping is None or not (len(bookkeeping) or bookkeeping.announced):
            return await self._save_alone(run, saved, now, claim)
        held, args = held_events(bookkeeping, 7, "EXISTS (SELECT 1 FROM saved)")
        sql = f"WITH saved AS ({SQL['context_save']}){held} SELECT EXISTS (SELECT 1 FROM saved)"
        try:
            # One statement: the bookkeeping as common table expressions of the save (one commit).
            async with unflushed(self._pool) as conn:
                landed = bool(await conn.fetchval(sql, *run, saved, now, claim, *args))
        except BaseException as err:
            if refused_by_server(err):
                bookkeeping.reopen()
                _log.warning("turn context and its bookkeeping not written together (%s); writing them apart", err)
                return await self._save_then_bookkeeping(run, saved, now, claim, bookkeeping)
            if not isinstance(err, Exception):
                bookkeeping.abandon()
                raise
            _log.warning("turn context's save has an unknown outcome (%s); saving it again", err)
            return await self._save_unknown(run, saved, now, claim, bookkeeping)
        else:
            bookkeeping.settle(landed)
            return landed

    async def _save_then_bookkeeping(
        self, run: RunKey, saved: str, now: datetime, claim: datetime, bookkeeping: Bookkeeping
    ) -> bool:
        landed = await self._save_alone(run, saved, now, claim)
        if landed:
            await write_bookkeeping(self._pool, bookkeeping)
        return landed

    async def _save_unknown(
        self, run: RunKey, saved: str, now: datetime, claim: datetime, bookkeeping: Bookkeeping
    ) -> bool:
        """After a combined save whose outcome is unknown: the context saved again, alone. Landing,
        it proves the first did not commit (it would have left the row built), so the bookkeeping
        is written now, once. Not landing, the first may have committed it: the rows are dropped
        (``Bookkeeping.abandon``: at most once) and the caller answers with the frozen context."""
        try:
            landed = await self._save_alone(run, saved, now, claim)
        except BaseException:
            bookkeeping.abandon()
            raise
        if not landed:
            bookkeeping.abandon()
            return False
        bookkeeping.reopen()
        await write_bookkeeping(self._pool, bookkeeping)
        return True

    async def _save_alone(self, run: RunKey, saved: str, now: datetime, claim: datetime) -> bool:
        async with unflushed(self._pool) as conn:
            return await conn.fetchval(SQL["context_save"], *run, saved, now, claim) is not None

    async def release_context(self, run: RunKey, claim: datetime) -> None:
        await self._pool.execute(SQL["context_release"], *run, claim)

    async def write_bookkeeping(self, batch: Bookkeeping) -> None:
        await write_bookkeeping(self._pool, batch)

    async def prune_contexts(self, before: datetime, limit: int = 500) -> int:
        """Forget contexts built before ``before`` (at most ``limit`` a call: bounded work)."""
        status = await self._pool.execute(SQL["context_prune"], before, limit)
        return int(status.split()[-1])
