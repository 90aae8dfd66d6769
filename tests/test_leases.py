"""Postgres lease claims for the passes: one holder at a time, takeover on expiry with a new
fence, release, and fail-closed when the claim's state cannot be read."""

from __future__ import annotations

import asyncpg

from libs.common.leases import PostgresLeaseClaimer
from libs.common.passrunner import LEASE_LOST, PassSpec, run_pass


async def test_one_holder_at_a_time_takeover_after_expiry_bumps_the_fence(dsn, clock):
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
    try:
        leases = PostgresLeaseClaimer(pool, clock)
        a = await leases.claim("diary-fill", "node-a", 60)
        assert a is not None and a.fence == 1
        assert await leases.claim("diary-fill", "node-b", 60) is None
        again = await leases.claim("diary-fill", "node-a", 60)  # the holder renews
        assert again is not None and again.fence == 1
        clock.advance(seconds=61)
        b = await leases.claim("diary-fill", "node-b", 60)
        assert b is not None and b.fence == 2
        await leases.release(b)
        c = await leases.claim("diary-fill", "node-c", 60)
        assert c is not None and c.fence == 3
        assert await leases.claim("diary-sweep", "node-a", 60) is not None  # leases are per pass
    finally:
        await pool.close()


async def test_an_unreadable_claim_fails_closed(dsn, clock):
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=1)
    leases = PostgresLeaseClaimer(pool, clock)
    await pool.close()  # the store cannot be reached
    assert await leases.claim("diary-fill", "node-a", 60) is None
    ran = []

    async def work() -> None:
        ran.append(True)

    done, _ = await run_pass(PassSpec("diary-fill", work, 60), leases, "node-a", 60)
    assert not done and ran == []


async def test_a_pass_runs_once_under_its_lease_and_releases_it(dsn, clock):
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
    try:
        leases = PostgresLeaseClaimer(pool, clock)

        async def work() -> str:
            # While it runs, nobody else can claim the pass.
            assert await leases.claim("diary-sweep", "other", 60) is None
            return "swept"

        assert await run_pass(PassSpec("diary-sweep", work, 3600), leases, "me", 60) == (True, "swept")
        assert await leases.claim("diary-sweep", "other", 60) is not None  # released at the end
    finally:
        await pool.close()


async def test_a_pass_renews_its_lease_while_it_runs_and_stops_when_it_loses_it(dsn, clock):
    """TTL 1 s: the pass outlives its first grant, so it renews; then a peer's takeover (the lease
    row changed under it) refuses the renewal and the pass is stopped rather than run on."""
    import asyncio

    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=3)
    try:
        from libs.common.clock import SystemClock

        leases = PostgresLeaseClaimer(pool, SystemClock())
        renewed = asyncio.Event()
        stolen = asyncio.Event()

        async def long_pass() -> str:
            first = await pool.fetchval("SELECT expire_time FROM leases WHERE name = 'episode-lifecycle'")
            async with asyncio.timeout(10):
                while await pool.fetchval("SELECT expire_time FROM leases WHERE name = 'episode-lifecycle'") == first:
                    await asyncio.sleep(0.05)
            renewed.set()  # the runner extended the claim while we worked
            await pool.execute("UPDATE leases SET holder = 'peer', expire_time = now() + interval '1 hour'")
            stolen.set()
            await asyncio.sleep(30)  # would run on; the lost renewal must stop it
            return "ran to the end"

        ran, result = await asyncio.wait_for(
            run_pass(PassSpec("episode-lifecycle", long_pass, 3600), leases, "me", 1), 20
        )
        assert renewed.is_set() and stolen.is_set()
        assert (ran, result) == (False, LEASE_LOST)  # stopped partway, and says so
    finally:
        await pool.close()
