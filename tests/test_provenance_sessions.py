"""Session lessons' provenance (issue 17): what a learning check writes is followed back to the
session, the check and the session events it was derived from, with the model and the prompt
version that produced it — a workspace lesson through SessionService.GetLessonProvenance (every
session that taught it), a personal fact through the diary's GetNoteProvenance; the refusals.

Real parts: the services on a loopback gRPC server, Postgres, the local embedding model, the review
answered by a scripted OpenAI-compatible server over HTTP and the memory judge by the offline rules.
"""

from __future__ import annotations

import grpc
import pytest

from agentlearn.diary.v1 import diary_service_pb2 as dpb
from agentlearn.diary.v1 import diary_service_pb2_grpc as dgrpc
from agentlearn.sessions.v1 import session_service_pb2 as pb
from services.sessions.writes import JUDGE_PROMPT_VERSION, REVIEW_PROMPT_VERSION
from tests.support.grpc_errors import error_info
from tests.support.sessions import LESSON, review_rule, run_check

pytestmark = pytest.mark.timeout(300)


async def test_a_lesson_is_followed_back_to_every_session_check_and_event_that_taught_it(reviewed, local_embedder):
    async with reviewed(review_rule(lessons=[LESSON]), embedder=local_embedder) as env:
        first = await run_check(env, "s1")
        second = await run_check(env, "s2", user_name="eli")  # another person's session teaches it again
        resp = await env.stub.GetLessonProvenance(
            pb.GetLessonProvenanceRequest(company="acme", page_id=first.outputs[0].id)
        )
    assert second.outputs[0].id == first.outputs[0].id
    assert resp.workspace == "payments" and resp.title
    assert [(s.session_id, s.check_id) for s in resp.sources] == [
        ("s1", first.check_id),
        ("s2", second.check_id),
    ]
    for source, owner, check in zip(resp.sources, ["dana", "eli"], [first, second], strict=True):
        # The events it was derived from: the ones the check's receipt cites for the lesson.
        assert list(source.event_ids) == list(check.outputs[0].evidence_ids) == [f"{source.session_id}-v"]
        assert [s.handle for s in source.subjects] == [owner]
        assert source.model == "small" and source.prompt_version == REVIEW_PROMPT_VERSION
        assert source.writer == "session_check"


async def test_a_personal_fact_names_its_session_check_events_model_and_prompt(reviewed, local_embedder):
    async with reviewed(
        review_rule(facts=["Dana reviews pull requests only in the mornings."]), embedder=local_embedder
    ) as env:
        check = await run_check(env, "s1")
        (written,) = check.outputs
        prov = (
            await dgrpc.DiaryServiceStub(env.app.channel).GetNoteProvenance(
                dpb.GetNoteProvenanceRequest(company="acme", seat="ana", note_id=written.id)
            )
        ).provenance
    assert written.kind == pb.OUTPUT_KIND_PERSONAL_FACT
    assert (prov.session_id, prov.check_id, list(prov.event_ids)) == ("s1", check.check_id, ["s1-u"])
    assert [s.handle for s in prov.subjects] == ["dana"] and prov.writer == "session_check"
    # The memory judge (here the offline rules) wrote the note's content; both prompts shaped it.
    assert prov.model == "offline-rules" and prov.prompt_version == JUDGE_PROMPT_VERSION


async def test_get_lesson_provenance_refusals(reviewed, local_embedder):
    async with reviewed(review_rule(lessons=[LESSON]), embedder=local_embedder) as env:
        check = await run_check(env, "s1")

        async def refused(company: str, page_id: str) -> tuple:  # type: ignore[type-arg]
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await env.stub.GetLessonProvenance(pb.GetLessonProvenanceRequest(company=company, page_id=page_id))
            return error_info(err.value)

        code, _, bad = await refused("acme", "not a page")
        assert code == grpc.StatusCode.INVALID_ARGUMENT and [v.field for v in bad.field_violations] == ["page_id"]
        code, _, bad = await refused("acme", "")
        assert code == grpc.StatusCode.INVALID_ARGUMENT and [v.field for v in bad.field_violations] == ["page_id"]
        code, info, _ = await refused("acme", "7d0d9a8e-1111-4222-8333-444455556666")
        assert code == grpc.StatusCode.NOT_FOUND and info.reason == "LESSON_NOT_FOUND"
        # Another company's lesson is not found (never told it exists).
        code, info, _ = await refused("globex", check.outputs[0].id)
        assert code == grpc.StatusCode.NOT_FOUND and info.reason == "LESSON_NOT_FOUND"
