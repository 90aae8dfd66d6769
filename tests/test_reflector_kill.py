"""Kill test: 500 turns submitted, the process running the reflector's workers SIGKILLed several
times mid-pass and restarted; every turn is reflected exactly once — none lost, no diary row,
episode or profile observation doubled."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import asyncpg
import pytest
import yaml

from agentlearn.reflector.v1 import reflector_service_pb2 as pb
from agentlearn.reflector.v1 import reflector_service_pb2_grpc as pb_grpc
from libs.common.clock import SystemClock
from tests.support.app import open_app
from tests.support.turns import message, turn

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
TURNS = 500
WORKERS = ["persist_decider", "episodist", "profiler"]


async def _start_reflector(config: Path, dsn: str, data: Path) -> tuple[asyncio.subprocess.Process, int]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTLEARN_", "OPENAI_", "QDRANT_"))}
    env["DATABASE_URL"] = dsn
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "services.runner",
        "serve",
        "reflector",
        "--port",
        "0",
        "--config",
        str(config),
        "--data-dir",
        str(data),
        "--log-level",
        "WARNING",
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    async with asyncio.timeout(90):
        line = (await proc.stdout.readline()).decode()
    assert line.startswith("agentlearn ready on"), line
    return proc, int(line.split()[3].rsplit(":", 1)[1])


async def _completed(conn: asyncpg.Connection) -> int:
    return int(await conn.fetchval("SELECT count(*) FROM reflections WHERE state = 'completed'"))


async def test_sigkill_mid_pass_loses_nothing_and_doubles_nothing(
    make_settings, dsn, local_embedder, edge_index, tmp_path
):
    settings = make_settings()
    clock = SystemClock()
    async with open_app(
        settings, dsn, names=["diary", "episodes", "profiles"], clock=clock, embedder=local_embedder, index=edge_index
    ) as app:
        address = f"127.0.0.1:{app.port}"
        config = tmp_path / "reflector.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "services": {"diary": address, "episodes": address, "profiles": address, "skills": address},
                    "providers": {"embeddings": {"kind": "none"}},
                    "learning": {
                        "reflection": {
                            "workers": WORKERS,
                            "concurrency": 2,
                            "claim_lease_seconds": 2.0,
                            "poll_interval_seconds": 0.5,
                        }
                    },
                }
            )
        )
        proc, port = await _start_reflector(config, dsn, tmp_path / "reflector-data")
        conn = await asyncpg.connect(dsn)
        kills = 0
        try:
            import grpc

            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = pb_grpc.ReflectorServiceStub(channel)
                now = clock.now()
                for i in range(TURNS):
                    seat = f"seat-{i % 7}"
                    msgs = [message("bob", f"I prefer report format number {i} for the weekly update.")]
                    resp = await stub.SubmitTurn(
                        pb.SubmitTurnRequest(turn=turn(f"run-{i:04d}", now=now, seat=seat, messages=msgs))
                    )
                    assert resp.queued
            # Kill the worker process mid-pass at several points of progress, restarting each time.
            for target in (40, 160, 320):
                async with asyncio.timeout(240):
                    while await _completed(conn) < target:
                        await asyncio.sleep(0.05)
                proc.send_signal(signal.SIGKILL)
                await proc.wait()
                kills += 1
                proc, port = await _start_reflector(config, dsn, tmp_path / "reflector-data")
            async with asyncio.timeout(300):
                while await _completed(conn) < TURNS:
                    await asyncio.sleep(0.2)
            # Exactly once, everywhere.
            assert await conn.fetchval("SELECT count(*) FROM reflections") == TURNS
            left = "SELECT count(*) FROM background_jobs WHERE kind = 'reflection' AND state <> 'done'"
            assert await conn.fetchval(left) == 0
            notes = await conn.fetchval("SELECT count(*) FROM agent_diary WHERE source = 'persist_decider'")
            distinct = await conn.fetchval(
                "SELECT count(DISTINCT turn_id) FROM agent_diary WHERE source = 'persist_decider'"
            )
            assert notes == distinct == TURNS
            assert await conn.fetchval("SELECT count(*) FROM episodes") == TURNS
            observed = await conn.fetchval("SELECT sum(observation_count) FROM counterparty_profiles")
            assert observed == TURNS  # one observation of bob per turn, none merged twice
            assert await conn.fetchval("SELECT count(*) FROM reflections WHERE attempts > 1") >= 1  # kills landed
            failed = await conn.fetch(
                "SELECT turn_id, workers FROM reflections WHERE workers::text LIKE '%\"failed\"%' LIMIT 3"
            )
            assert failed == [], failed
        finally:
            await conn.close()
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
                await proc.wait()
    assert kills == 3
