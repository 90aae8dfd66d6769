"""Kill test (spec: "resumes queued work after restart. In-flight checks interrupted by restart are
reported as interrupted, not silently declared successful or automatically replayed"): a real
process serving sessions is SIGKILLed while a check runs (its review call held open by the scripted
model); after a restart the running check is reported interrupted, the queued ones complete, none
is lost and none runs twice."""

from __future__ import annotations

import asyncio
import re
import signal
import threading
from pathlib import Path

import asyncpg
import grpc
import httpx
import pytest
import yaml

from agentlearn.sessions.v1 import session_service_pb2 as pb
from agentlearn.sessions.v1 import session_service_pb2_grpc as pb_grpc
from libs.common.clock import SystemClock
from tests.support.app import open_app
from tests.support.runner import clean_env, start_with_config
from tests.support.scripted_openai import Reply, openai_provider
from tests.support.sessions import chat_answer, is_review, prompt_text, result, user, verification, wait_for

pytestmark = pytest.mark.slow
SESSIONS = ["k1", "k2", "k3", "k4"]
_CHECK_ID = re.compile(r"Learning check ([0-9a-f-]{36})")


async def _start(config: Path, dsn: str, data: Path) -> tuple[asyncio.subprocess.Process, int, str]:
    running = await start_with_config(
        "serve", "sessions", "--port", "0", config=config, data_dir=data, env=clean_env({"DATABASE_URL": dsn})
    )
    return running.proc, running.port, running.http


async def test_sigkill_mid_check_reports_it_interrupted_and_completes_the_queued_ones(
    make_settings, dsn, edge_index, tmp_path, scripted_openai
):
    gate = threading.Event()
    reviews: list[str] = []

    def rule(body: dict) -> Reply:
        if not is_review(body):
            return Reply(body=chat_answer('{"verdicts": []}'))
        reviews.append(_CHECK_ID.search(prompt_text(body)).group(1))
        if len(reviews) == 1:
            return Reply(hold=gate, body=chat_answer("{}"))  # the check that is running when the kill lands
        return Reply(body=chat_answer("{}"))

    scripted_openai.rule("chat", rule)
    async with open_app(
        make_settings(),
        dsn,
        names=["diary", "skills", "knowledge", "prefetch"],
        clock=SystemClock(),
        embedder=None,
        index=edge_index,
    ) as app:
        address = f"127.0.0.1:{app.port}"
        config = tmp_path / "sessions.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "services": {"diary": address, "skills": address, "prefetch": address},
                    "providers": {
                        "embeddings": {"kind": "none"},
                        "llm": {"scripted": openai_provider(scripted_openai, "small", timeout_seconds=120)},
                        "auxiliary_chain": ["scripted"],
                    },
                    "sessions": {"poll_interval_seconds": 0.5, "claim_lease_seconds": 2.0, "concurrency": 1},
                }
            )
        )
        proc, port, _ = await _start(config, dsn, tmp_path / "data")
        conn = await asyncpg.connect(dsn)
        try:
            queued: list[str] = []
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = pb_grpc.SessionServiceStub(channel)
                now = SystemClock().now()
                for s in SESSIONS:
                    await stub.AppendSessionEvents(
                        pb.AppendSessionEventsRequest(
                            company="acme",
                            session_id=s,
                            user="dana",
                            seat="ana",
                            events=[
                                user(f"{s}-u", "fix it", now),
                                result(f"{s}-r", "make", "ok", now),
                                verification(f"{s}-v", "pytest", "passed", now),
                            ],
                        )
                    )
                    check = await stub.CheckRecentWork(
                        pb.CheckRecentWorkRequest(company="acme", session_id=s, user="dana")
                    )
                    queued.append(check.check.check_id)
            # The first check's review is held open: it is RUNNING when the process dies.
            await wait_for(lambda: _true(scripted_openai.held == 1), timeout=60)
            running = reviews[0]
            state = await conn.fetchval("SELECT state FROM learning_checks WHERE id = $1::uuid", running)
            assert state == "running"
            proc.send_signal(signal.SIGKILL)
            await proc.wait()
            gate.set()  # the held request may answer now: nobody is listening

            proc, port, http = await _start(config, dsn, tmp_path / "data")

            async def settled() -> bool:
                n = await conn.fetchval("SELECT count(*) FROM learning_checks WHERE state IN ('queued', 'running')")
                return n == 0

            await wait_for(settled, timeout=120, interval=0.2)
            rows = {
                str(r["id"]): (r["state"], r["outcome"], r["reason"])
                for r in await conn.fetch("SELECT id, state, outcome, reason FROM learning_checks")
            }
            jobs = dict(await conn.fetch("SELECT state, count(*) FROM background_jobs GROUP BY state"))
            async with httpx.AsyncClient(base_url=f"http://{http}", timeout=30) as client:
                resp = await client.get("/api/sessions/k1/learning?company=acme&user=dana")
        finally:
            await conn.close()
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
                await proc.wait()
    assert sorted(rows) == sorted(queued)  # none lost
    assert rows[running][:2] == ("interrupted", "interrupted") and "not replayed" in rows[running][2]
    for check_id in queued:
        if check_id != running:
            assert rows[check_id][:2] == ("completed", "completed_empty")
    assert jobs == {"interrupted": 1, "done": 3}
    # None ran twice: one review call per check, the interrupted one's included (never replayed).
    assert sorted(reviews) == sorted(queued)
    # The restarted process serves its HTTP API. Until the authentication middleware sets a local
    # principal on loopback, an unauthenticated call is refused; once it does, the receipts show.
    if resp.status_code == 401:
        assert resp.json()["error"]["status"] == "UNAUTHENTICATED"
    else:
        assert resp.status_code == 200 and {c["check_id"] for c in resp.json()["checks"]} == {queued[0]}


async def _true(value: bool) -> bool:
    return value
