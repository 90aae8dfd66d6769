"""Session learning under faults and after erasures: a fault after a lesson's page is written
leaves the page recorded (who taught it, its id), so her erasure removes it and the next check of
the lesson writes no second page; a session id used again after an erasure gets its checks run
(the erased session's learning jobs go with it; a leftover job gives way rather than leave a
receipt queued forever). Real Postgres, real gRPC, the real embedder, the scripted review."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from agentlearn.common.v1 import erasure_pb2 as er
from agentlearn.diary.v1 import diary_service_pb2 as dpb
from agentlearn.diary.v1 import diary_service_pb2_grpc as dgrpc
from agentlearn.privacy.v1 import privacy_service_pb2 as pv
from agentlearn.privacy.v1 import privacy_service_pb2_grpc as pv_grpc
from agentlearn.sessions.v1 import session_service_pb2 as pb
from libs.common.embeddings import EmbeddingUnavailable
from libs.common.events import read_events
from tests.support.embedders import DelegatingEmbedder
from tests.support.sessions import SERVICES, SessionEnv, review_rule, run_check, step, user

DONE, PENDING = pb.STEP_STATUS_DONE, pb.STEP_STATUS_PENDING
PRIVACY = [*SERVICES, "episodes", "profiles", "reflector", "telemetry", "privacy"]
HERS = "Pin the billing fixtures to the 2026 price list before running the billing suite."
THEIRS = "Rebuild the invoice snapshots after changing any billing template."
ROLES = {"swe": {"workspaces": ["payments"]}}


async def _erase_carla(env: SessionEnv) -> pv.Erasure:
    stub = pv_grpc.PrivacyServiceStub(env.app.channel)
    resp = await stub.EraseSubject(
        pv.EraseSubjectRequest(company="acme", subject=er.ErasureSubject(handle="carla", platform="slack"))
    )
    await env.app.components["privacy"].service.worker.drain()
    return (await stub.GetErasure(pv.GetErasureRequest(company="acme", erasure_id=resp.erasure.id))).erasure


async def test_a_fault_after_the_lesson_page_is_written_leaves_it_recorded_reused_and_erasable(  # type: ignore[no-untyped-def]
    reviewed, local_embedder
):
    """Postgres fails right after UpsertPage answered (here: it refuses the record of the check's
    next lesson, a real failure of the store that no receipt names): the check ends interrupted,
    closing with its event; the page is already recorded with who taught it, the next check of the
    lesson writes that page again rather than a second one, and her erasure removes it."""
    lessons = [HERS, THEIRS]
    async with reviewed(
        review_rule(lessons=lambda _prompt: lessons),
        companies={"acme": {"roles": ROLES}},
        embedder=local_embedder,
        names=PRIVACY,
    ) as env:
        pool = env.app.infra.pool
        await pool.execute(
            """CREATE FUNCTION refuse_theirs() RETURNS trigger LANGUAGE plpgsql AS $$
               BEGIN RAISE EXCEPTION 'could not extend file: No space left on device'; END $$"""
        )
        await pool.execute(
            "CREATE TRIGGER refuse_theirs BEFORE INSERT OR UPDATE ON workspace_lessons FOR EACH ROW "
            f"WHEN (NEW.body LIKE '{THEIRS[:20]}%') EXECUTE FUNCTION refuse_theirs()"
        )
        first = await run_check(env, "s-1", user_name="carla", said="The billing tests keep failing on CI.")
        assert first.state == pb.CHECK_STATE_INTERRUPTED and "No space left on device" in first.reason, first.reason
        (page,) = await pool.fetch("SELECT id FROM knowledge_pages")
        assert [(o.kind, o.id) for o in first.outputs] == [(pb.OUTPUT_KIND_PROJECT_LESSON, str(page["id"]))]
        (lesson,) = await pool.fetch("SELECT page_id, sources FROM workspace_lessons")
        assert lesson["page_id"] == str(page["id"])
        (source,) = json.loads(lesson["sources"])
        assert (source["session_id"], source["subjects"]) == ("s-1", [{"handle": "carla"}])
        # Its closing event names the check, as its queued event did.
        (closed,) = await read_events(pool, "learning_check_interrupted")
        assert {k: closed["payload"].get(k) for k in ("check_id", "session_id", "trigger", "reason")} == {
            "check_id": first.check_id,
            "session_id": "s-1",
            "trigger": "manual",
            "reason": first.reason,
        }
        assert (closed["company"], closed["seat"]) == ("acme", first.seat)

        # Her next check teaches the same lesson (another case): the same page, no second one.
        await pool.execute("DROP TRIGGER refuse_theirs ON workspace_lessons")
        lessons[:] = [HERS.upper()]
        again = await run_check(env, "s-2", user_name="carla", said="The billing tests fail again.")
        assert again.state == pb.CHECK_STATE_COMPLETED, again.reason
        assert [(o.kind, o.id) for o in again.outputs] == [(pb.OUTPUT_KIND_PROJECT_LESSON, str(page["id"]))]
        assert await pool.fetchval("SELECT count(*) FROM knowledge_pages") == 1

        erasure = await _erase_carla(env)
        assert erasure.state == pv.ERASURE_STATE_SUCCEEDED and erasure.verified, erasure.reason
        assert await pool.fetchval("SELECT count(*) FROM knowledge_pages") == 0
        assert await pool.fetchval("SELECT count(*) FROM workspace_lessons") == 0


class SwitchedEmbedder(DelegatingEmbedder):
    """The local model, switched off (unavailable) while ``down``."""

    down = False

    async def embed(self, texts: Sequence[str]) -> list[Any]:
        if self.down:
            raise EmbeddingUnavailable("switched off by the test")
        vectors: list[Any] = await self._inner.embed(texts)
        return vectors

    async def embed_pieces(self, pieces: Sequence[str]) -> list[np.ndarray]:
        if self.down:
            raise EmbeddingUnavailable("switched off by the test")
        vectors: list[np.ndarray] = await self._inner.embed_pieces(pieces)
        return vectors


async def test_a_fact_the_dedup_could_not_compare_with_every_note_is_a_partial_failure(  # type: ignore[no-untyped-def]
    reviewed, local_embedder
):
    """Embedding-backed dedup that could not run fully is not a silent WRITTEN: with the query's
    embedding failed, or with an earlier note that has no vector yet, the paraphrase is written and
    the receipt says it was not deduplicated."""
    fact = "Dana reviews pull requests only in the mornings."
    paraphrase = "Dana reviews pull requests only in the morning."
    embedder = SwitchedEmbedder(local_embedder)
    async with reviewed(review_rule(facts=[fact]), embedder=embedder) as env:
        diary = dgrpc.DiaryServiceStub(env.app.channel)
        embedder.down = True
        for seat in ("ana", "bo"):
            await diary.WriteNote(
                dpb.WriteNoteRequest(company="acme", seat=seat, content=paraphrase, tier=dpb.NOTE_TIER_LONG)
            )
        failed = await run_check(env, "s1")  # the query cannot be embedded
        embedder.down = False
        env.seat = "bo"
        unreachable = await run_check(env, "s2")  # the query is, bo's note has no vector
    for check, why in ((failed, "did not run (the query's embedding: FAILED)"), (unreachable, "with 1 of the")):
        (written,) = check.outputs
        assert written.kind == pb.OUTPUT_KIND_PERSONAL_FACT
        assert written.disposition == pb.OUTPUT_DISPOSITION_WRITTEN
        (gap,) = [p for p in check.partial_failures if p.failure == pb.FAILURE_KIND_NOT_DEDUPLICATED]
        assert gap.kind == pb.OUTPUT_KIND_PERSONAL_FACT and gap.output_id == written.id and why in gap.detail
        assert check.outcome == pb.CHECK_OUTCOME_COMPLETED


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
