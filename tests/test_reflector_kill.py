"""Kill test: 500 turns submitted in a stream, the process running the reflector (its SubmitTurn
and its workers) SIGKILLed several times mid-pass and mid-burst and restarted on the same port;
every turn is reflected exactly once — none lost, none completed twice, no diary row, episode or
profile observation doubled. A submit cut off by a kill is sent again by its client and is queued
once."""

from __future__ import annotations

import asyncio
import signal
import socket
from pathlib import Path

import asyncpg
import grpc
import pytest
import yaml

from agentlearn.reflector.v1 import reflector_service_pb2 as pb
from agentlearn.reflector.v1 import reflector_service_pb2_grpc as pb_grpc
from libs.common.clock import SystemClock
from tests.support.app import open_app
from tests.support.runner import clean_env, start
from tests.support.turns import message, turn

pytestmark = [pytest.mark.slow, pytest.mark.timeout(360)]
ROOT = Path(__file__).resolve().parents[1]
TURNS = 500
BURST = 20
WORKERS = ["persist_decider", "episodist", "profiler"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _start_reflector(config: Path, dsn: str, data: Path, port: int) -> tuple[asyncio.subprocess.Process, int]:
    running = await start(
        "serve", "reflector", "--port", str(port), "--config", str(config), "--data-dir", str(data),
        "--log-level", "WARNING", env=clean_env({"DATABASE_URL": dsn}),
    )  # fmt: skip
    return running.proc, running.port


async def _completed(conn: asyncpg.Connection) -> int:
    return int(await conn.fetchval("SELECT count(*) FROM reflections WHERE state = 'completed'"))


async def _running(conn: asyncpg.Connection) -> int:
    return int(await conn.fetchval("SELECT count(*) FROM reflections WHERE state = 'running'"))


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
        port = _free_port()  # the same port across restarts: clients reconnect
        proc, _ = await _start_reflector(config, dsn, tmp_path / "reflector-data", port)
        conn = await asyncpg.connect(dsn)
        kills = 0
        cut_off: set[str] = set()  # submits whose call a kill cut off, sent again
        submitter: asyncio.Task | None = None
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = pb_grpc.ReflectorServiceStub(channel)
                now = clock.now()

                async def submit_all() -> None:
                    # A stream of bursts, a second apart: turns keep arriving across the first kills
                    # and while the process is down.
                    for first in range(0, TURNS, BURST):
                        for i in range(first, min(first + BURST, TURNS)):
                            await submit(i)
                        await asyncio.sleep(1.0)

                async def submit(i: int) -> None:
                    turn_id = f"run-{i:04d}"
                    # Words of its own per turn: the offline decider takes a fact sharing most content
                    # words with a recent note for a repeat (NOOP), and every turn here must write one.
                    msgs = [message("bob", f"I prefer report format n{i}a n{i}b n{i}c for the weekly update.")]
                    req = pb.SubmitTurnRequest(turn=turn(turn_id, now=now, seat=f"seat-{i % 7}", messages=msgs))
                    while True:
                        try:
                            resp = await stub.SubmitTurn(req, timeout=10)
                            break
                        except grpc.aio.AioRpcError as err:
                            # The process is down or restarting: send it again, as a client does.
                            assert err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
                            cut_off.add(turn_id)
                            await asyncio.sleep(0.05)
                    # Queued by this call, or by an earlier one whose answer the kill cut off.
                    assert resp.queued or turn_id in cut_off, turn_id

                submitter = asyncio.create_task(submit_all())
                # Kill the process mid-pass at several points of progress, restarting each time.
                for target in (40, 160, 320):
                    async with asyncio.timeout(240):
                        # Past the target and with a pass under way: the kill lands mid-pass (a fast
                        # reflector is often idle between bursts; a kill then would prove nothing).
                        while await _completed(conn) < target or not await _running(conn):
                            await asyncio.sleep(0.01)
                    if target == 40:
                        assert not submitter.done()  # mid-burst: turns are still arriving
                    proc.send_signal(signal.SIGKILL)
                    await proc.wait()
                    kills += 1
                    proc, _ = await _start_reflector(config, dsn, tmp_path / "reflector-data", port)
                async with asyncio.timeout(120):
                    await submitter
                assert cut_off  # some submits met a killed or restarting process, and were sent again
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
                "SELECT turn_id, workers FROM reflections WHERE workers::text ~ '\"(failed|retrying)\"' LIMIT 3"
            )
            assert failed == [], failed
            doubled = await conn.fetchval(
                "SELECT count(*) - count(DISTINCT turn_id) FROM events WHERE kind = 'reflection_completed'"
            )
            assert doubled == 0  # no turn completed twice
        finally:
            if submitter is not None and not submitter.done():
                submitter.cancel()
            await conn.close()
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
                await proc.wait()
    assert kills == 3
