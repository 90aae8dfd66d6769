"""Session learning under faults and after erasures: a fault after a lesson's page is written
leaves the page recorded (who taught it, its id), so her erasure removes it and the next check of
the lesson writes no second page; a session id used again after an erasure gets its checks run
(the erased session's learning jobs go with it; a leftover job gives way rather than leave a
receipt queued forever). Real Postgres, real gRPC, the real embedder, the scripted review."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import asyncpg
import numpy as np

from agentlearn.common.v1 import erasure_pb2 as er
from agentlearn.diary.v1 import diary_service_pb2 as dpb
from agentlearn.diary.v1 import diary_service_pb2_grpc as dgrpc
from agentlearn.privacy.v1 import privacy_service_pb2 as pv
from agentlearn.privacy.v1 import privacy_service_pb2_grpc as pv_grpc
from agentlearn.sessions.v1 import session_service_pb2 as pb
from libs.common.embeddings import EmbeddingUnavailable
from services.sessions.domain import OutputKind
from services.sessions.writes import Writer
from tests.support.embedders import DelegatingEmbedder
from tests.support.sessions import SERVICES, SessionEnv, review_rule, run_check, step, user

DONE, PENDING = pb.STEP_STATUS_DONE, pb.STEP_STATUS_PENDING
PRIVACY = [*SERVICES, "episodes", "profiles", "reflector", "telemetry", "privacy"]
HERS = "Pin the billing fixtures to the 2026 price list before running the billing suite."
ROLES = {"swe": {"workspaces": ["payments"]}}


async def _erase_carla(env: SessionEnv) -> pv.Erasure:
    stub = pv_grpc.PrivacyServiceStub(env.app.channel)
    resp = await stub.EraseSubject(
        pv.EraseSubjectRequest(company="acme", subject=er.ErasureSubject(handle="carla", platform="slack"))
    )
    await env.app.components["privacy"].service.worker.drain()
    return (await stub.GetErasure(pv.GetErasureRequest(company="acme", erasure_id=resp.erasure.id))).erasure


async def test_a_fault_after_the_lesson_page_is_written_leaves_it_recorded_reused_and_erasable(  # type: ignore[no-untyped-def]
    reviewed, local_embedder, monkeypatch
):
    """Postgres drops (or the process dies) right after UpsertPage answered: the page is already
    recorded with who taught it, the next check of the lesson writes that page again rather than a
    second one, and her erasure removes it."""
    fault = {"on": True}
    answer = Writer._answer

    async def dropped_after(self: Writer, call: Any, kind: OutputKind, service: str, out: Any) -> Any:
        got = await answer(self, call, kind, service, out)
        if kind is OutputKind.PROJECT_LESSON and got is not None and fault["on"]:
            raise asyncpg.exceptions.ConnectionDoesNotExistError("connection was closed in the middle of operation")
        return got

    monkeypatch.setattr(Writer, "_answer", dropped_after)
    lessons = [HERS]
    async with reviewed(
        review_rule(lessons=lambda _prompt: lessons),
        companies={"acme": {"roles": ROLES}},
        embedder=local_embedder,
        names=PRIVACY,
    ) as env:
        pool = env.app.infra.pool
        first = await run_check(env, "s-1", user_name="carla", said="The billing tests keep failing on CI.")
        assert first.state == pb.CHECK_STATE_INTERRUPTED and not first.outputs, first.reason
        (page,) = await pool.fetch("SELECT id FROM knowledge_pages")
        (lesson,) = await pool.fetch("SELECT page_id, sources FROM workspace_lessons")
        assert lesson["page_id"] == str(page["id"])
        (source,) = json.loads(lesson["sources"])
        assert (source["session_id"], source["subjects"]) == ("s-1", [{"handle": "carla"}])

        # Her next check teaches the same lesson (another case): the same page, no second one.
        fault["on"] = False
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
