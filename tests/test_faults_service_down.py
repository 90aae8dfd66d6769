"""A service down during reflection: the diary (its own process) is SIGKILLed while turns are being
reflected by the reflector (its own process), and started again on the same port a little later.
The persist decider's learning is retried, not lost, and lands once; the episodist, which its
service let finish, is not run again. Real processes, real gRPC, real PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

import asyncpg
import grpc
import pytest
import yaml

from agentlearn.reflector.v1 import reflector_service_pb2 as pb
from agentlearn.reflector.v1 import reflector_service_pb2_grpc as pb_grpc
from libs.common.clock import SystemClock
from tests.support.app import open_app
from tests.support.runner import clean_env, free_port, start_with_config
from tests.support.turns import message, turn

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
DOWN_TURNS = 5


async def _serve(name: str, port: int, config: Path, dsn: str, data: Path) -> tuple[asyncio.subprocess.Process, int]:
    running = await start_with_config(
        "serve", name, "--port", str(port), config=config, data_dir=data, env=clean_env({"DATABASE_URL": dsn})
    )
    return running.proc, running.port


async def _record(conn: asyncpg.Connection, turn_id: str) -> asyncpg.Record | None:
    return await conn.fetchrow("SELECT state, workers, attempts FROM reflections WHERE turn_id = $1", turn_id)


def _statuses(record: asyncpg.Record) -> dict[str, str]:
    return {w["worker"]: w["status"] for w in json.loads(record["workers"])}


async def test_a_service_down_during_reflection_is_retried_and_lands_once(
    make_settings, dsn, local_embedder, edge_index, tmp_path
):
    clock = SystemClock()
    async with open_app(
        make_settings(), dsn, names=["episodes"], clock=clock, embedder=local_embedder, index=edge_index
    ) as app:
        diary_port = free_port()
        config = tmp_path / "faults.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "services": {"diary": f"127.0.0.1:{diary_port}", "episodes": f"127.0.0.1:{app.port}"},
                    "providers": {"embeddings": {"kind": "none"}},
                    "learning": {
                        "reflection": {
                            "workers": ["persist_decider", "episodist"],
                            "poll_interval_seconds": 0.2,
                            "claim_lease_seconds": 5.0,
                            "rpc_timeout_seconds": 3.0,
                            "retry_backoff_seconds": 0.5,
                            "retry_backoff_max_seconds": 1.0,
                            "max_attempts": 1000,
                        }
                    },
                }
            )
        )
        diary, _ = await _serve("diary", diary_port, config, dsn, tmp_path / "diary-data")
        reflector, port = await _serve("reflector", 0, config, dsn, tmp_path / "reflector-data")
        conn = await asyncpg.connect(dsn)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = pb_grpc.ReflectorServiceStub(channel)

                async def submit(turn_id: str) -> None:
                    # Words of its own per turn: the offline decider takes a fact sharing most content
                    # words with a recent note for a repeat (NOOP), and every turn here must write one.
                    w = turn_id.replace("-", "")
                    msgs = [message("bob", f"I prefer the report format {w}a {w}b {w}c for weekly updates.")]
                    t = turn(turn_id, now=clock.now(), messages=msgs)
                    assert (await stub.SubmitTurn(pb.SubmitTurnRequest(turn=t))).queued

                await submit("before")
                async with asyncio.timeout(60):
                    while (r := await _record(conn, "before")) is None or r["state"] != "completed":
                        await asyncio.sleep(0.1)

                diary.send_signal(signal.SIGKILL)  # the diary crashes
                await diary.wait()
                down = [f"down-{i}" for i in range(DOWN_TURNS)]
                for turn_id in down:
                    await submit(turn_id)
                # Each is left retrying: the episode written, the note not, nothing recorded final.
                async with asyncio.timeout(90):
                    for turn_id in down:
                        while (r := await _record(conn, turn_id)) is None or r["state"] != "retrying":
                            await asyncio.sleep(0.1)
                        assert _statuses(r) == {"persist_decider": "retrying", "episodist": "wrote"}
                        worker = json.loads(r["workers"])[0]
                        assert worker["failure"].startswith("rpc_unavailable")

                diary, _ = await _serve("diary", diary_port, config, dsn, tmp_path / "diary-data")  # it is back
                async with asyncio.timeout(120):
                    for turn_id in down:
                        while (r := await _record(conn, turn_id))["state"] != "completed":
                            assert r["state"] in ("retrying", "running", "queued"), r["state"]
                            await asyncio.sleep(0.1)
                        assert _statuses(r) == {"persist_decider": "wrote", "episodist": "wrote"}
                        assert r["attempts"] >= 2

            # Landed once: one note and one episode per turn, each turn completed once.
            everything = ["before", *down]
            notes = await conn.fetch("SELECT turn_id FROM agent_diary WHERE source = 'persist_decider'")
            assert sorted(n["turn_id"] for n in notes) == sorted(everything)
            episodes = await conn.fetch("SELECT turn_id FROM episodes")
            assert sorted(e["turn_id"] for e in episodes) == sorted(everything)
            completed = await conn.fetch("SELECT turn_id FROM events WHERE kind = 'reflection_completed'")
            assert sorted(e["turn_id"] for e in completed) == sorted(everything)
            retried = await conn.fetchval(
                "SELECT count(DISTINCT turn_id) FROM events WHERE kind = 'reflection_retrying'"
            )
            assert retried == DOWN_TURNS
            assert await conn.fetchval("SELECT count(*) FROM background_jobs WHERE state <> 'done'") == 0
        finally:
            await conn.close()
            for proc in (reflector, diary):
                if proc.returncode is None:
                    proc.send_signal(signal.SIGTERM)
                    await proc.wait()
