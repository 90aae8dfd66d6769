"""Erasure of a person's session learning (issue 17): their sessions (events, plans, receipts) go;
a workspace lesson only their session taught goes with its knowledge page; a lesson Dave's session
taught too stays, without her session among its sources; Dave's session is untouched. The review
is a scripted model over real HTTP; everything else is real."""

from __future__ import annotations

import json

from agentlearn.common.v1 import erasure_pb2 as er
from agentlearn.privacy.v1 import privacy_service_pb2 as pv
from agentlearn.privacy.v1 import privacy_service_pb2_grpc as pv_grpc
from tests.support.sessions import SERVICES, review_rule, run_check

SHARED = "Run make migrate before the payments tests: the test database needs the current schema."
HERS = "Pin the billing fixtures to the 2026 price list before running the billing suite."
ROLES = {"swe": {"workspaces": ["payments"]}}


def _lessons(prompt: str) -> list[str]:
    """Each session's lessons: the shared one, and hers only where the billing suite ran."""
    return [SHARED] + ([HERS] if "billing" in prompt else [])


async def test_erase_subject_removes_their_sessions_and_the_lessons_only_they_taught(reviewed, local_embedder):
    names = [*SERVICES, "episodes", "profiles", "reflector", "telemetry", "privacy"]
    companies = {"acme": {"roles": ROLES}}
    async with reviewed(
        review_rule(lessons=_lessons), companies=companies, embedder=local_embedder, names=names
    ) as env:
        await run_check(env, "s-1", user_name="carla", said="The billing tests keep failing on CI.")
        await run_check(env, "s-2", user_name="dave", said="The payments tests keep failing on CI.")
        pool = env.app.infra.pool
        lessons = {r["body"].split("\n")[0]: r for r in await pool.fetch("SELECT * FROM workspace_lessons")}
        shared = next(r for body, r in lessons.items() if SHARED in body)
        hers = next(r for body, r in lessons.items() if HERS in body)
        assert {s["session_id"] for s in json.loads(shared["sources"])} == {"s-1", "s-2"}

        stub = pv_grpc.PrivacyServiceStub(env.app.channel)
        resp = await stub.EraseSubject(
            pv.EraseSubjectRequest(company="acme", subject=er.ErasureSubject(handle="carla", platform="slack"))
        )
        await env.app.components["privacy"].service.worker.drain()
        erasure = (await stub.GetErasure(pv.GetErasureRequest(company="acme", erasure_id=resp.erasure.id))).erasure

        assert erasure.state == pv.ERASURE_STATE_SUCCEEDED and erasure.verified, erasure.reason
        sessions = {t.table: t for r in erasure.reports if r.owner == "sessions" for t in r.tables}
        assert list(sessions["chat_sessions"].ids) == ["s-1"]
        # Hers deleted; the shared one kept with her source dropped (ids name both, deleted first).
        assert list(sessions["workspace_lessons"].ids) == [hers["page_id"], shared["page_id"]]
        assert sessions["workspace_lessons"].count == 1 and sessions["workspace_lessons"].changed == 1
        knowledge = {t.table: t for r in erasure.reports if r.owner == "knowledge" for t in r.tables}
        assert hers["page_id"] in knowledge["knowledge_pages"].ids
        assert shared["page_id"] not in knowledge["knowledge_pages"].ids

        left = {r["session_id"] for r in await pool.fetch("SELECT session_id FROM chat_sessions")}
        assert left == {"s-2"}
        assert await pool.fetchval("SELECT count(*) FROM session_events WHERE session_id = 's-1'") == 0
        assert await pool.fetchval("SELECT count(*) FROM learning_checks WHERE session_id = 's-1'") == 0
        assert await pool.fetchval("SELECT count(*) FROM session_events WHERE session_id = 's-2'") == 3
        rows = {r["page_id"]: r for r in await pool.fetch("SELECT page_id, sources FROM workspace_lessons")}
        assert set(rows) == {shared["page_id"]}
        assert {s["session_id"] for s in json.loads(rows[shared["page_id"]]["sources"])} == {"s-2"}
        pages = {str(r["id"]) for r in await pool.fetch("SELECT id FROM knowledge_pages")}
        assert shared["page_id"] in pages and hers["page_id"] not in pages
