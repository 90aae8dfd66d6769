"""The vector fill's minute is the deployment's, not a process's: the request count and the
provider's "not now" live in Postgres (``fill_requests``), so two ledgers on one database — two
processes, as the diary, episode and knowledge fill pods of a Kubernetes deployment are — share
the sixteen requests and the minute's end (spec: "sixteen requests a node ... a rate limit ...
ends the minute for every seat"). Each used to count in its own memory: three pods sent up to 48
requests a minute, and a rate limit met by one did not stop the others."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from libs.common.db import connect_pool
from libs.common.fill import PostgresRequestLedger

LIMIT = 16
MINUTE = datetime(2026, 3, 1, 9, 30, 5, tzinfo=UTC)


async def test_two_processes_share_the_sixteen_requests_of_a_minute(dsn: str) -> None:
    pools = [await connect_pool(dsn, max_size=4) for _ in range(2)]
    try:
        diary, episodes = (PostgresRequestLedger(p) for p in pools)
        # Both take at once, 20 each: the minute counts sixteen in all, whoever took them.
        verdicts = await asyncio.gather(
            *(
                ledger.take(MINUTE + timedelta(seconds=i % 50), LIMIT, 1)
                for i in range(20)
                for ledger in (diary, episodes)
            )
        )
        assert verdicts.count(None) == LIMIT
        assert set(verdicts) == {None, "requests"}
        assert await diary.take(MINUTE, LIMIT, 1) == "requests"
        assert await episodes.take(MINUTE, LIMIT, 1) == "requests"
        # A spent budget is not the provider ending the minute.
        assert await diary.ended(MINUTE) is None and await episodes.ended(MINUTE) is None
        # The next minute is a fresh sixteen for both.
        assert await episodes.take(MINUTE + timedelta(minutes=1), LIMIT, 1) is None
    finally:
        for pool in pools:
            await pool.close()


async def test_a_request_that_needs_room_for_the_probe_counts_only_if_both_fit(dsn: str) -> None:
    pools = [await connect_pool(dsn, max_size=2) for _ in range(2)]
    try:
        one, other = (PostgresRequestLedger(p) for p in pools)
        assert await one.take(MINUTE, 3, 3) is None  # the first of the minute, room for 3
        assert await other.take(MINUTE, 3, 2) is None  # 1 sent, 2 more fit
        assert await one.take(MINUTE, 3, 2) == "requests"  # 2 sent: a request and its probe do not
        assert await other.take(MINUTE, 3, 1) is None  # the probe alone does
        assert await one.take(MINUTE, 3, 1) == "requests"
        assert await other.take(MINUTE + timedelta(minutes=1), 3, 4) == "requests"  # never fits: nothing counted
        assert await other.take(MINUTE + timedelta(minutes=1), 3, 3) is None
    finally:
        for pool in pools:
            await pool.close()


async def test_a_minute_one_process_was_told_not_now_is_ended_for_every_process(dsn: str) -> None:
    pools = [await connect_pool(dsn, max_size=2) for _ in range(2)]
    try:
        diary, knowledge = (PostgresRequestLedger(p) for p in pools)
        assert await diary.take(MINUTE, LIMIT, 2) is None
        await diary.end(MINUTE, "rate_limited")
        await knowledge.end(MINUTE, "timeout")  # the first reason stays
        assert await knowledge.ended(MINUTE + timedelta(seconds=30)) == "rate_limited"
        assert await knowledge.take(MINUTE + timedelta(seconds=30), LIMIT, 1) == "rate_limited"
        assert await diary.take(MINUTE, LIMIT, 1) == "rate_limited"
        # Ended before anything was sent in it, too.
        nxt = MINUTE + timedelta(minutes=1)
        await knowledge.end(nxt, "unavailable")
        assert await diary.take(nxt, LIMIT, 1) == "unavailable"
        # And the minute after is open to all.
        later = MINUTE + timedelta(minutes=2)
        assert await diary.ended(later) is None
        assert await knowledge.take(later, LIMIT, 2) is None
    finally:
        for pool in pools:
            await pool.close()


async def test_minutes_an_hour_gone_are_pruned_when_a_minute_starts(dsn: str) -> None:
    pool = await connect_pool(dsn, max_size=2)
    try:
        ledger = PostgresRequestLedger(pool)
        for minutes in range(0, 100, 10):
            assert await ledger.take(MINUTE + timedelta(minutes=minutes), LIMIT, 1) is None
            await pool.execute(
                "INSERT INTO fill_budget (company, window_start, bytes) VALUES ('acme', $1, 10)",
                MINUTE + timedelta(minutes=minutes),
            )
        assert await ledger.ended(MINUTE + timedelta(minutes=100)) is None
        left = await pool.fetchval("SELECT count(*) FROM fill_requests")
        assert left == 6  # minutes 40..90: within the hour before minute 100
        # The byte budget's minutes go with them (it was never pruned: a row a company a minute).
        assert await pool.fetchval("SELECT count(*) FROM fill_budget") == 6
    finally:
        await pool.close()
