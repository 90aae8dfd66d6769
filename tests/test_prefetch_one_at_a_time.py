"""``PostgresPrefetchStore.one_at_a_time``, the guard that runs one turn's ``refresh_memory`` calls
one at a time on every replica (services/prefetch/builtins.py), holds no session state: its lock
lives in a transaction on one connection and ends with it. A session lock taken and released by
two statements broke behind PgBouncer in transaction mode (production): the unlock ran on another
server connection, the lock stayed granted, and the turn's next refresh waited out its deadline.

The tests through PgBouncer need the ``pgbouncer`` binary, which the project does not install:
without it they skip; the direct tests check the same guarantees on the embedded server alone."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import asyncpg
import pytest

from libs.common.db import connect_pool
from services.prefetch.store import PostgresPrefetchStore
from tests.support.pgbouncer import pgbouncer

KEY = "\x1f".join(("refresh_memory", "acme", "ana", "run-1"))
WAIT = 5.0  # far past any lock hand-over here; a guard left held would block forever instead

ADVISORY = """
    SELECT count(*) FROM pg_locks
    WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"""


async def advisory_locks(direct: asyncpg.Connection, *, granted: bool = True) -> int:
    count: int = await direct.fetchval(ADVISORY + " AND granted = $1", granted)
    return count


async def until(check: Callable[[], Awaitable[object]]) -> None:
    """Polls ``check`` (a state of the server seen from another connection) until true, bounded."""
    async with asyncio.timeout(WAIT):
        while not await check():
            await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def route(dsn: str, via: str) -> AsyncIterator[str]:
    """``dsn`` itself, or ``dsn`` through a PgBouncer in transaction mode."""
    if via == "direct":
        yield dsn
    else:
        async with pgbouncer(dsn) as through:
            yield through


async def test_one_key_is_served_one_at_a_time_in_a_transaction_and_leaves_no_lock_behind(dsn: str) -> None:
    pool = await connect_pool(dsn, max_size=4)
    direct = await asyncpg.connect(dsn)
    store = PostgresPrefetchStore(pool)
    order: list[str] = []
    entered, release = asyncio.Event(), asyncio.Event()

    async def first() -> None:
        async with store.one_at_a_time(KEY):
            order.append("first in")
            entered.set()
            await release.wait()
            order.append("first out")

    async def second() -> None:
        async with store.one_at_a_time(KEY):
            order.append("second in")

    holder = asyncio.create_task(first())
    waiter: asyncio.Task[None] | None = None
    try:
        await entered.wait()
        # The holder's lock is its transaction's, not its session's: what a pooler in transaction
        # mode (which hands a session's server connection to others between transactions) keeps.
        in_tx = await direct.fetchval(
            "SELECT a.xact_start IS NOT NULL FROM pg_locks l JOIN pg_stat_activity a USING (pid)"
            " WHERE l.locktype = 'advisory' AND l.granted"
        )
        assert in_tx is True
        async with asyncio.timeout(WAIT), store.one_at_a_time(KEY + "-other"):
            pass  # another run's refresh is not held up

        waiter = asyncio.create_task(second())
        await until(lambda: advisory_locks(direct, granted=False))  # the second caller waits for the lock
        assert order == ["first in"]
        release.set()
        async with asyncio.timeout(WAIT):
            await asyncio.gather(holder, waiter)
        assert order == ["first in", "first out", "second in"]
        assert await advisory_locks(direct) == 0

        with pytest.raises(RuntimeError):  # a failed refresh lets go of the guard too
            async with store.one_at_a_time(KEY):
                raise RuntimeError("the diary was down")
        assert await advisory_locks(direct) == 0
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
    the most recently used idle server connection to the next transaction, so a request that
    starts one inside the guarded section lands on the connection that took a session lock, and
    the unlock went to another one; the lock stayed and the third refresh hung."""
    async with pgbouncer(dsn) as through:
        pool = await connect_pool(through, max_size=4, statement_cache_size=0)
        direct = await asyncpg.connect(dsn)
        store = PostgresPrefetchStore(pool)
        try:
            for _ in range(3):
                async with asyncio.timeout(WAIT):
                    async with pool.acquire() as other:
                        async with store.one_at_a_time(KEY):
                            busy = other.transaction()  # another request's transaction meanwhile
                            await busy.start()
                            await other.fetchval("SELECT 1")
                        await busy.rollback()
                assert await advisory_locks(direct) == 0
        finally:
            await direct.close()
            await pool.close()


@pytest.mark.parametrize("via", ["direct", "pgbouncer"])
async def test_a_process_dying_inside_the_guard_leaves_no_lock_behind(dsn: str, via: str) -> None:
    """A replica killed mid-refresh: its connections drop without a word. The lock must go with
    them, also when a pooler keeps the server connection for the next client."""
    async with route(dsn, via) as url:
        dying = await connect_pool(url, max_size=2, statement_cache_size=0)
        entered = asyncio.Event()

        async def refresh_that_never_ends() -> None:
            async with PostgresPrefetchStore(dying).one_at_a_time(KEY):
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
            # Seen from the server, before anyone else asks (a later session lock taken on the same
            # pooled server connection would be granted over a leaked one, and hide it).
            await until(lambda: _none_held(direct))
            async with asyncio.timeout(WAIT), PostgresPrefetchStore(survivor).one_at_a_time(KEY):
                pass
        finally:
            await survivor.close()
            await direct.close()


async def _none_held(direct: asyncpg.Connection) -> bool:
    return await advisory_locks(direct) == 0
