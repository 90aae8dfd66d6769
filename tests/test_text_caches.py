"""An erasure empties every process's caches of people's text, not only the one the privacy
service's call reached (issue 17): the erasing process announces it on a PostgreSQL channel, and
every serving process follows that channel (``libs.common.text_caches``)."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import uuid
from pathlib import Path

import asyncpg
import grpc
import pytest

from agentlearn.common.v1 import erasure_pb2
from agentlearn.diary.v1 import diary_service_pb2 as pb
from agentlearn.diary.v1 import diary_service_pb2_grpc as pb_grpc
from libs.common import text_caches
from tests.support.runner import clean_env, start


class _Cache:
    """A cache that says when it was emptied."""

    def __init__(self) -> None:
        self.emptied = asyncio.Event()

    def clear(self) -> None:
        self.emptied.set()


async def test_a_follower_empties_its_caches_when_an_erasure_is_announced(dsn):
    cache = _Cache()
    text_caches.track(cache)
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=1)
    follower = asyncio.create_task(text_caches.follow(dsn, pool, poll_seconds=3600))  # the notice alone
    try:
        async with asyncio.timeout(30):
            await cache.emptied.wait()  # emptied once on connecting: a notice meanwhile told nobody
        cache.emptied.clear()
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute("SELECT pg_notify($1, 'some other payload')", text_caches.CHANNEL)
            await conn.execute("SELECT pg_notify($1, 'erased')", text_caches.CHANNEL)
        finally:
            await conn.close()
        async with asyncio.timeout(30):
            await cache.emptied.wait()
    finally:
        follower.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await follower
        await pool.close()


async def test_a_follower_that_hears_no_notice_empties_its_caches_when_the_count_moved(dsn):
    """The backstop: a notice the follower could not hear (PgBouncer in transaction mode carries
    none; a lost connection) is caught by reading the erasures' count."""
    cache = _Cache()
    text_caches.track(cache)
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
    deaf = "postgresql://nobody@127.0.0.1:1/none"  # its LISTEN never connects
    follower = asyncio.create_task(text_caches.follow(deaf, pool, poll_seconds=0.05))
    try:
        # Its first read is the baseline: nothing emptied while nothing was erased.
        # (pg_stat_activity keeps an idle connection's last statement: the follower's read.)
        watcher = await asyncpg.connect(dsn)
        try:
            async with asyncio.timeout(30):
                while not await watcher.fetchval(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid() AND query = $1",
                    text_caches.SQL_ERASURES,
                ):
                    await asyncio.sleep(0.01)
        finally:
            await watcher.close()
        assert not cache.emptied.is_set()
        text_caches.announce_through(pool)
        await text_caches.clear_everywhere()  # another process's erasure, as far as the count goes
        cache.emptied.clear()  # this process's own emptying; what follows is the follower's
        async with asyncio.timeout(30):
            await cache.emptied.wait()
    finally:
        text_caches.announce_through(None)
        follower.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await follower
        await pool.close()


async def test_clearing_everywhere_announces_it_and_fails_when_it_cannot(dsn):
    heard: asyncio.Queue[str] = asyncio.Queue()
    listener = await asyncpg.connect(dsn)
    await listener.add_listener(text_caches.CHANNEL, lambda _c, _p, _ch, payload: heard.put_nowait(payload))
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=1)
    cache = _Cache()
    text_caches.track(cache)
    try:
        text_caches.announce_through(pool)
        await text_caches.clear_everywhere()
        assert cache.emptied.is_set()  # this process's at once
        async with asyncio.timeout(30):
            assert await heard.get() == "erased"
        await pool.close()
        with pytest.raises(asyncpg.InterfaceError):  # not told: the erasure is not done
            await text_caches.clear_everywhere()
    finally:
        text_caches.announce_through(None)
        await listener.close()
        await pool.close()


async def _lines_until(stream: asyncio.StreamReader, needle: str, seen: list[str]) -> None:
    while True:
        line = (await stream.readline()).decode()
        assert line, "the process closed its log: " + "".join(seen[-20:])
        seen.append(line)
        if needle in line:
            return


@pytest.mark.slow
async def test_a_replica_the_erasure_did_not_reach_empties_its_caches(dsn, tmp_path: Path):
    """Two replicas of the diary on one database; the erasure is asked of one (as the privacy
    service asks one replica of each owner), and the other's caches are emptied too."""
    env = clean_env({"DATABASE_URL": dsn})
    asked = await start("serve", "diary", "--port", "0", "--data-dir", str(tmp_path / "a"), env=env)
    other = await start(
        "serve", "diary", "--port", "0", "--data-dir", str(tmp_path / "b"), env=env, stderr=subprocess.PIPE
    )
    seen: list[str] = []
    needle = "caches of people's text"
    try:
        assert other.proc.stderr is not None
        async with asyncio.timeout(30):
            await _lines_until(other.proc.stderr, needle, seen)  # its follower connected
        async with grpc.aio.insecure_channel(asked.address) as channel:
            await pb_grpc.DiaryServiceStub(channel).EraseRows(
                pb.EraseRowsRequest(
                    target=erasure_pb2.ErasureTarget(
                        erasure_id=str(uuid.uuid4()), company="acme", kind=erasure_pb2.ERASURE_KIND_SEAT, seat="ana"
                    )
                )
            )
        async with asyncio.timeout(30):
            await _lines_until(other.proc.stderr, needle, seen)
    finally:
        assert await asked.stop() == 0
        assert await other.stop() == 0
