"""What a check writes (spec "Writes and isolation"), with the real embedding model and index:
project lessons as workspace-scoped, indexed knowledge pages that every seat of the workspace
finds (search_knowledge and the turn-start knowledge block), identical normalized content reusing
its page; personal facts through the memory judge and the embedding-backed dedup into the session
seat's diary, and none at all when memory.extraction_cadence is off."""

from __future__ import annotations

import json

from agentlearn.diary.v1 import diary_service_pb2 as dpb
from agentlearn.diary.v1 import diary_service_pb2_grpc as dgrpc
from agentlearn.prefetch.v1 import prefetch_service_pb2 as ppb
from agentlearn.prefetch.v1 import prefetch_service_pb2_grpc as pgrpc
from agentlearn.sessions.v1 import session_service_pb2 as pb
from tests.support.scripted_openai import Reply
from tests.support.sessions import (
    LESSON,
    WORKSPACE_ROLES,
    chat_answer,
    is_review,
    prompt_text,
    review_rule,
    run_check,
)


async def test_a_lesson_is_an_indexed_workspace_note_every_seat_of_the_workspace_finds(reviewed, local_embedder):
    async with reviewed(review_rule(lessons=[LESSON]), embedder=local_embedder) as env:
        check = await run_check(env, "s1")
        builtins = pgrpc.BuiltinServiceStub(env.app.channel)
        prefetch = pgrpc.PrefetchServiceStub(env.app.channel)
        # Another seat whose role lists the workspace finds the lesson; a role that does not, does not.
        found = await builtins.SearchKnowledge(
            ppb.SearchKnowledgeRequest(company="acme", seat="bo", role="sre", query="payments tests database schema")
        )
        outside = await builtins.SearchKnowledge(
            ppb.SearchKnowledgeRequest(company="acme", seat="cy", role="writer", query="payments tests database schema")
        )
        context = await prefetch.BuildTurnContext(
            ppb.BuildTurnContextRequest(
                company="acme", seat="bo", role="sre", turn_id="bo-1", ask="Why do the payments tests fail on CI?"
            )
        )
        page = await env.app.infra.pool.fetchrow(
            "SELECT container, title, body, embedding_model, indexed FROM knowledge_pages WHERE id = $1::uuid",
            check.outputs[0].id,
        )
    assert check.outcome == pb.CHECK_OUTCOME_COMPLETED and list(check.partial_failures) == []
    (out,) = check.outputs
    assert out.kind == pb.OUTPUT_KIND_PROJECT_LESSON and list(out.evidence_ids) == ["s1-v"]
    assert page["container"] == "workspace:payments" and page["embedding_model"] == local_embedder.model
    assert page["indexed"] and LESSON in page["body"] and "Learned in session s1" in page["body"]
    assert "s1-v" in page["body"] and check.check_id in page["body"]
    assert [h.page_id for h in found.hits][:1] == [out.id]
    # The writer searched its own containers: the workspace's lesson is not among them.
    assert outside.status == ppb.SEARCH_STATUS_SEARCHED and list(outside.hits) == []
    knowledge = next(b for b in context.blocks if b.block == ppb.BLOCK_RELEVANT_KNOWLEDGE)
    assert out.id in knowledge.ids and "make migrate" in knowledge.markdown


async def test_identical_normalized_content_reuses_its_note_and_keeps_every_source(
    reviewed, local_embedder, scripted_openai
):
    async with reviewed(review_rule(lessons=[LESSON]), embedder=local_embedder) as env:
        first = await run_check(env, "s1")
        scripted_openai.rule(
            "chat",
            review_rule(
                lessons=["  run MAKE migrate before the payments tests — the test database needs the current schema!  "]
            ),
        )
        second = await run_check(env, "s2")
        pages = await env.app.infra.pool.fetchval(
            "SELECT count(*) FROM knowledge_pages WHERE container = 'workspace:payments'"
        )
        sources = await env.app.infra.pool.fetchval("SELECT sources FROM workspace_lessons")
        body = await env.app.infra.pool.fetchval("SELECT body FROM knowledge_pages")
    assert first.outputs[0].disposition == pb.OUTPUT_DISPOSITION_WRITTEN
    assert second.outputs[0].disposition == pb.OUTPUT_DISPOSITION_REUSED
    assert second.outputs[0].id == first.outputs[0].id and pages == 1
    assert second.counts.lessons_reused == 1 and second.counts.lessons_written == 0
    assert [s["session_id"] for s in json.loads(sources)] == ["s1", "s2"]
    assert LESSON in body  # the page keeps the text it was first written with


async def test_a_fact_whose_note_was_deleted_is_not_written_again_and_says_so(reviewed, local_embedder):
    """The fact's key (its normalized content) outlives its note: deleted by an operator, the note
    is not brought back by a later check learning the same fact, and the check says so rather than
    naming a note that is not there."""
    fact = "Dana reviews pull requests only in the mornings."
    async with reviewed(review_rule(facts=[fact]), embedder=local_embedder) as env:
        diary = dgrpc.DiaryServiceStub(env.app.channel)
        first = await run_check(env, "s1")
        (written,) = first.outputs
        await diary.DeleteNote(dpb.DeleteNoteRequest(company="acme", seat="ana", note_id=written.id))
        again = await run_check(env, "s2")
        notes = await diary.ListNotes(dpb.ListNotesRequest(company="acme", seat="ana"))
    assert written.disposition == pb.OUTPUT_DISPOSITION_WRITTEN
    assert list(again.outputs) == [] and notes.total_size == 0
    # Nothing failed (the diary applied its rule): dropped with the reason, the check not FAILED.
    assert list(again.partial_failures) == []
    assert again.outcome == pb.CHECK_OUTCOME_COMPLETED_EMPTY, again.reason
    (dropped,) = again.dropped
    assert dropped.kind == pb.OUTPUT_KIND_PERSONAL_FACT and "was deleted since" in dropped.reason


async def test_personal_facts_go_to_the_session_seats_diary_through_the_judge_and_dedup(reviewed, local_embedder):
    fact = "Dana reviews pull requests only in the mornings."
    async with reviewed(review_rule(facts=[fact]), embedder=local_embedder) as env:
        diary = dgrpc.DiaryServiceStub(env.app.channel)
        known = await diary.WriteNote(
            dpb.WriteNoteRequest(
                company="acme",
                seat="ana",
                content="Dana reviews pull requests only in the morning.",
                tier=dpb.NOTE_TIER_LONG,
            )
        )
        near = await run_check(env, "s1")
        # Another seat's diary has no such note: the fact is written there.
        env.seat = "bo"
        fresh = await run_check(env, "s2")
        notes = await diary.ListNotes(dpb.ListNotesRequest(company="acme", seat="bo"))
        ana = await diary.ListNotes(dpb.ListNotesRequest(company="acme", seat="ana"))
    (reused,) = near.outputs
    assert reused.kind == pb.OUTPUT_KIND_PERSONAL_FACT and reused.disposition == pb.OUTPUT_DISPOSITION_REUSED
    assert reused.id == known.note.id and ana.total_size == 1  # a near-verbatim restatement is not written
    (written,) = fresh.outputs
    assert written.disposition == pb.OUTPUT_DISPOSITION_WRITTEN and list(written.evidence_ids) == ["s2-u"]
    (note,) = notes.notes
    assert note.id == written.id and note.content == fact and note.source == dpb.NOTE_SOURCE_PERSIST_DECIDER
    assert note.embedding_model == local_embedder.model and note.turn_id == "session:s2"


async def test_the_judge_sees_the_seats_recent_notes(reviewed, scripted_openai):
    def rule(body: dict) -> Reply | None:
        if is_review(body):
            return review_rule(facts=["Dana reviews pull requests only in the mornings."])(body)
        return Reply(body=chat_answer(json.dumps({"verdicts": [{"id": "F1", "classification": "NOOP"}]})))

    async with reviewed(rule) as env:
        await dgrpc.DiaryServiceStub(env.app.channel).WriteNote(
            dpb.WriteNoteRequest(
                company="acme", seat="ana", content="Dana is on call this week.", tier=dpb.NOTE_TIER_LONG
            )
        )
        check = await run_check(env, "s1")
    judged = [prompt_text(b) for b in scripted_openai.received("chat") if not is_review(b)]
    assert len(judged) == 1 and "Dana is on call this week." in judged[0]
    assert check.outcome == pb.CHECK_OUTCOME_COMPLETED_EMPTY
    assert check.dropped[0].reason.startswith("the memory judge classified it NOOP")


async def test_extraction_cadence_off_for_a_user_or_a_company_writes_no_personal_memory(reviewed):
    companies = {
        "acme": {"roles": WORKSPACE_ROLES, "users": {"dana": {"memory": {"extraction_cadence": "off"}}}},
        # YAML reads a bare `off` as false: the knob still means the word.
        "globex": {"roles": WORKSPACE_ROLES, "memory": {"extraction_cadence": False}},
    }
    review = review_rule(lessons=[LESSON], facts=["Dana reviews pull requests only in the mornings."])
    async with reviewed(review, companies=companies) as env:
        off_user = await run_check(env, "s1")
        on_user = await run_check(env, "s2", user_name="erin")
        env.company = "globex"
        off_company = await run_check(env, "s3", user_name="erin")
        notes = await env.app.infra.pool.fetchval("SELECT count(*) FROM agent_diary")
    for check in (off_user, off_company):
        assert (
            check.outcome == pb.CHECK_OUTCOME_COMPLETED
            and check.counts.lessons_written + check.counts.lessons_reused == 1
        )
        (dropped,) = check.dropped
        assert dropped.kind == pb.OUTPUT_KIND_PERSONAL_FACT and "memory.extraction_cadence is off" in dropped.reason
    assert on_user.counts.facts_written == 1 and notes == 1
