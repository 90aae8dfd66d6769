"""The all-in-one as a user runs it: a separate process, embedded infrastructure, one ready line,
reflection for grpcurl, health per service, a clean drain on SIGTERM, data kept across restarts."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agentlearn.diary.v1 import diary_service_pb2 as pb
from agentlearn.diary.v1 import diary_service_pb2_grpc as pb_grpc
from tests.support.runner import ROOT, clean_env, run_once, start

pytestmark = pytest.mark.slow
GRPCURL = Path(sys.executable).parent / "grpcurl"


async def _start(data_dir: Path) -> tuple[asyncio.subprocess.Process, int]:
    running = await start("up", "--port", "0", "--data-dir", str(data_dir), ready="agentlearn ready on 127.0.0.1:")
    return running.proc, running.port


async def _stop(proc: asyncio.subprocess.Process) -> int:
    proc.send_signal(signal.SIGTERM)
    async with asyncio.timeout(30):
        return await proc.wait()


async def test_up_serves_reflection_health_and_keeps_data_across_restarts(tmp_path):
    data = tmp_path / "data"
    proc, port = await _start(data)
    try:
        listed = await asyncio.to_thread(
            subprocess.run,
            [str(GRPCURL), "-plaintext", f"127.0.0.1:{port}", "list"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert "agentlearn.diary.v1.DiaryService" in listed.stdout.split()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            resp = await health.Check(health_pb2.HealthCheckRequest(service="agentlearn.diary.v1.DiaryService"))
            assert resp.status == health_pb2.HealthCheckResponse.SERVING
            note = (
                await pb_grpc.DiaryServiceStub(channel).WriteNote(
                    pb.WriteNoteRequest(
                        company="acme", seat="ana", content="Bob prefers digests", tier=pb.NOTE_TIER_LONG
                    )
                )
            ).note
            assert note.embedding_model == "all-MiniLM-L6-v2"
    finally:
        assert await _stop(proc) == 0
    assert (data / "postgres" / "PG_VERSION").exists() and (data / "qdrant-edge").is_dir()

    proc, port = await _start(data)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.DiaryServiceStub(channel)
            got = await stub.GetNote(pb.GetNoteRequest(company="acme", seat="ana", note_id=note.id))
            assert got.note.content == "Bob prefers digests"
            found = await stub.RecallNotes(
                pb.RecallNotesRequest(
                    company="acme", seat="ana", query="digest for Bob", recency_limit=0, lexical_limit=0
                )
            )
            assert [c.note.id for c in found.candidates] == [note.id]
    finally:
        assert await _stop(proc) == 0

    swept = await asyncio.to_thread(run_once, "pass", "diary-sweep", data_dir=data, env=clean_env())
    assert swept.returncode == 0 and "pass diary-sweep:" in swept.stdout, swept.stderr[-2000:]
    unknown = await asyncio.to_thread(run_once, "pass", "no-such-pass", data_dir=data, env=clean_env())
    assert unknown.returncode == 2 and "diary-fill" in unknown.stderr
    rebuilt = await asyncio.to_thread(run_once, "rebuild-index", data_dir=data, env=clean_env())
    assert rebuilt.returncode == 0 and "diary: 1 vectors restored from Postgres" in rebuilt.stdout


async def test_a_pass_worker_ticks_its_passes_under_their_leases_and_stops_on_sigterm(tmp_path):
    """``./run passes diary-fill``: the long-running form of the fill CronJob. A note stored without a
    vector (the embedder was off when it was written) gets one from the worker's tick; /healthz
    answers meanwhile; SIGTERM stops it cleanly and its lease is released."""
    import asyncpg
    import httpx
    import yaml

    data = tmp_path / "data"
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"learning": {"fill": {"interval_seconds": 1}}}))
    migrated = await asyncio.to_thread(run_once, "migrate", data_dir=data, env=clean_env())
    assert migrated.returncode == 0, migrated.stderr[-2000:]
    running = await start(
        "passes",
        "diary-fill",
        "--config",
        str(config),
        "--data-dir",
        str(data),
        ready="agentlearn passes ready: diary-fill",
    )
    proc = running.proc
    try:
        http = running.http
        async with httpx.AsyncClient() as client:
            assert (await client.get(f"http://{http}/healthz")).text == "ok\n"
        dsn = (data / "postgres").resolve()
        conn = await asyncpg.connect(host=str(dsn), user="postgres", database="postgres")
        try:
            note = await conn.fetchval(
                """INSERT INTO agent_diary (id, company, seat, content, tier, source, create_time)
                   VALUES (gen_random_uuid(), 'acme', 'ana', 'Bob prefers digests', 'long', 'operator', now())
                   RETURNING id"""
            )
            async with asyncio.timeout(60):
                while not await conn.fetchval("SELECT embedding IS NOT NULL FROM agent_diary WHERE id = $1", note):
                    await asyncio.sleep(0.5)
        finally:
            await conn.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            assert await proc.wait() == 0


@pytest.mark.parametrize("command", ["pass", "passes"])
def test_pass_help_lists_every_pass_of_the_build(command):
    """An operator finds a pass's name in ``./run pass --help``, not in the code."""
    from services.runner.registry import PASSES

    out = subprocess.run(
        [sys.executable, "-m", "services.runner", command, "--help"],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    listed = out.split("passes (name, the service it belongs to):", 1)[1].split()
    assert set(PASSES) <= set(listed), out
