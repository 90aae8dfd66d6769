"""The other builtins: reflect_and_persist (the diary's NOTE_TOO_LONG passes through as its own rich
status), use_skill and refine_skill (the skills' refusals pass through, refinement off included),
search_knowledge (says in words what happened; knowledge_read on pages), mark_onboarded, and the
delegation of ListTools / GetGuidance. Real services over gRPC."""

from __future__ import annotations

import json

import grpc
import pytest

from agentlearn.diary.v1 import diary_service_pb2 as diary_pb
from agentlearn.prefetch.v1 import prefetch_service_pb2 as pb
from services.knowledge.client import GrpcKnowledgeClient
from services.prefetch.domain import chain_hash
from tests.test_prefetch_support import ROLES, default_settings, open_env, refused


@pytest.fixture
async def env(make_settings, dsn, clock, local_embedder, edge_index):
    async with open_env(default_settings(make_settings), dsn, clock, embedder=local_embedder, index=edge_index) as e:
        yield e


def persist(env, content: str, **kw):  # type: ignore[no-untyped-def]
    return env.builtins.ReflectAndPersist(
        pb.ReflectAndPersistRequest(company="acme", seat="ana", turn_id="t1", content=content, **kw)
    )


# ------------------------------------------------------------------------------------ reflect_and_persist


async def test_reflect_and_persist_writes_a_note_the_diary_credits_to_the_tool(env, clock):
    long = await persist(env, "Bob prefers weekly digests.")
    short = await persist(env, "Sprint freeze this week.", tier="short", ttl_days=5)
    assert "a durable fact" in long.text
    assert "a situational note, read until 2026-01-06" in short.text
    note = (await env.diary.GetNote(diary_pb.GetNoteRequest(company="acme", seat="ana", note_id=long.note_id))).note
    assert note.source == diary_pb.NOTE_SOURCE_REFLECT_AND_PERSIST and note.turn_id == "t1"
    assert note.content == "Bob prefers weekly digests."


async def test_a_note_past_two_thousand_characters_is_refused_with_the_diarys_own_status(env):
    code, info, bad = await refused(persist(env, "x" * 2001))
    assert code.name == "INVALID_ARGUMENT" and info.reason == "NOTE_TOO_LONG"
    assert info.domain == "diary.agentlearn.dev" and info.metadata["limit"] == "2000"
    assert bad.field_violations[0].field == "content" and "at most 2000" in bad.field_violations[0].description
    ok = await persist(env, "x" * 2000)
    assert ok.note_id


async def test_an_unknown_tier_is_refused_by_the_prefetch(env):
    _, info, bad = await refused(persist(env, "fact", tier="forever"))
    assert (info.reason, info.domain, bad.field_violations[0].field) == (
        "FIELD_INVALID",
        "prefetch.agentlearn.dev",
        "tier",
    )


# ------------------------------------------------------------------------------------ skills


async def test_use_skill_returns_the_body_verbatim_and_refine_replaces_it(env):
    skill = await env.skill("billing-digest", "Export billing and post the digest")
    used = await env.builtins.UseSkill(pb.UseSkillRequest(company="acme", seat="ana", name="billing-digest"))
    assert used.skill_id == skill.id and used.body == skill.body
    refined = await env.builtins.RefineSkill(
        pb.RefineSkillRequest(company="acme", seat="ana", skill_name="billing-digest", content="# new\n", reason="r")
    )
    assert refined.version == 2 and "version 2" in refined.text
    again = await env.builtins.UseSkill(pb.UseSkillRequest(company="acme", seat="ana", name="billing-digest"))
    assert again.body == "# new\n"


async def test_an_unknown_skill_passes_the_skills_refusal_through(env):
    code, info, _ = await refused(env.builtins.UseSkill(pb.UseSkillRequest(company="acme", seat="ana", name="nope")))
    assert code.name == "NOT_FOUND" and info.reason == "SKILL_NOT_FOUND" and info.domain == "skills.agentlearn.dev"


async def test_refine_skill_with_refinement_off_is_failed_precondition(
    make_settings, dsn, clock, local_embedder, edge_index
):
    settings = default_settings(make_settings, learning={"skill_refinement": {"enabled": False}})
    async with open_env(settings, dsn, clock, embedder=local_embedder, index=edge_index) as env:
        await env.skill("billing-digest", "Export billing and post the digest")
        code, info, _ = await refused(
            env.builtins.RefineSkill(
                pb.RefineSkillRequest(company="acme", seat="ana", skill_name="billing-digest", content="# new\n")
            )
        )
        assert code.name == "FAILED_PRECONDITION" and info.reason == "REFINEMENT_DISABLED"
        tools = await env.prefetch.ListTools(pb.ListToolsRequest(company="acme", role="swe"))
        assert "refine_skill" not in [t.name for t in tools.tools]


# ------------------------------------------------------------------------------------ search_knowledge


def search(env, text: str, role: str = "swe"):  # type: ignore[no-untyped-def]
    return env.builtins.SearchKnowledge(
        pb.SearchKnowledgeRequest(company="acme", seat="ana", role=role, query=text, turn_id="t1")
    )


async def test_search_knowledge_says_in_words_what_happened(env):
    page = await env.page("eng", "Billing export runbook", "How to run the weekly billing export.")
    found = await search(env, "billing export runbook")
    assert found.status == pb.SEARCH_STATUS_SEARCHED and [h.page_id for h in found.hits] == [page.id]
    assert "Billing export runbook" in found.text
    [read] = await env.events("knowledge_read")
    assert read["payload"]["source"] == "search_knowledge" and read["payload"]["pages"][0]["page_id"] == page.id

    nothing = await search(env, "holiday calendar telescope")
    assert nothing.status == pb.SEARCH_STATUS_SEARCHED and not nothing.hits and "no page" in nothing.text

    scoped = await search(env, "billing", role="intern")
    assert scoped.status == pb.SEARCH_STATUS_SCOPED_TO_NOTHING and "scoped to nothing" in scoped.text


async def test_an_omitted_limit_is_the_configured_knowledge_results_the_schema_shows(
    make_settings, dsn, clock, local_embedder, edge_index
):
    settings = default_settings(make_settings, learning={"prefetch": {"knowledge_results": 3}})
    async with open_env(settings, dsn, clock, embedder=local_embedder, index=edge_index) as env:
        for n in range(6):
            await env.page("eng", f"Billing export runbook part {n}", f"Step {n} of the weekly billing export.")
        tools = await env.prefetch.ListTools(pb.ListToolsRequest(company="acme", role="swe"))
        [tool] = [t for t in tools.tools if t.name == "search_knowledge"]
        assert json.loads(tool.parameters_json)["properties"]["limit"]["default"] == 3
        omitted = await search(env, "billing export runbook")
        assert omitted.status == pb.SEARCH_STATUS_SEARCHED and len(omitted.hits) == 3
        more = await env.builtins.SearchKnowledge(
            pb.SearchKnowledgeRequest(company="acme", seat="ana", role="swe", query="billing export runbook", limit=5)
        )
        assert len(more.hits) == 5  # a limit the model gives is still honoured, up to the maximum


async def test_a_deployment_with_knowledge_off_says_it_is_not_configured(
    make_settings, dsn, clock, local_embedder, edge_index
):
    settings = default_settings(make_settings, knowledge={"backend": "none"})
    async with open_env(settings, dsn, clock, embedder=local_embedder, index=edge_index) as env:
        unconfigured = await search(env, "billing")
    assert unconfigured.status == pb.SEARCH_STATUS_UNCONFIGURED
    assert "No knowledge base is configured" in unconfigured.text


async def test_a_search_that_did_not_run_says_it_is_unreachable(env):
    # The knowledge service stops answering (nothing listens on port 1): the search did not run.
    dead = grpc.aio.insecure_channel("127.0.0.1:1")
    env.service.deps.searcher = GrpcKnowledgeClient(lambda: dead, 5.0)
    try:
        resp = await search(env, "billing")
    finally:
        await dead.close()
    assert resp.status == pb.SEARCH_STATUS_UNREACHABLE and "did not run" in resp.text
    assert "knowledge: UNAVAILABLE" in resp.text


# ------------------------------------------------------------------------------------ onboarding, catalogue


async def test_mark_onboarded_stamps_the_chain_hash(env):
    resp = await env.builtins.MarkOnboarded(
        pb.MarkOnboardedRequest(company="acme", seat="ana", unit_chain=["platform", "engineering"])
    )
    assert resp.chain_hash == chain_hash(["platform", "engineering"])
    assert await env.service.deps.store.marker("acme", "ana") == resp.chain_hash
    _, info, bad = await refused(
        env.builtins.MarkOnboarded(pb.MarkOnboardedRequest(company="acme", seat="ana", unit_chain=["a", " "]))
    )
    assert info.reason == "FIELD_REQUIRED" and bad.field_violations[0].field == "unit_chain[1]"


async def test_list_tools_and_guidance_delegate_to_the_catalogue(env):
    tools = await env.prefetch.ListTools(pb.ListToolsRequest(company="acme", role="swe"))
    names = [t.name for t in tools.tools]
    assert {"refresh_memory", "query_episodes", "reflect_and_persist", "search_knowledge"} <= set(names)
    intern = await env.prefetch.ListTools(pb.ListToolsRequest(company="acme", role="intern"))
    assert "search_knowledge" not in [t.name for t in intern.tools]
    guidance = await env.prefetch.GetGuidance(
        pb.GetGuidanceRequest(company="acme", role="swe", registered_tools=["refresh_memory", "query_episodes"])
    )
    assert "retrieval-research" in [b.name for b in guidance.blocks]


async def test_list_tools_for_a_seat_offers_search_knowledge_when_the_seat_can_search(
    make_settings, dsn, clock, local_embedder, edge_index
):
    """A seat whose own containers make search possible (its role has none) is told at turn start
    to call search_knowledge; the tool list for that seat must then offer it. Without a seat the
    list is the role's, as before."""
    companies = {"acme": {"roles": ROLES, "knowledge": {"seat_containers": {"ana": ["ana-notes"]}}}}
    settings = default_settings(make_settings, companies=companies)
    async with open_env(settings, dsn, clock, embedder=local_embedder, index=edge_index) as env:

        async def names(**kw: str) -> list[str]:
            listed = await env.prefetch.ListTools(pb.ListToolsRequest(company="acme", role="intern", **kw))
            return [t.name for t in listed.tools]

        assert "search_knowledge" not in await names()
        assert "search_knowledge" in await names(seat="ana")
        assert "search_knowledge" not in await names(seat="bob")
