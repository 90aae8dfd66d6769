"""The Tool Skills registry behind GetGuidance (spec: "Prompt scaffolding"): guidance sourced from
knowledge pages operators edit at runtime, the bundled files being the defaults. Real prefetch and
knowledge services over gRPC: an edited page changes the next answer without a restart, each block
says where its text came from, the catalogue read is a knowledge_read naming the pages, a broken
page or a draft leaves the default standing, and an unreadable registry degrades to the bundled
blocks and says so."""

from __future__ import annotations

import grpc
import pytest

from agentlearn.prefetch.v1 import prefetch_service_pb2 as pb
from services.knowledge.client import GrpcKnowledgeClient
from services.knowledge.domain import AUTO_DRAFTED_PARENT
from services.prefetch.guidance import load_guidance
from tests.test_prefetch_support import default_settings, open_env

BUNDLED = {g.name: g for g in load_guidance()}


@pytest.fixture
async def env(make_settings, dsn, clock, edge_index):
    async with open_env(default_settings(make_settings), dsn, clock, embedder=None, index=edge_index) as e:
        yield e


def page_text(triggers: list[str], markdown: str) -> str:
    lines = "\n".join(f"  - {t}" for t in triggers)
    return f"---\ntriggers:\n{lines}\n---\n{markdown}\n"


async def guidance(env, *tools: str) -> pb.GetGuidanceResponse:  # type: ignore[no-untyped-def]
    return await env.prefetch.GetGuidance(
        pb.GetGuidanceRequest(company="acme", role="swe", registered_tools=list(tools))
    )


async def test_an_edited_registry_page_changes_the_guidance_without_a_restart(env):
    [before] = (await guidance(env, "reflect_and_persist")).blocks
    assert before.source == pb.GUIDANCE_SOURCE_BUNDLED and not before.page_id
    assert before.markdown == BUNDLED["reflect-and-persist"].markdown

    page = await env.page("tool-skills", "reflect-and-persist", page_text(["reflect_and_persist"], "Facts only, v1."))
    [v1] = (await guidance(env, "reflect_and_persist")).blocks
    assert (v1.name, v1.markdown, v1.source, v1.page_id, v1.container) == (
        "reflect-and-persist",
        "Facts only, v1.",
        pb.GUIDANCE_SOURCE_REGISTRY,
        page.id,
        "tool-skills",
    )

    await env.page("tool-skills", "reflect-and-persist", page_text(["reflect_and_persist"], "Facts only, v2."))
    [v2] = (await guidance(env, "reflect_and_persist")).blocks
    assert v2.markdown == "Facts only, v2." and v2.page_id == page.id

    # Which guidance was used: each catalogue read that reached pages names them (the first read,
    # of an empty registry, reached none).
    reads = [r for r in await env.events("knowledge_read") if r["payload"]["source"] == "tool_skill_catalogue"]
    assert len(reads) == 2 and reads[-1]["payload"]["pages"] == [
        {"page_id": page.id, "title": "reflect-and-persist", "container": "tool-skills"}
    ]


async def test_a_registry_page_of_a_new_name_adds_a_block_after_the_bundled_ones(env):
    await env.page("tool-skills", "deploy-etiquette", page_text(["deploy_.*"], "Announce deploys first."))
    resp = await guidance(env, "refine_skill", "deploy_prod")
    assert [(b.name, b.source) for b in resp.blocks] == [
        ("refine-skill", pb.GUIDANCE_SOURCE_BUNDLED),
        ("deploy-etiquette", pb.GUIDANCE_SOURCE_REGISTRY),
    ]
    assert list(resp.blocks[1].triggered_by) == ["deploy_prod"]
    assert not (await guidance(env, "refine_skill")).blocks[-1].name == "deploy-etiquette"


async def test_a_broken_page_or_a_draft_leaves_the_bundled_default(env):
    await env.page("tool-skills", "refine-skill", "No front matter at all.")
    await env.page(
        "tool-skills", "reflect-and-persist", page_text(["reflect_and_persist"], "Unreviewed."), [AUTO_DRAFTED_PARENT]
    )
    resp = await guidance(env, "refine_skill", "reflect_and_persist")
    assert {b.name: (b.source, b.markdown) for b in resp.blocks} == {
        "reflect-and-persist": (pb.GUIDANCE_SOURCE_BUNDLED, BUNDLED["reflect-and-persist"].markdown),
        "refine-skill": (pb.GUIDANCE_SOURCE_BUNDLED, BUNDLED["refine-skill"].markdown),
    }
    assert not resp.registry_unreadable


async def test_an_unreadable_registry_answers_with_the_bundled_blocks_and_says_so(env):
    await env.page("tool-skills", "refine-skill", page_text(["refine_skill"], "Registry text."))
    dead = grpc.aio.insecure_channel("127.0.0.1:1")  # the knowledge service stops answering
    env.service.deps.searcher = GrpcKnowledgeClient(lambda: dead, 5.0)
    try:
        resp = await guidance(env, "refine_skill")
    finally:
        await dead.close()
    assert resp.registry_unreadable
    assert [(b.name, b.source) for b in resp.blocks] == [("refine-skill", pb.GUIDANCE_SOURCE_BUNDLED)]


async def test_with_no_registry_configured_the_bundled_blocks_answer_and_nothing_is_read(
    make_settings, dsn, clock, edge_index
):
    settings = default_settings(make_settings, knowledge={"tool_skills_container": None})
    async with open_env(settings, dsn, clock, embedder=None, index=edge_index) as env:
        await env.page("tool-skills", "refine-skill", page_text(["refine_skill"], "Registry text."))
        resp = await guidance(env, "refine_skill")
        assert not resp.registry_unreadable and resp.blocks[0].source == pb.GUIDANCE_SOURCE_BUNDLED
        assert await env.events("knowledge_read") == []
