"""Secure by default, as an operator meets it: local mode only on loopback (and said in the ready
line), a refusal in one line on any other address without authentication, a taken port refused
before Postgres starts, and tokens issued, used and revoked with ``./run token``."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
from pathlib import Path

import grpc
import pytest

from agentlearn.diary.v1 import diary_service_pb2 as pb
from agentlearn.diary.v1 import diary_service_pb2_grpc as pb_grpc
from tests.support.runner import clean_env, free_port, run_once, start
from tests.test_runner import _stop

pytestmark = pytest.mark.slow


def _token(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``./run token *args`` on the data directory ``data_dir`` (issue, list, revoke)."""
    return run_once("token", *args, data_dir=data_dir, env=clean_env())


def test_a_public_address_without_authentication_is_refused_in_one_line(tmp_path):
    done = run_once(
        "up",
        "--host",
        "0.0.0.0",
        "--port",
        "0",
        "--http-port",
        "0",
        data_dir=tmp_path / "d",
        env=clean_env(),
        timeout=60,
    )
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines == [lines[-1]] and lines[-1].startswith("agentlearn: refusing to serve on 0.0.0.0"), done.stderr
    assert "--require-auth" in lines[-1]
    assert not (tmp_path / "d" / "postgres").exists()  # nothing was started


def test_a_taken_port_is_refused_before_anything_starts(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_once(
            "up", "--port", str(port), "--http-port", "0", data_dir=tmp_path / "d", env=clean_env(), timeout=60
        )
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and f"cannot bind 127.0.0.1:{port}" in lines[0], done.stderr
    assert not (tmp_path / "d" / "postgres").exists()


async def _start(data_dir, *flags: str) -> tuple[asyncio.subprocess.Process, int, str]:  # type: ignore[no-untyped-def]
    running = await start(
        "up", "--port", "0", "--data-dir", str(data_dir), *flags, ready="agentlearn ready on 127.0.0.1:"
    )
    return running.proc, running.port, running.line


async def test_require_auth_serves_only_token_holders_and_tokens_come_from_the_cli(tmp_path):
    data = tmp_path / "data"
    proc, port, ready = await _start(data, "--require-auth")
    try:
        assert "auth=tokens" in ready
        issued = await asyncio.to_thread(
            _token, data, "issue", "--company", "acme", "--seat", "ana", "--scopes", "memory:write"
        )
        assert issued.returncode == 0, issued.stderr[-2000:]
        token = issued.stdout.strip()
        assert token.startswith("agl_") and "\n" not in token
        request = pb.WriteNoteRequest(company="acme", seat="ana", content="Bob prefers digests", tier=pb.NOTE_TIER_LONG)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.DiaryServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.WriteNote(request, timeout=10)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            note = (await stub.WriteNote(request, metadata=(("authorization", f"Bearer {token}"),), timeout=10)).note
            assert note.content == "Bob prefers digests"

            listed = await asyncio.to_thread(_token, data, "list", "--company", "acme")
            token_id = listed.stdout.split()[0]
            assert "live" in listed.stdout and token not in listed.stdout
            revoked = await asyncio.to_thread(_token, data, "revoke", token_id)
            assert revoked.returncode == 0
            # Revocation takes effect within auth.cache_seconds (10 s by default): wait for it.
            async with asyncio.timeout(30):
                while True:
                    try:
                        await stub.WriteNote(request, metadata=(("authorization", f"Bearer {token}"),), timeout=10)
                    except grpc.aio.AioRpcError as refused:
                        assert refused.code() == grpc.StatusCode.UNAUTHENTICATED
                        break
                    await asyncio.sleep(0.5)
    finally:
        assert await _stop(proc) == 0


async def test_local_mode_says_so_in_its_ready_line(tmp_path):
    proc, _, ready = await _start(tmp_path / "data")
    try:
        assert "auth=local" in ready and "loopback only" in ready
    finally:
        assert await _stop(proc) == 0


async def test_sigterm_mid_burst_cancels_nothing_and_loses_nothing(tmp_path):
    """SIGTERM while a burst of reads and idempotent writes is in flight: health goes NOT_SERVING,
    every call the server received runs to its end (none CANCELLED), the process exits, and every
    write it acknowledged is there after a restart; a retry of any write that did not answer lands
    once."""
    data = tmp_path / "data"
    proc, port, _ = await _start(data)
    stopped = False
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.DiaryServiceStub(channel)

            def note(i: int) -> pb.WriteNoteRequest:
                return pb.WriteNoteRequest(
                    company="acme",
                    seat="ana",
                    content=f"Fact {i}: the billing export for region {i} runs on Mondays.",
                    tier=pb.NOTE_TIER_LONG,
                    request_id=f"burst-{i}",
                )

            async def call(coro) -> str:  # type: ignore[no-untyped-def]
                try:
                    await coro
                    return "OK"
                except grpc.aio.AioRpcError as err:
                    return err.code().name

            writes = [asyncio.create_task(call(stub.WriteNote(note(i), timeout=60))) for i in range(40)]
            reads = [
                asyncio.create_task(
                    call(
                        stub.RecallNotes(
                            pb.RecallNotesRequest(company="acme", seat="ana", query=f"billing {i}"), timeout=60
                        )
                    )
                )
                for i in range(40)
            ]
            await asyncio.sleep(0.2)
            proc.send_signal(signal.SIGTERM)
            stopped = True
            write_codes = await asyncio.gather(*writes)
            read_codes = await asyncio.gather(*reads)
            async with asyncio.timeout(30):
                assert await proc.wait() == 0
        assert "CANCELLED" not in write_codes + read_codes, (write_codes, read_codes)
        acknowledged = [i for i, code in enumerate(write_codes) if code == "OK"]
        assert acknowledged, write_codes
    finally:
        if not stopped:
            await _stop(proc)

    proc, port, _ = await _start(data)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.DiaryServiceStub(channel)
            for i in range(40):  # a retry of every write: the acknowledged ones are not written twice
                await stub.WriteNote(note(i), timeout=60)
            listed = await stub.ListNotes(pb.ListNotesRequest(company="acme", seat="ana", page_size=100))
            contents = [n.content for n in listed.notes]
            assert sorted(contents) == sorted({note(i).content for i in range(40)})
    finally:
        assert await _stop(proc) == 0


async def test_split_mode_with_tokens_reflects_and_its_children_do_not_outlive_a_killed_parent(tmp_path):
    """``./run up --split --require-auth``: an engine with a reflect token submits a turn and the
    reflector's workers reach the other processes as a service (the parent handed them its internal
    secret). Then the parent is SIGKILLed: every child notices (a pipe only the parent held) and
    exits; nothing keeps serving on the ports."""
    import yaml

    from agentlearn.reflector.v1 import reflector_service_pb2 as rf_pb
    from agentlearn.reflector.v1 import reflector_service_pb2_grpc as rf_grpc
    from libs.common.clock import SystemClock
    from services.runner.registry import SERVICES
    from tests.support.turns import message, turn

    ports = {name: free_port() for name in SERVICES}
    config = tmp_path / "split.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "services": {name: f"127.0.0.1:{port}" for name, port in ports.items()},
                "run_passes_in_process": False,
                "learning": {"reflection": {"poll_interval_seconds": 0.5}},
                "server": {"http_port": 0},
            }
        )
    )
    data = tmp_path / "data"
    running = await start(
        "up", "--split", "--require-auth", "--config", str(config), "--data-dir", str(data), "--log-level", "WARNING",
        ready="agentlearn ready (split)", timeout=180, start_new_session=True,
    )  # fmt: skip
    proc, line = running.proc, running.line
    try:
        assert "auth=tokens" in line, line
        issued = await asyncio.to_thread(
            _token, data, "issue", "--company", "acme", "--seat", "ana", "--scopes", "reflect,memory:read"
        )
        token = issued.stdout.strip()
        md = (("authorization", f"Bearer {token}"),)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{ports['reflector']}") as channel:
            stub = rf_grpc.ReflectorServiceStub(channel)
            t = turn("split-auth-1", now=SystemClock().now(), messages=[message("bob", "I prefer weekly digests.")])
            assert (await stub.SubmitTurn(rf_pb.SubmitTurnRequest(turn=t), metadata=md)).queued
            async with asyncio.timeout(90):
                while True:
                    r = (
                        await stub.GetReflection(
                            rf_pb.GetReflectionRequest(company="acme", seat="ana", turn_id="split-auth-1"), metadata=md
                        )
                    ).reflection
                    if r.state == rf_pb.REFLECTION_STATE_COMPLETED:
                        break
                    await asyncio.sleep(0.2)
        statuses = {w.worker: w.status for w in r.workers}
        assert statuses["persist_decider"] == rf_pb.WORKER_STATUS_WROTE, r.workers
        assert statuses["episodist"] == rf_pb.WORKER_STATUS_WROTE, r.workers
    finally:
        proc.kill()
        await proc.wait()

    def answering() -> list[str]:
        up = []
        for name, port in ports.items():
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    up.append(name)
        return up

    async with asyncio.timeout(60):
        while answering():
            await asyncio.sleep(0.3)


def test_a_postgres_that_cannot_start_is_one_line_with_its_own_reason(tmp_path):
    """Issue 15: the server's real cause first (here: a data directory of another major version),
    not a traceback of pg_ctl's argv and a dump of its log."""
    data = tmp_path / "d"
    assert run_once("migrate", data_dir=data, env=clean_env()).returncode == 0
    (data / "postgres" / "PG_VERSION").write_text("99\n")
    done = run_once("migrate", data_dir=data, env=clean_env())
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr[-3000:]
    assert "did not start: database files are incompatible with server" in lines[0]


def test_a_missing_or_broken_config_file_is_one_line(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("server:\n  port: [\n")
    for path in (tmp_path / "missing.yaml", broken):
        done = run_once("up", "--config", str(path), data_dir=tmp_path / "d", env=clean_env(), timeout=60)
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert done.returncode == 2 and len(lines) == 1 and str(path) in lines[0], done.stderr[-2000:]
