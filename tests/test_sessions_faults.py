"""Session learning under faults and after erasures: a session id used again after an erasure gets
its checks run (the erased session's learning jobs go with it; a leftover job gives way rather
than leave a receipt queued forever). Real Postgres, real gRPC, the scripted review."""

from __future__ import annotations

from agentlearn.privacy.v1 import privacy_service_pb2 as pv
from agentlearn.privacy.v1 import privacy_service_pb2_grpc as pv_grpc
from agentlearn.sessions.v1 import session_service_pb2 as pb
from tests.support.sessions import SERVICES, SessionEnv, review_rule, step, user

DONE, PENDING = pb.STEP_STATUS_DONE, pb.STEP_STATUS_PENDING
PRIVACY = [*SERVICES, "episodes", "profiles", "reflector", "telemetry", "privacy"]


async def _learning_jobs(env: SessionEnv) -> list[str]:
    rows = await env.app.infra.pool.fetch("SELECT key FROM background_jobs WHERE kind = 'learning' ORDER BY key")
    return [r["key"] for r in rows]


async def _second_life(env: SessionEnv, clock) -> None:  # type: ignore[no-untyped-def]
    """The engine goes on with session s1 (its revisions start again): the plan's check and a
    manual check both run."""
    await env.append("s1", user("s1-b", "next task", clock.now()))
    again = await env.plan("s1", 1, step("a", DONE), step("b", PENDING))
    assert again.queued_check.check_id
    assert await env.drain() == 1
    (check,) = await env.checks("s1")
    assert check.check_id == again.queued_check.check_id
    assert check.state == pb.CHECK_STATE_COMPLETED, check.reason
    manual = await env.manual("s1")
    assert not manual.reused and manual.check.check_id != check.check_id
    assert await env.drain() == 1


async def test_a_session_id_used_again_after_an_erasure_gets_its_checks_run(reviewed, clock):  # type: ignore[no-untyped-def]
    async with reviewed(review_rule(), names=PRIVACY) as env:
        await env.append("s1", user("s1-a", "let's begin", clock.now()))
        first = await env.plan("s1", 1, step("a", DONE), step("b", PENDING))
        assert first.queued_check.check_id
        assert await env.drain() == 1
        assert await _learning_jobs(env) == ["plan:s1:1"]

        stub = pv_grpc.PrivacyServiceStub(env.app.channel)
        resp = await stub.EraseSeat(pv.EraseSeatRequest(company="acme", seat="ana"))
        await env.app.components["privacy"].service.worker.drain()
        erasure = (await stub.GetErasure(pv.GetErasureRequest(company="acme", erasure_id=resp.erasure.id))).erasure
        assert erasure.state == pv.ERASURE_STATE_SUCCEEDED and erasure.verified, erasure.reason
        sessions = {t.table: t for r in erasure.reports if r.owner == "sessions" for t in r.tables}
        assert list(sessions["background_jobs:learning"].ids) == ["plan:s1:1"]
        assert await _learning_jobs(env) == []

        await _second_life(env, clock)


async def test_a_leftover_job_of_the_key_gives_way_to_the_new_receipt(reviewed, clock):  # type: ignore[no-untyped-def]
    """A session erased before its jobs went with it (the rows an older erasure left): the new
    receipt gets its job instead of staying queued with none."""
    async with reviewed(review_rule()) as env:
        await env.append("s1", user("s1-a", "let's begin", clock.now()))
        await env.plan("s1", 1, step("a", DONE), step("b", PENDING))
        assert await env.drain() == 1
        await env.app.infra.pool.execute("DELETE FROM chat_sessions WHERE session_id = 's1'")
        assert await _learning_jobs(env) == ["plan:s1:1"]

        await _second_life(env, clock)
