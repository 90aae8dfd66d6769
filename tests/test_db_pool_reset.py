"""A pooled connection goes back to the pool without the reset round trip after plain statements,
and with it after any statement that may leave session state behind (a session advisory lock, a
setting, a LISTEN): the next borrower finds a clean session either way (libs/common/db.py)."""

from __future__ import annotations

import asyncpg

from libs.common.db import connect_pool


async def last_statement(dsn: str, pid: int) -> str:
    """What the pooled session last ran, seen from another connection."""
    other = await asyncpg.connect(dsn)
    try:
        query: str = await other.fetchval("SELECT query FROM pg_stat_activity WHERE pid = $1", pid)
        return query
    finally:
        await other.close()


async def test_a_plain_statement_returns_its_connection_without_the_reset_statement(dsn):
    pool = await connect_pool(dsn, min_size=1, max_size=1)  # one session, borrowed again and again
    try:
        pid = await pool.fetchval("SELECT pg_backend_pid()")
        assert await pool.fetchval("SELECT 41 + 1 AS plain") == 42
        assert (await last_statement(dsn, pid)).strip() == "SELECT 41 + 1 AS plain"
        async with pool.acquire() as conn, conn.transaction():
            await conn.execute("CREATE TABLE t (x int)")
        assert "RESET ALL" not in await last_statement(dsn, pid)
    finally:
        await pool.close()


async def test_session_state_left_by_a_borrower_is_reset_before_the_next_one(dsn):
    pool = await connect_pool(dsn, min_size=1, max_size=1)
    try:
        pid = await pool.fetchval("SELECT pg_backend_pid()")
        default_name = await pool.fetchval("SHOW application_name")
        await pool.execute("SET application_name = 'leaky'")
        assert "RESET ALL" in await last_statement(dsn, pid)
        assert await pool.fetchval("SHOW application_name") == default_name
        assert await pool.fetchval("SELECT pg_backend_pid()") == pid  # the same session, cleaned

        await pool.execute("SELECT pg_advisory_lock(4242)")  # never unlocked by its borrower
        other = await asyncpg.connect(dsn)
        try:
            assert await other.fetchval("SELECT pg_try_advisory_lock(4242)") is True
        finally:
            await other.close()

        await pool.execute("LISTEN some_channel")
        assert await pool.fetchval("SELECT count(*) FROM pg_listening_channels()") == 0

        await pool.fetchval("SELECT set_config('application_name', 'leaky2', false)")
        assert await pool.fetchval("SHOW application_name") == default_name
        # ...and once clean, plain statements go back without the reset again.
        await pool.fetchval("SELECT 7 AS plain_again")
        assert (await last_statement(dsn, pid)).strip() == "SELECT 7 AS plain_again"
    finally:
        await pool.close()
