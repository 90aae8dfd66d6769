"""Postgres lease claims for the passes: one holder at a time, takeover on expiry with a new
fence, release, and fail-closed when the claim's state cannot be read."""

from __future__ import annotations

import asyncpg

from libs.common.leases import PostgresLeaseClaimer
from libs.common.passrunner import PassSpec, run_pass


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
