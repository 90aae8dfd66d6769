"""``PostgresPrefetchStore.one_at_a_time``, the guard that runs one turn's ``refresh_memory`` calls
one at a time on every replica (services/prefetch/builtins.py): a lease on the run's ledger row,
taken and released by single statements, holding no connection (and no session state) while held.
A session lock taken and released by two statements broke behind PgBouncer in transaction mode
(production): the unlock ran on another server connection, the lock stayed granted, and the turn's
next refresh waited out its deadline. A transaction-level lock kept a pooled connection through the
filter's model call (test_prefetch_refresh_lease.py).

The tests through PgBouncer need the ``pgbouncer`` binary, which the project does not install:
without it they skip; the direct tests check the same guarantees on the embedded server alone."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime

import asyncpg
import pytest

from libs.common.db import connect_pool
from services.prefetch.store import PostgresPrefetchStore, RunKey
from tests.support.pgbouncer import pgbouncer

RUN = RunKey("acme", "ana", "run-1")
NOW = datetime(2026, 1, 1, tzinfo=UTC)
HOLD = 60.0  # the lease's bound: far past these tests, so only a release lets the next caller in
WAIT = 5.0  # far past any hand-over here; a guard left held would block forever instead

LEASE = "SELECT busy_until, lease_holder FROM refresh_ledger_runs WHERE company = $1 AND seat = $2 AND turn_id = $3"


def guard(
    store: PostgresPrefetchStore, run: RunKey = RUN, hold_for: float = HOLD
) -> contextlib.AbstractAsyncContextManager[None]:
    return store.one_at_a_time(run, hold_for=hold_for, keep_runs=256, now=NOW)


async def leased(direct: asyncpg.Connection, run: RunKey = RUN) -> bool:
    row = await direct.fetchrow(LEASE, *run)
    return row is not None and row["lease_holder"] is not None


async def until(check: Callable[[], Awaitable[object]]) -> None:
    """Polls ``check`` (a state seen from elsewhere) until true, bounded."""
    async with asyncio.timeout(WAIT):
        while not await check():
            await asyncio.sleep(0.01)


def turned_away(store: PostgresPrefetchStore) -> list[uuid.UUID]:
    """Records each try that found the lease busy (the store's own take, wrapped)."""
    take, seen = store._take_lease, []

    async def counting(run, holder, *rest):  # type: ignore[no-untyped-def]
        took = await take(run, holder, *rest)
        if not took:
            seen.append(holder)
        return took

    store._take_lease = counting  # type: ignore[method-assign]
    return seen


@contextlib.asynccontextmanager
async def route(dsn: str, via: str) -> AsyncIterator[str]:
    """``dsn`` itself, or ``dsn`` through a PgBouncer in transaction mode."""
    if via == "direct":
        yield dsn
    else:
        async with pgbouncer(dsn) as through:
            yield through


async def test_one_run_is_served_one_at_a_time_holding_no_connection_and_leaves_no_lease_behind(dsn: str) -> None:
    pool = await connect_pool(dsn, max_size=1)  # one connection: a guard holding it would block all below
    direct = await asyncpg.connect(dsn)
    store = PostgresPrefetchStore(pool)
    refused = turned_away(store)
    order: list[str] = []
    entered, release = asyncio.Event(), asyncio.Event()

    async def first() -> None:
        async with guard(store):
            order.append("first in")
            entered.set()
            await release.wait()
            order.append("first out")

    async def second() -> None:
        async with guard(store):
            order.append("second in")

    holder = asyncio.create_task(first())
    waiter: asyncio.Task[None] | None = None
    try:
        await entered.wait()
        assert await leased(direct)
        async with asyncio.timeout(WAIT):
            assert await pool.fetchval("SELECT 1") == 1  # the pool's one connection is free meanwhile
            async with guard(store, RunKey("acme", "ana", "run-2")):
                pass  # another run's refresh is not held up

        waiter = asyncio.create_task(second())
        await until(lambda: _true(len(refused) > 0))  # the second caller found the lease busy
        assert order == ["first in"]
        release.set()
        async with asyncio.timeout(WAIT):
            await asyncio.gather(holder, waiter)
        assert order == ["first in", "first out", "second in"]
        assert not await leased(direct)

        with pytest.raises(RuntimeError):  # a failed refresh lets go of the guard too
            async with guard(store):
                raise RuntimeError("the diary was down")
        assert not await leased(direct)
    finally:
        for task in (holder, waiter):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, asyncpg.InterfaceError):
                    await task
        await direct.close()
        await pool.close()


async def test_through_pgbouncer_the_guard_is_released_while_the_pool_serves_others(dsn: str) -> None:
    """The reviewer's case: other requests use the replica's pool during a refresh. PgBouncer gives
    the most recently used idle server connection to the next transaction; nothing of the guard
    may depend on which server connection a statement lands on."""
    async with pgbouncer(dsn) as through:
        pool = await connect_pool(through, max_size=4, statement_cache_size=0)
        direct = await asyncpg.connect(dsn)
        store = PostgresPrefetchStore(pool)
        try:
            for _ in range(3):
                async with asyncio.timeout(WAIT):
                    async with pool.acquire() as other:
                        async with guard(store):
                            busy = other.transaction()  # another request's transaction meanwhile
                            await busy.start()
                            await other.fetchval("SELECT 1")
                        await busy.rollback()
                assert not await leased(direct)
        finally:
            await direct.close()
            await pool.close()


@pytest.mark.parametrize("via", ["direct", "pgbouncer"])
async def test_a_process_dying_inside_the_guard_lets_the_next_in_when_its_lease_lapses(dsn: str, via: str) -> None:
    """A replica killed mid-refresh never releases its lease: the next caller gets in once the
    lease's bound has passed (on the database's clock), not before and not never."""
    async with route(dsn, via) as url:
        dying = await connect_pool(url, max_size=2, statement_cache_size=0)
        entered = asyncio.Event()

        async def refresh_that_never_ends() -> None:
            async with guard(PostgresPrefetchStore(dying), hold_for=1.0):
                entered.set()
                await asyncio.Event().wait()

        holder = asyncio.create_task(refresh_that_never_ends())
        await entered.wait()
        dying.terminate()  # the process's sockets close; nothing is sent
        holder.cancel()
        with contextlib.suppress(asyncio.CancelledError, asyncpg.InterfaceError):
            await holder  # (its own end is moot: the process is gone)

        direct = await asyncpg.connect(dsn)
        survivor = await connect_pool(url, max_size=2, statement_cache_size=0)
        try:
            assert await leased(direct)  # the dead holder's lease is still there
            lapses = (await direct.fetchrow(LEASE, *RUN))["busy_until"]
            async with asyncio.timeout(WAIT), guard(PostgresPrefetchStore(survivor)):
                assert await direct.fetchval("SELECT clock_timestamp() >= $1", lapses)
            assert not await leased(direct)
        finally:
            await survivor.close()
            await direct.close()


async def _true(value: bool) -> bool:
    return value
