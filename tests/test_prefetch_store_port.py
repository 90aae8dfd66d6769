"""The prefetch store port's decisions on the real PostgreSQL store: the same checks the unit tier
runs on the in-memory fake (tests/unit/test_prefetch_store_decisions.py), so the fake cannot drift
from what the statements decide."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

import pytest

from libs.common.db import connect_pool
from libs.common.events import PostgresEventLog, bookkeeping
from services.prefetch.store import PostgresPrefetchStore, RunKey
from tests.unit.test_prefetch_store_decisions import CHECKS, T0


@pytest.mark.parametrize("check", CHECKS, ids=[c.__name__ for c in CHECKS])
async def test_the_postgres_store_decides_as_the_fake(check, dsn: str) -> None:  # type: ignore[no-untyped-def]
    pool = await connect_pool(dsn)
    try:
        await check(PostgresPrefetchStore(pool))
    finally:
        await pool.close()


class _ReplyLost:
    """A Unix-socket relay in front of the embedded server that, once armed, drops the client's
    connection at its next COMMIT: after forwarding it, instead of relaying the server's answer
    (``committed``: the server committed), or instead of forwarding it (the server rolls back).
    Either way the client sees its connection drop: an outcome unknown to it."""

    def __init__(self, server_dir: str) -> None:
        self.server_socket = os.path.join(server_dir, ".s.PGSQL.5432")
        self.dir = tempfile.mkdtemp(prefix="al-relay-")  # short: a socket's path is bounded
        self.armed = False
        self.committed = True
        self.cut = 0

    async def __aenter__(self) -> _ReplyLost:
        self._server = await asyncio.start_unix_server(self._relay, os.path.join(self.dir, ".s.PGSQL.5432"))
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    async def _relay(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_unix_connection(self.server_socket)
        committing = asyncio.Event()

        async def upstream() -> None:
            while chunk := await client_r.read(65536):
                if self.armed and b"COMMIT\x00" in chunk:
                    self.armed = False
                    if not self.committed:
                        self.cut += 1
                        break
                    committing.set()
                server_w.write(chunk)
                await server_w.drain()

        async def downstream() -> None:
            while chunk := await server_r.read(65536):
                if committing.is_set():  # the COMMIT's answer: the server committed
                    self.cut += 1
                    break
                client_w.write(chunk)
                await client_w.drain()

        tasks = [asyncio.ensure_future(upstream()), asyncio.ensure_future(downstream())]
        with contextlib.suppress(Exception):
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            task.cancel()
        client_w.close()
        server_w.close()


@pytest.mark.parametrize("committed", [True, False], ids=["answer_lost", "commit_lost"])
async def test_a_save_whose_commit_answer_is_lost_writes_its_bookkeeping_once(dsn: str, committed: bool) -> None:
    """The frozen context and the turn's bookkeeping are one statement. Its connection dropping at
    the commit leaves the outcome unknown to the store; the context is saved again, alone, and the
    bookkeeping is written once: not again if the server had committed it (that save then finds
    the context frozen: False, the caller reads it), now if it had not (that save lands)."""
    run = RunKey("acme", "agent-1", "run-1")
    direct = await connect_pool(dsn)
    try:
        async with _ReplyLost(parse_qs(urlsplit(dsn).query)["host"][0]) as relay:
            through = urlunsplit(urlsplit(dsn)._replace(query=urlencode({"host": relay.dir})))
            pool = await connect_pool(through)
            try:
                store = PostgresPrefetchStore(pool)
                assert await store.claim_context(run, T0)
                with bookkeeping() as batch:
                    await PostgresEventLog(pool).emit(
                        "prefetch_summary", company="acme", seat="agent-1", turn_id="run-1"
                    )
                batch.charge("acme", "agent-1", T0, 100)
                relay.armed, relay.committed = True, committed
                landed = await store.save_context(run, {"blocks": ["a"]}, T0, T0, batch)
                assert relay.cut == 1
            finally:
                await pool.close()
        assert await direct.fetchval("SELECT count(*) FROM events WHERE kind = 'prefetch_summary'") == 1
        assert await direct.fetchval("SELECT tokens FROM token_spend WHERE seat = 'agent-1'") == 100
        frozen = await PostgresPrefetchStore(direct).frozen_context(run)
        assert frozen is not None and (frozen.state, frozen.context) == ("built", {"blocks": ["a"]})
        assert landed is not committed  # the committed save was this call's: it reads it back
    finally:
        await direct.close()
