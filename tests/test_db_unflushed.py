"""``unflushed``: a turn start's own records commit without waiting for the WAL flush — in one
transaction with ``synchronous_commit = off`` for that transaction only (libs/common/db.py). The
write is committed and visible to everyone at once; the setting does not outlive it; a failure
rolls it back and leaves the session clean; no reset round trip follows."""

from __future__ import annotations

import asyncpg
import pytest

from libs.common.db import connect_pool, unflushed
from tests.test_db_pool_reset import last_statement


async def test_a_write_commits_visibly_without_waiting_and_the_setting_ends_with_it(dsn):
    pool = await connect_pool(dsn, min_size=1, max_size=1)  # one session, so the next borrow is the same
    other = await asyncpg.connect(dsn)
    try:
        await pool.execute("CREATE TABLE uf (x int)")
        pid = await pool.fetchval("SELECT pg_backend_pid()")
        async with unflushed(pool) as conn:
            assert await conn.fetchval("SHOW synchronous_commit") == "off"
            assert conn.is_in_transaction()
            await conn.execute("INSERT INTO uf VALUES (1)")
            assert await other.fetchval("SELECT count(*) FROM uf") == 0  # not before its commit
        assert await other.fetchval("SELECT count(*) FROM uf") == 1  # committed, seen at once
        assert "COMMIT" in await last_statement(dsn, pid)  # no RESET ALL after a SET LOCAL
        assert await pool.fetchval("SHOW synchronous_commit") == "on"  # this transaction only
        assert await pool.fetchval("SELECT pg_backend_pid()") == pid
    finally:
        await other.close()
        await pool.close()


async def test_a_failed_write_is_rolled_back_and_the_session_is_usable(dsn):
    pool = await connect_pool(dsn, min_size=1, max_size=1)
    try:
        await pool.execute("CREATE TABLE uf2 (x int PRIMARY KEY)")
        with pytest.raises(asyncpg.UniqueViolationError):
            async with unflushed(pool) as conn:
                await conn.execute("INSERT INTO uf2 VALUES (1)")
                await conn.execute("INSERT INTO uf2 VALUES (1)")
        assert await pool.fetchval("SELECT count(*) FROM uf2") == 0  # the first insert went too
        async with pool.acquire() as conn:
            assert not conn.is_in_transaction()
            assert await conn.fetchval("SHOW synchronous_commit") == "on"
    finally:
        await pool.close()
