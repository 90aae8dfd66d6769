"""An erasure stops the work already in flight on the person's jobs at once, not at the next claim
renewal (libs/common/jobs.py ``HeldClaims``): the statement that empties or deletes a running job
NOTIFYs ``revoked:<kind>`` at its commit, and every worker of that kind re-checks its claims and
cancels the work of those it lost.

Before, a reflection of her turn blocked in its model call went on after the erasure took its turn,
until its next renewal (a third of ``claim_lease_seconds``), and wrote her note and profile after
the erasure had succeeded and been verified: nothing erased them again. A session learning check of
her session did the same with her workspace lesson. The leases here are long (120 s) so a renewal
cannot be what stops the work; the model calls are held by the scripted server until the erasure
is over. Everything else is real: Postgres, gRPC on loopback, the local embedding model.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from collections.abc import Awaitable, Callable

import pytest

from agentlearn.common.v1 import erasure_pb2 as er
from agentlearn.privacy.v1 import privacy_service_pb2 as pv
from agentlearn.privacy.v1 import privacy_service_pb2_grpc as pv_grpc
from agentlearn.reflector.v1 import reflector_service_pb2 as rf_pb
from agentlearn.reflector.v1 import reflector_service_pb2_grpc as rf_grpc
from libs.common.db import connect_pool
from libs.common.jobs import NOTIFY_CHANNEL, HeldClaims, JobQueue, listen, revoked_payload, run_claimed
from tests.support.app import App, open_app
from tests.support.scripted_openai import Reply, openai_provider
from tests.support.sessions import (
    SERVICES,
    is_review,
    open_sessions,
    prompt_text,
    review_rule,
    run_check,
    user,
    verification,
    wait_for,
)
from tests.support.sessions import result as tool_result
from tests.support.turns import message, turn

pytestmark = pytest.mark.timeout(300)

NAMES = [
    "diary", "episodes", "skills", "profiles", "reflector", "knowledge", "prefetch", "sessions", "telemetry", "privacy",
]  # fmt: skip
LEASE = 120.0
"""Renewed every 40 s: far past the deadline below, so only the revocation can stop the work."""
STOPPED_WITHIN = 10.0
"""How long the work may take to stop once the erasure is over (it stops at the erasure's commit)."""


async def _erase_carla(app: App) -> None:
    """Her erasure, run to its end by the privacy worker: SUCCEEDED and verified."""
    privacy = pv_grpc.PrivacyServiceStub(app.channel)
    resp = await privacy.EraseSubject(
        pv.EraseSubjectRequest(
            company="acme", subject=er.ErasureSubject(handle="carla", platform="slack"), names=["Carla Moreno"]
        )
    )
    await app.components["privacy"].service.worker.drain()
    got = (await privacy.GetErasure(pv.GetErasureRequest(company="acme", erasure_id=resp.erasure.id))).erasure
    assert got.state == pv.ERASURE_STATE_SUCCEEDED and got.verified, got.reason


def _logged(caplog: pytest.LogCaptureFixture, *texts: str) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return any(t in r.getMessage() for r in caplog.records for t in texts)

    return check


async def _stopped_or_not(predicate: Callable[[], Awaitable[bool]]) -> None:
    """Wait for the work to stop, up to ``STOPPED_WITHIN``; the caller releases the model either way
    and asserts what was written (a work not stopped writes after the erasure: that is the defect)."""
    with contextlib.suppress(TimeoutError):
        await wait_for(predicate, timeout=STOPPED_WITHIN)


# ------------------------------------------------------------------------------ the reflector


def _hers(body: dict) -> bool:
    """A model call about her turn (she asked about the billing export; Dave about load tests)."""
    return "billing" in prompt_text(body)


def _reflection_answer(body: dict) -> str:
    """One answer both workers read: the persist decider's note, the profiler's observation."""
    who, what = ("Carla", "the billing export in euros") if _hers(body) else ("Dave", "load tests on staging")
    return json.dumps(
        {
            "classification": "LONG",
            "content": f"{who} prefers {what}.",
            "reason": "stated in the turn",
            "communication_style": f"{who} writes short, direct messages.",
            "topics": [what],
        }
    )


async def test_a_reflection_in_its_model_call_stops_when_the_erasure_takes_her_turn(
    make_settings, dsn, clock, scripted_openai, local_embedder, edge_index, caplog
):
    caplog.set_level(logging.INFO)
    hold = threading.Event()
    scripted_openai.chat_handler = _reflection_answer
    # Her turn's model calls are held open until the erasure is over; Dave's are answered at once.
    scripted_openai.rule("chat", lambda body: Reply(hold=hold) if _hers(body) else None)
    settings = make_settings(
        learning={"reflection": {"workers": ["persist_decider", "profiler"], "claim_lease_seconds": LEASE}},
        providers={
            "llm": {"scripted": openai_provider(scripted_openai, "scripted-chat", timeout_seconds=120)},
            "auxiliary_chain": ["scripted"],
        },
    )
    async with open_app(settings, dsn, names=NAMES, clock=clock, embedder=local_embedder, index=edge_index) as app:
        reflector = rf_grpc.ReflectorServiceStub(app.channel)
        harness = app.components["reflector"].service.harness
        pool = app.infra.pool
        reflecting = asyncio.create_task(harness.run_forever(app.infra.listen_dsn))  # the worker loop
        try:

            async def submit(run: str, person: str, body: str) -> None:
                t = turn(run, now=clock.now(), messages=[message(person, body)], label="Message: Slack message")
                await reflector.SubmitTurn(rf_pb.SubmitTurnRequest(turn=t))

            async def state(run: str) -> int:
                resp = await reflector.GetReflection(
                    rf_pb.GetReflectionRequest(company="acme", seat="ana", turn_id=run)
                )
                return resp.reflection.state

            # The control: the same loop and the same answers write Dave's note and profile.
            await submit("run-dave", "dave", "I prefer load tests on staging.")
            await wait_for(lambda: _is(state("run-dave"), rf_pb.REFLECTION_STATE_COMPLETED), timeout=60)
            assert await pool.fetchval("SELECT count(*) FROM agent_diary WHERE turn_id = 'run-dave'") == 1
            assert await pool.fetchval("SELECT count(*) FROM counterparty_profiles WHERE subject_handle = 'dave'") == 1

            await submit("run-held", "carla", "I prefer the billing export in euros.")
            await wait_for(lambda: _true(scripted_openai.held == 2), timeout=60)  # both workers in their call
            await _erase_carla(app)
            await _stopped_or_not(_logged(caplog, "was erased while it was reflected"))
            hold.set()  # her model calls answer now: a pass still running writes what they say
            await wait_for(
                _logged(caplog, "was erased while it was reflected", "lost the claim on run-held"), timeout=60
            )
            # Nothing of hers was written after the erasure that took her turn (and verified).
            assert await pool.fetchval("SELECT count(*) FROM agent_diary WHERE turn_id = 'run-held'") == 0
            assert await pool.fetchval("SELECT count(*) FROM agent_diary WHERE content ILIKE '%carla%'") == 0
            assert await pool.fetchval("SELECT count(*) FROM counterparty_profiles WHERE subject_handle = 'carla'") == 0
            assert await pool.fetchval("SELECT count(*) FROM profile_observations WHERE turn_id = 'run-held'") == 0
            # The pass was stopped as a revoked claim, at once, not finished as a lost one.
            assert await _logged(caplog, "was erased while it was reflected")()
            assert not await _logged(caplog, "lost the claim on run-held")()
            # Dave's lessons are his own: kept.
            assert await pool.fetchval("SELECT count(*) FROM agent_diary WHERE turn_id = 'run-dave'") == 1
            assert await pool.fetchval("SELECT count(*) FROM counterparty_profiles WHERE subject_handle = 'dave'") == 1
        finally:
            hold.set()
            reflecting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reflecting


async def _is(value: Awaitable[int], wanted: int) -> bool:
    return await value == wanted


async def _true(value: bool) -> bool:
    return value


# ------------------------------------------------------------------------------ session learning

HERS = "Pin the billing fixtures to the 2026 price list before running the billing suite."
HIS = "Run make migrate before the payments tests: the test database needs the current schema."


async def test_a_learning_check_in_its_review_stops_when_the_erasure_deletes_her_session(
    make_settings, dsn, clock, scripted_openai, local_embedder, edge_index, caplog
):
    caplog.set_level(logging.INFO)
    hold = threading.Event()
    review = review_rule(lessons=lambda prompt: [HERS] if "billing" in prompt else [HIS])

    def rule(body: dict) -> Reply | None:
        reply = review(body)
        if reply is not None and is_review(body) and "billing" in prompt_text(body):
            reply.hold = hold  # her session's review is held open until the erasure is over
        return reply

    scripted_openai.rule("chat", rule)
    settings = make_settings(
        # As ``reviewed_settings``, the review's deadline past the test's: the held call never times out.
        providers={
            "llm": {
                "scripted": openai_provider(scripted_openai, "small", timeout_seconds=120),
                "offline": {"kind": "offline"},
            },
            "auxiliary_chain": ["scripted", "offline"],
        },
        companies={"acme": {"roles": {"swe": {"workspaces": ["payments"]}}}},
        sessions={"claim_lease_seconds": LEASE},
    )
    names = [*SERVICES, "episodes", "profiles", "reflector", "telemetry", "privacy"]
    async with open_sessions(settings, dsn, names=names, clock=clock, embedder=local_embedder, index=edge_index) as env:
        pool = env.app.infra.pool
        # The control: the same review writes Dave's lesson.
        await run_check(env, "s-dave", user_name="dave", said="The payments tests keep failing on CI.")
        assert await pool.fetchval("SELECT count(*) FROM workspace_lessons WHERE body LIKE $1", f"{HIS}%") == 1

        checking = asyncio.create_task(env.sessions.worker.run_forever(env.app.infra.listen_dsn))  # the worker loop
        try:
            t = clock.now()
            await env.append(
                "s-carla",
                user("s-carla-u", "The billing tests keep failing on CI.", t),
                tool_result("s-carla-r", "make", "make migrate: applied 3 migrations", t),
                verification("s-carla-v", "pytest", "42 passed", t),
                user="carla",
                workspace="payments",
            )
            await env.manual("s-carla", user="carla")
            await wait_for(lambda: _true(scripted_openai.held == 1), timeout=60)  # her check is in its review
            await _erase_carla(env.app)
            await _stopped_or_not(_logged(caplog, "was revoked (erased); its work stopped"))
            hold.set()  # the review answers now: a check still running writes her lesson
            await wait_for(
                _logged(caplog, "was revoked (erased); its work stopped", "before finishing; it stays interrupted"),
                timeout=60,
            )
            # Nothing learned from her session was written after the erasure that deleted it.
            assert await pool.fetchval("SELECT count(*) FROM workspace_lessons WHERE body LIKE $1", f"{HERS}%") == 0
            assert await pool.fetchval("SELECT count(*) FROM knowledge_pages WHERE body LIKE $1", f"{HERS}%") == 0
            assert await _logged(caplog, "was revoked (erased); its work stopped")()
            assert not await _logged(caplog, "before finishing; it stays interrupted")()
            # Dave's lesson is his own: kept.
            assert await pool.fetchval("SELECT count(*) FROM workspace_lessons WHERE body LIKE $1", f"{HIS}%") == 1
        finally:
            hold.set()
            checking.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await checking


# ------------------------------------------------------------------------------ the queue itself


async def test_a_revocation_notice_stops_only_the_claims_that_were_taken(dsn, clock):
    """Two claims of one worker; an erasure's statement takes one (clears its claim and NOTIFYs):
    that one's work is cancelled at once, the other's goes on, and a notice of another kind is
    nobody's business here."""
    pool = await connect_pool(dsn, max_size=5)
    queue = JobQueue(pool)
    claims = HeldClaims()
    started = {k: asyncio.Event() for k in ("gone", "kept")}
    release = asyncio.Event()
    ended: dict[str, str] = {}

    async def process(job) -> None:  # type: ignore[no-untyped-def]
        started[job.key].set()
        try:
            await release.wait()
            ended[job.key] = "finished"
        except asyncio.CancelledError:
            ended[job.key] = "cancelled"
            raise

    tasks: list[asyncio.Task[object]] = []
    try:
        for key in ("gone", "kept"):
            async with pool.acquire() as conn, conn.transaction():
                await queue.enqueue(
                    conn, kind="learning", key=key, company="acme", seat="ana", payload=b"", trace_carrier={},
                    now=clock.now(),
                )  # fmt: skip
        jobs = {}
        for _ in range(2):
            job = await queue.claim("learning", "w", clock.now(), LEASE, reclaim_lapsed=False)
            assert job is not None
            jobs[job.key] = job
        tasks.append(asyncio.create_task(listen(dsn, ["learning"], lambda: None, on_revoke=claims.revoked)))
        tasks.append(asyncio.create_task(claims.watch(queue, "w")))
        runs = {
            k: asyncio.create_task(run_claimed(queue, j, "w", clock, LEASE, process, when_lost="-", claims=claims))
            for k, j in jobs.items()
        }
        for event in started.values():
            await asyncio.wait_for(event.wait(), 10)
        # A notice of another kind, and one of this kind that took nothing of ours: nothing stops.
        await pool.execute("SELECT pg_notify($1, $2)", NOTIFY_CHANNEL, revoked_payload("reflection"))
        await pool.execute("SELECT pg_notify($1, $2)", NOTIFY_CHANNEL, revoked_payload("learning"))
        await pool.execute(  # the erasure's statement: the job goes, its holder is told at the commit
            """
            WITH gone AS (DELETE FROM background_jobs WHERE id = $1 RETURNING id)
            SELECT pg_notify($2, $3) WHERE EXISTS (SELECT 1 FROM gone)""",
            jobs["gone"].id,
            NOTIFY_CHANNEL,
            revoked_payload("learning"),
        )
        await asyncio.wait_for(runs["gone"], STOPPED_WITHIN)
        assert ended == {"gone": "cancelled"}
        assert not runs["kept"].done()
        release.set()
        await asyncio.wait_for(runs["kept"], 10)
        assert ended == {"gone": "cancelled", "kept": "finished"}
    finally:
        release.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await pool.close()
