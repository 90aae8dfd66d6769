"""A claim its own worker settles is not a revoked one (libs/common/jobs.py ``HeldClaims.settling``).

An erasure's revocation notice (``revoked:<kind>``) makes every worker of the kind re-check all the
claims it holds, and a listener's reconnect does too. Before, the re-check took any claim no longer
"running, locked by me" as revoked, a job this worker had just finished, retried, deferred or
dead-lettered itself included: a notice about someone else's job then cancelled what follows the
settle's commit. A session check lost its ``learning_check_completed`` event (the event log no
longer matched the check to how it ended), a reflection pass its bookkeeping (its events and token
charges), and each was logged as erased. A renewal landing on the settled claim did the same.

The notice is delivered here by the re-check it triggers (``HeldClaims.recheck``, what ``watch``
runs on a notice), called at the moment it hurt: right after the settle committed. Everything else
is real: Postgres, the workers' own code paths, gRPC on loopback.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

import pytest

from libs.common.db import connect_pool
from libs.common.events import read_events
from libs.common.jobs import HeldClaims, Job, JobQueue, keep_claim, run_claimed
from tests.support.app import open_app
from tests.support.scripted_openai import Reply
from tests.support.sessions import open_reviewed, review_rule, run_check
from tests.support.turns import message, turn

pytestmark = pytest.mark.timeout(120)

LEASE = 120.0
"""Renewed every 40 s: no renewal runs during these tests unless one is asked for."""
REVOKED_LOGS = ("was revoked", "was erased while it was reflected")


def _revoked_logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if any(t in r.getMessage() for t in REVOKED_LOGS)]


# ------------------------------------------------------------------------------ the queue itself


async def test_a_notice_right_after_a_settle_stops_only_the_claim_the_erasure_took(dsn, clock, caplog):
    """Two claims of one worker: one is settled by its own worker, the other deleted by an erasure,
    and then the notice's re-check runs. The erased one's work stops; the settled one's goes on to
    its end (its closing event), not logged as revoked."""
    caplog.set_level(logging.INFO)
    pool = await connect_pool(dsn, max_size=5)
    queue = JobQueue(pool)
    claims = HeldClaims()
    settled = asyncio.Event()
    noticed = asyncio.Event()
    ended: dict[str, str] = {}
    found_lost: list[int] = []

    async def process(job: Job) -> None:
        try:
            if job.key == "mine":
                with claims.settling(job):
                    async with pool.acquire() as conn, conn.transaction():
                        assert await queue.finish(conn, job, "w", clock.now())
                settled.set()
                await noticed.wait()  # the tail after the commit (the closing event's round trip)
                await pool.execute("SELECT 1")
                ended[job.key] = "finished"
            else:
                await noticed.wait()
                await asyncio.Event().wait()  # held until its claim is found revoked
        except asyncio.CancelledError:
            ended[job.key] = "cancelled"
            raise

    try:
        for key in ("mine", "hers"):
            async with pool.acquire() as conn, conn.transaction():
                await queue.enqueue(
                    conn, kind="learning", key=key, company="acme", seat="ana", payload=b"{}", trace_carrier={},
                    now=clock.now(),
                )  # fmt: skip
        jobs = {}
        for _ in range(2):
            job = await queue.claim("learning", "w", clock.now(), LEASE, reclaim_lapsed=False)
            assert job is not None
            jobs[job.key] = job
        runs = [
            asyncio.create_task(run_claimed(queue, j, "w", clock, LEASE, process, when_lost="-", claims=claims))
            for j in jobs.values()
        ]
        await asyncio.wait_for(settled.wait(), 10)
        await pool.execute("DELETE FROM background_jobs WHERE id = $1", jobs["hers"].id)  # the erasure's statement
        found_lost.append(await claims.recheck(queue, "w"))  # its notice
        noticed.set()
        await asyncio.wait_for(asyncio.gather(*runs), 10)
        assert found_lost == [1]  # hers only
        assert ended == {"mine": "finished", "hers": "cancelled"}
        assert _revoked_logged(caplog) == [
            f"the claim on learning job {jobs['hers'].id} was revoked; stopping its work",
            f"learning job {jobs['hers'].id} was revoked (erased); its work stopped",
        ]
    finally:
        noticed.set()
        await pool.close()


async def test_a_settle_that_did_not_commit_leaves_the_claim_watched(dsn, clock):
    """A settle whose transaction raised left the job running and held: the claim is watched again,
    and an erasure that takes it afterwards still stops the work."""
    pool = await connect_pool(dsn, max_size=5)
    queue = JobQueue(pool)
    claims = HeldClaims()
    try:
        async with pool.acquire() as conn, conn.transaction():
            await queue.enqueue(
                conn, kind="learning", key="k", company="acme", seat="ana", payload=b"{}", trace_carrier={},
                now=clock.now(),
            )  # fmt: skip
        job = await queue.claim("learning", "w", clock.now(), LEASE, reclaim_lapsed=False)
        assert job is not None
        with claims.holding(job) as claim:
            with pytest.raises(RuntimeError), claims.settling(job):
                async with pool.acquire() as conn, conn.transaction():
                    assert await queue.finish(conn, job, "w", clock.now())
                    raise RuntimeError("the store failed before the commit")
            assert not claim.settling
            assert await claims.recheck(queue, "w") == 0  # rolled back: still held
            await pool.execute("DELETE FROM background_jobs WHERE id = $1", job.id)
            assert await claims.recheck(queue, "w") == 1 and claim.lost.is_set()
    finally:
        await pool.close()


class _SettledDuringRenewal:
    """A queue whose renewal finds the claim gone because its worker settled it meanwhile: the
    settle committed while the renewal waited on the row's lock."""

    def __init__(self, settle: Callable[[], None]) -> None:
        self._settle = settle
        self.renewals = 0

    async def renew(self, job: Job, worker: str, now: Any, lease_seconds: float) -> bool:
        self.renewals += 1
        self._settle()
        return False


async def test_a_renewal_that_finds_the_claim_settled_by_its_worker_does_not_stop_the_work(clock):
    lease = 0.06
    claims = HeldClaims()
    job = Job(1, "learning", "k", "acme", "ana", b"", {}, 1, clock.now())
    with claims.holding(job) as claim:
        settle = claims.settling(job)
        queue = _SettledDuringRenewal(settle.__enter__)
        work = asyncio.create_task(asyncio.Event().wait())
        keeper = asyncio.create_task(keep_claim(queue, job, "w", clock, lease, work, claim))
        # Ten beats: a keeper that took the settle for a loss cancels the work at the first.
        done, _ = await asyncio.wait({keeper, work}, timeout=10 * lease / 3)
        assert queue.renewals == 1 and not done  # not renewed again, and nothing stopped
        keeper.cancel()
        work.cancel()
        await asyncio.gather(keeper, work, return_exceptions=True)
        settle.__exit__(None, None, None)


async def test_a_claim_lost_at_renewal_still_stops_the_work(clock):
    """The renewal's own rule is unchanged: a claim not settled by its worker and found gone at a
    renewal stops the work."""
    lease = 0.06
    claims = HeldClaims()
    job = Job(1, "learning", "k", "acme", "ana", b"", {}, 1, clock.now())
    with claims.holding(job) as claim:
        queue = _SettledDuringRenewal(lambda: None)  # found gone, not by its worker
        work = asyncio.create_task(asyncio.Event().wait())
        assert await asyncio.wait_for(keep_claim(queue, job, "w", clock, lease, work, claim), 10) is False
        with pytest.raises(asyncio.CancelledError):
            await work


# ------------------------------------------------------------------------------ session learning

LESSON = "Run make migrate before the payments tests: the test database needs the current schema."


async def test_a_learning_check_keeps_its_closing_event_when_a_notice_follows_its_finish(
    make_settings, dsn, scripted_openai, caplog
):
    caplog.set_level(logging.INFO)
    async with open_reviewed(make_settings, scripted_openai, dsn, review_rule(lessons=[LESSON])) as env:
        worker = env.sessions.worker
        sink = worker.events
        found_lost: list[int] = []

        class NoticeAfterTheCommit:
            """The worker's event sink: someone else's erasure revokes a learning job just as this
            check's end committed, before its closing event is written."""

            async def emit(self, kind: str, **fields: Any) -> None:
                if kind == "learning_check_completed":
                    found_lost.append(await worker._claims.recheck(worker.queue, worker.worker_id))
                    await asyncio.sleep(0)  # the watcher's keeper gets its turn (it cancels a lost claim's work)
                await sink.emit(kind, **fields)

        worker.events = NoticeAfterTheCommit()
        check = await run_check(env, "s-1")
        assert found_lost == [0]
        [completed] = await read_events(env.app.infra.pool, "learning_check_completed")
        assert completed["payload"]["check_id"] == check.check_id
        assert _revoked_logged(caplog) == []


# ------------------------------------------------------------------------------ the reflector


async def test_a_retried_pass_keeps_its_bookkeeping_when_a_notice_follows_its_retry(
    make_settings, dsn, clock, scripted_openai, local_embedder, edge_index, caplog
):
    """The pass's model call fails for a passing reason: the turn goes back on the queue (its retry
    committed), and a notice arrives before the pass's bookkeeping is written. Its events (the
    ``reflection_retrying``) are written all the same."""
    caplog.set_level(logging.INFO)
    scripted_openai.chat_handler = lambda body: json.dumps(
        {"classification": "LONG", "content": "Bob prefers weekly digests.", "reason": "said"}
    )
    scripted_openai.push("chat", Reply(status=500))
    providers = {
        "llm": {
            "model": {
                "kind": "openai",
                "base_url": scripted_openai.base_url,
                "api_key": "k",
                "model": "m",
                "timeout_seconds": 5.0,
            }
        },
        "auxiliary_chain": ["model"],
    }
    settings = make_settings(
        learning={"reflection": {"workers": ["persist_decider"], "claim_lease_seconds": LEASE}}, providers=providers
    )
    async with open_app(
        settings, dsn, names=["diary", "reflector"], clock=clock, embedder=local_embedder, index=edge_index
    ) as app:
        from agentlearn.reflector.v1 import reflector_service_pb2 as pb
        from agentlearn.reflector.v1 import reflector_service_pb2_grpc as pb_grpc

        harness = app.components["reflector"].service.harness
        store = harness._store
        write = store.write_bookkeeping
        found_lost: list[int] = []

        async def notice_then_write(batch: Any) -> None:
            found_lost.append(await harness._claims.recheck(harness._queue, harness._worker_id))
            await asyncio.sleep(0)  # the keeper gets its turn (it cancels a lost claim's work)
            await write(batch)

        store.write_bookkeeping = notice_then_write
        stub = pb_grpc.ReflectorServiceStub(app.channel)
        await stub.SubmitTurn(
            pb.SubmitTurnRequest(turn=turn("run-1", now=clock.now(), messages=[message("bob", "I prefer digests.")]))
        )
        assert await harness.drain() == 1
        resp = await stub.GetReflection(pb.GetReflectionRequest(company="acme", seat="ana", turn_id="run-1"))
        assert resp.reflection.state == pb.REFLECTION_STATE_RETRYING
        assert found_lost == [0]
        [retrying] = await read_events(app.infra.pool, "reflection_retrying")
        assert retrying["payload"]["attempts"] == 1
        assert _revoked_logged(caplog) == []
