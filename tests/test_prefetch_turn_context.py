"""BuildTurnContext: the blocks in order with their hit and hint paths, the thin-trigger gate (no
model call, no vector query, no embedding), the one shared embedding of the ask, uses marked for
selected notes only, offered skills stamped, knowledge searched / empty / unsearched, counterparty
and onboarding blocks, a degraded source, and the prefetch_summary event. Real services over gRPC."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC

import grpc
import pytest

from agentlearn.prefetch.v1 import prefetch_service_pb2 as pb
from agentlearn.skills.v1 import skill_service_pb2 as skill_pb
from libs.common.embeddings import EmbeddingTimeout
from services.knowledge.client import GrpcKnowledgeClient
from services.prefetch import hints
from services.skills import passes as skill_passes
from tests.support.grpc_errors import error_info
from tests.support.scripted_openai import Reply
from tests.test_prefetch_support import (
    ROLES,
    CountingEmbedder,
    block,
    counting_env,
    default_settings,
    llm_settings,
    open_env,
    purpose_of,
    select_containing,
)

ASK = "Can you send Bob the weekly billing export digest?"
BOB = pb.Counterparty(handle="bob", platform="slack", display_name="Bob")


@pytest.fixture
async def env(make_settings, dsn, clock, local_embedder, edge_index):
    async with counting_env(make_settings, dsn, clock, local_embedder, edge_index) as e:
        yield e


async def seed_everything(env) -> dict:  # type: ignore[no-untyped-def]
    ids = {
        "digest": await env.note("Bob prefers weekly digests of the billing export, sent on Mondays."),
        "lunch": await env.note("The cafeteria closes at two."),
    }
    await env.turn(
        "Message from Bob: Slack message",
        "Send me the billing export digest",
        "Exported billing to CSV and sent Bob the digest.",
        tools=("billing.export", "slack.post"),
    )
    await env.turn("Message from Dan: email", "Book the offsite dinner", "Booked a restaurant.")
    await env.skill("billing-digest", "Export billing and post the weekly digest to the requester")
    await env.profile("bob", topics=["billing"], past_decisions=["Digests go out on Mondays"])
    await env.page("eng", "Billing export runbook", "How to run the weekly billing export and send the digest.")
    await env.page("platform", "Welcome to platform", "Read this first: how the platform team works.", ["Onboarding"])
    return ids


# ------------------------------------------------------------------------------------ every block


async def test_a_rich_trigger_renders_every_block_in_order_and_records_the_summary(env):
    ids = await seed_everything(env)
    resp = await env.build(ASK, senders=[BOB, BOB], unit_chain=["platform", "engineering"])

    kinds = [b.block for b in resp.blocks]
    assert kinds == [
        pb.BLOCK_SIMILAR_PRIOR_WORK,
        pb.BLOCK_PERSONAL_MEMORY,
        pb.BLOCK_SKILLS,
        pb.BLOCK_RELEVANT_KNOWLEDGE,
        pb.BLOCK_COUNTERPARTY,  # one per distinct sender with a profile: Bob twice is one block
        pb.BLOCK_ONBOARDING,
    ]
    assert all(b.hit and b.bytes == len(b.markdown.encode()) for b in resp.blocks)

    prior = block(resp, pb.BLOCK_SIMILAR_PRIOR_WORK)
    assert prior.markdown.startswith("## Similar prior work")
    assert prior.selection_count == 1 and "offline briefing" in prior.markdown.lower()  # summarize_episodes on
    # The billing turn only: booking the offsite dinner is below the relevance floor, not "similar".
    assert "billing" in prior.markdown and "offsite" not in prior.markdown

    memory = block(resp, pb.BLOCK_PERSONAL_MEMORY)
    assert memory.markdown.startswith("## Personal memory") and "weekly digests" in memory.markdown
    assert list(memory.ids) == [ids["digest"]] and "cafeteria" not in memory.markdown

    skills = block(resp, pb.BLOCK_SKILLS)
    assert (
        skills.markdown.startswith("## Synthesized skills you've learned") and "**billing-digest**" in skills.markdown
    )

    knowledge = block(resp, pb.BLOCK_RELEVANT_KNOWLEDGE)
    assert knowledge.markdown.startswith("## Relevant knowledge") and "Billing export runbook" in knowledge.markdown
    assert knowledge.selection_count == 1 and "search_knowledge" not in knowledge.markdown  # no tool named

    party = block(resp, pb.BLOCK_COUNTERPARTY)
    assert party.counterparty.handle == "bob" and "Terse; wants bullet points." in party.markdown

    onboarding = block(resp, pb.BLOCK_ONBOARDING)
    assert "Welcome to platform" in onboarding.markdown and "mark_onboarded" in onboarding.markdown

    assert resp.markdown == "\n\n".join(b.markdown for b in resp.blocks)
    s = resp.summary
    assert s.line == "prefetch: 6/7 hits"  # the engine's seven; the chat thread is the engine's own
    assert [b.block for b in s.blocks] == kinds and all(b.hit for b in s.blocks)
    assert s.knowledge_selection_count == 1 and not s.trigger_requires_recon
    assert s.turn_embedding == pb.TURN_EMBEDDING_EMBEDDED

    [event] = await env.events("prefetch_summary")
    p = event["payload"]
    assert (event["seat"], event["turn_id"]) == ("ana", "turn-1")
    assert p["line"] == "prefetch: 6/7 hits" and p["block_count"] == 7 and p["hits"] == 6
    assert p["relevant_knowledge_hit"] and p["relevant_knowledge_selection_count"] == 1
    assert p["personal_memory_bytes"] == memory.bytes and p["turn_embedding"] == "embedded"
    assert p["trigger_requires_recon"] is False and "unread_sources" not in p
    reads = await env.events("knowledge_read")
    assert {r["payload"]["source"] for r in reads} == {"relevant_knowledge", "onboarding"}


async def test_the_ask_is_embedded_once_and_the_vector_shared(env):
    await seed_everything(env)
    env.embedder.texts.clear()
    await env.build(ASK)
    # The memory and episode searches share one vector; the knowledge search embeds its own query.
    assert env.embedder.texts.count(ASK) == 1


async def test_summary_off_renders_the_raw_turns_as_bullets(make_settings, dsn, clock, local_embedder, edge_index):
    settings = default_settings(make_settings, learning={"summarize_episodes": False})
    async with open_env(settings, dsn, clock, embedder=local_embedder, index=edge_index) as env:
        for i in range(5):
            await env.turn(
                "Message from Bob: Slack message",
                f"Send me the billing export digest number {i}",
                f"Exported billing and sent digest {i}.",
                tools=("billing.export", "slack.post"),
            )
        prior = block(await env.build(ASK), pb.BLOCK_SIMILAR_PRIOR_WORK)
    assert prior.selection_count == 3  # learning.episodes.similar_prior_work_limit
    text = prior.markdown
    assert "most similar first" in text
    assert text.count("- Woken by: Message from Bob: Slack message") == 3
    assert "  Outcome: done; tools: billing.export, slack.post" in text
    assert "  Asked: Send me the billing export digest number" in text
    assert "  What it did: Exported billing and sent digest" in text


# ------------------------------------------------------------------------------------ the gate


@pytest.mark.parametrize("recon,ask", [(True, "POC-518 got a comment"), (False, "   ")])
async def test_a_thin_trigger_makes_no_model_call_no_vector_query_and_no_embedding(
    make_settings, dsn, clock, local_embedder, edge_index, scripted_openai, recon, ask
):
    embedder = CountingEmbedder(local_embedder)
    settings = llm_settings(make_settings, scripted_openai)
    async with open_env(settings, dsn, clock, embedder=embedder, index=edge_index) as env:
        await env.note("Bob prefers weekly digests.")
        await env.turn("Message from Bob: Slack message", "Send the digest", "Sent it.")
        await env.skill("billing-digest", "Export billing and post the digest")
        await env.page("eng", "Billing export runbook", "How to run the billing export.")
        embedder.texts.clear()
        scripted_openai.clear()
        resp = await env.build(ask, requires_recon=recon)
        assert embedder.texts == []  # nothing embedded, so no vector query could run
        assert scripted_openai.received("chat") == []  # no auxiliary call at all
        assert await env.events("auxiliary_spend") == []
        [summary_event] = await env.events("prefetch_summary")
    assert block(resp, pb.BLOCK_PERSONAL_MEMORY).markdown.endswith(hints.EMPTY_MEMORY_HINT)
    assert block(resp, pb.BLOCK_RELEVANT_KNOWLEDGE).markdown.endswith(hints.EMPTY_KNOWLEDGE_HINT)
    recall = block(resp, pb.BLOCK_SIMILAR_PRIOR_WORK)
    assert recall.markdown.endswith(hints.EMPTY_RECALL_HINT) and "if this task resembles" in recall.markdown.lower()
    assert all(b.selection_count == 0 for b in resp.blocks if b.block != pb.BLOCK_SKILLS)
    assert block(resp, pb.BLOCK_SKILLS).hit  # not a relevance block: not gated
    s = resp.summary
    assert s.trigger_requires_recon is recon  # the builder's flag; false for an empty ask
    assert s.turn_embedding == pb.TURN_EMBEDDING_UNSPECIFIED  # absent: no search asked for a vector
    assert s.line == "prefetch: 4/7 hits (thin trigger: relevance filters gated)"
    assert "turn_embedding" not in summary_event["payload"]


async def test_gate_hints_render_only_where_they_are_actionable(env):
    # No notes: no memory hint. A role that can search nothing: no knowledge hint. Recall: always.
    resp = await env.build("+1", requires_recon=True, role="intern")
    assert not block(resp, pb.BLOCK_PERSONAL_MEMORY).hit
    assert not block(resp, pb.BLOCK_RELEVANT_KNOWLEDGE).hit
    assert block(resp, pb.BLOCK_SIMILAR_PRIOR_WORK).markdown.endswith(hints.EMPTY_RECALL_HINT)
    assert resp.summary.line == "prefetch: 1/7 hits (thin trigger: relevance filters gated)"


# ------------------------------------------------------------------------------------ personal memory


async def test_only_the_notes_the_filter_selected_are_marked_used_and_an_invented_id_is_ignored(
    make_settings, dsn, clock, local_embedder, edge_index, scripted_openai
):
    scripted_openai.rule(
        "chat", lambda body: Reply(body={"choices": []}) if purpose_of(body) != "memory_filter" else None
    )
    scripted_openai.chat_handler = select_containing("digest", "n99")
    settings = llm_settings(make_settings, scripted_openai)
    async with open_env(settings, dsn, clock, embedder=local_embedder, index=edge_index) as env:
        chosen = await env.note("Bob prefers weekly digests of the billing export.")
        others = [await env.note("The cafeteria closes at two."), await env.note("Carla owns the deploy pipeline.")]
        resp = await env.build(ASK, senders=[BOB])
        memory = block(resp, pb.BLOCK_PERSONAL_MEMORY)
        assert list(memory.ids) == [chosen] and memory.selection_count == 1
        assert await env.uses(chosen) == 1
        assert [await env.uses(n) for n in others] == [0, 0]  # candidates, not selections
        [request] = [b for b in scripted_openai.received("chat") if purpose_of(b) == "memory_filter"]
        user = request["messages"][1]["content"]
        assert "Who triggered it: Bob (slack)" in user and "cafeteria" in user  # told the senders; saw the pool


async def test_a_failed_filter_leaves_the_hint_when_the_seat_has_notes(
    make_settings, dsn, clock, local_embedder, edge_index, scripted_openai
):
    scripted_openai.rule("chat", lambda body: Reply(status=500))
    settings = llm_settings(make_settings, scripted_openai)
    async with open_env(settings, dsn, clock, embedder=local_embedder, index=edge_index) as env:
        note = await env.note("Bob prefers weekly digests.")
        resp = await env.build(ASK)
        memory = block(resp, pb.BLOCK_PERSONAL_MEMORY)
        assert memory.markdown.endswith(hints.EMPTY_MEMORY_HINT) and memory.selection_count == 0
        assert await env.uses(note) == 0
        # Query generation failed too: nothing to search with, so no knowledge block at all.
        assert not block(resp, pb.BLOCK_RELEVANT_KNOWLEDGE).hit


async def test_a_filter_that_selects_nothing_renders_the_hint_and_a_seat_with_no_notes_nothing(env):
    resp = await env.build(ASK)
    assert not block(resp, pb.BLOCK_PERSONAL_MEMORY).hit  # no notes at all
    await env.note("The cafeteria closes at two.")
    resp = await env.build(ASK, turn_id="turn-2")
    assert block(resp, pb.BLOCK_PERSONAL_MEMORY).markdown.endswith(hints.EMPTY_MEMORY_HINT)


async def test_a_note_about_a_sender_is_selected_whatever_its_topic(env):
    note = await env.note("Bob gets anxious about production incidents; reassure him first.")
    resp = await env.build("The release train is late again", senders=[BOB])
    assert list(block(resp, pb.BLOCK_PERSONAL_MEMORY).ids) == [note]


async def test_a_sender_named_by_handle_alone_lifts_a_note_about_them(env):
    # The contract takes a sender as a handle alone: no platform, so no counterparty profile, but
    # still a party to the task the memory filter must be told about.
    note = await env.note("Dana gets anxious about production incidents; reassure her first.")
    resp = await env.build("The release train is late again", senders=[pb.Counterparty(handle="dana")])
    memory = block(resp, pb.BLOCK_PERSONAL_MEMORY)
    assert memory.markdown.startswith("## Personal memory") and list(memory.ids) == [note]
    assert "Dana gets anxious about production incidents" in memory.markdown
    assert not [b for b in resp.blocks if b.block == pb.BLOCK_COUNTERPARTY]
    unnamed = block(await env.build("The release train is late again"), pb.BLOCK_PERSONAL_MEMORY)
    assert list(unnamed.ids) == [] and "Dana" not in unnamed.markdown  # the sender is what selected it


# ------------------------------------------------------------------------------------ skills


async def test_skills_whose_line_fits_are_offered_and_only_they_are_stamped(
    make_settings, dsn, clock, local_embedder, edge_index
):
    settings = default_settings(make_settings, learning={"prefetch": {"skills_char_budget": 120}})
    async with open_env(settings, dsn, clock, embedder=local_embedder, index=edge_index) as env:
        a = await env.skill("alpha", "Short procedure")
        await env.skill("beta", "A procedure whose one-line summary is far too long to fit in the menu " * 2)
        c = await env.skill("gamma", "Another short one")
        resp = await env.build(ASK)
        skills = block(resp, pb.BLOCK_SKILLS)
        assert list(skills.ids) == [a.id, c.id] and "beta" not in skills.markdown
        assert "use_skill" in skills.markdown
        got = {
            s.name: s
            for s in (await env.skills.ListSkills(skill_pb.ListSkillsRequest(company="acme", seat="ana"))).skills
        }
        assert got["alpha"].HasField("last_offered_time") and got["gamma"].HasField("last_offered_time")
        assert not got["beta"].HasField("last_offered_time")  # never offered: its clock does not move


async def test_a_stale_skill_is_rendered_with_its_ageing_marker_and_the_offer_revives_it(env, clock):
    await env.skill("old", "An old procedure")
    clock.advance(days=31)
    report = await skill_passes.curate(env.app.components["skills"].service)
    assert report.staled == 1
    skills = block(await env.build(ASK), pb.BLOCK_SKILLS)
    assert "**old**: An old procedure (unused for 31 days)" in skills.markdown
    [s] = (await env.skills.ListSkills(skill_pb.ListSkillsRequest(company="acme", seat="ana"))).skills
    assert s.state == skill_pb.SKILL_STATE_ACTIVE
    assert s.last_offered_time.ToDatetime(tzinfo=UTC) == clock.now()


# ------------------------------------------------------------------------------------ knowledge


async def test_knowledge_found_nothing_renders_the_empty_hint_and_unreachable_the_unsearched_one(env):
    await env.page("eng", "Holiday calendar", "Public holidays of the year.")
    resp = await env.build(ASK)
    knowledge = block(resp, pb.BLOCK_RELEVANT_KNOWLEDGE)
    assert knowledge.markdown.endswith(hints.EMPTY_KNOWLEDGE_HINT) and knowledge.selection_count == 0
    assert resp.summary.knowledge_selection_count == 0 and knowledge.hit

    # The knowledge service stops answering (nothing listens on port 1): the search did not run.
    dead = grpc.aio.insecure_channel("127.0.0.1:1")
    env.service.deps.searcher = GrpcKnowledgeClient(lambda: dead, 5.0)
    try:
        resp = await env.build(ASK, turn_id="turn-2")
    finally:
        await dead.close()
    knowledge = block(resp, pb.BLOCK_RELEVANT_KNOWLEDGE)
    assert knowledge.markdown.endswith(hints.UNSEARCHED_KNOWLEDGE_HINT)
    assert hints.EMPTY_KNOWLEDGE_HINT not in knowledge.markdown
    assert resp.summary.blocks[3].source_error == "knowledge: unreachable"


async def test_knowledge_hits_render_title_container_and_snippet(env):
    page = await env.page("eng", "Billing runbook", "Run the billing export on Mondays.")
    resp = await env.build(ASK)
    knowledge = block(resp, pb.BLOCK_RELEVANT_KNOWLEDGE)
    # title, container, and the snippet around the match (the store's headline)
    assert "- **Billing runbook** (eng): billing export on Mondays" in knowledge.markdown
    assert list(knowledge.ids) == [page.id] and resp.summary.knowledge_selection_count == 1
    [read] = await env.events("knowledge_read")
    assert read["payload"]["pages"] == [{"page_id": page.id, "title": "Billing runbook", "container": "eng"}]
    assert read["payload"]["source"] == "relevant_knowledge" and read["seat"] == "ana"
    assert read["payload"]["query"] == "send bob weekly billing export digest"  # the offline rule's keywords


async def test_a_role_that_can_search_nothing_asks_no_query(env):
    resp = await env.build(ASK, role="intern")
    assert not block(resp, pb.BLOCK_RELEVANT_KNOWLEDGE).hit
    purposes = [e["payload"]["purpose"] for e in await env.events("auxiliary_spend")]
    assert "knowledge_query" not in purposes


async def test_a_failed_query_generation_renders_nothing(env):
    # The offline rule writes the ask's content words; an ask of none leaves nothing to search with.
    # A search that ran would render at least the empty hint; nothing rendered means none ran.
    await env.page("eng", "Please read", "Could you please do it?")
    resp = await env.build("could you please do it?")
    assert not block(resp, pb.BLOCK_RELEVANT_KNOWLEDGE).hit
    assert await env.events("knowledge_read") == []


# ------------------------------------------------------------------------------------ counterparties


async def test_one_block_per_distinct_sender_with_a_profile_of_this_observer(env):
    await env.profile("bob")
    await env.profile("dan", communication_style="Formal.")
    await env.profile("carla", observer="zed")  # another seat's profile: never read
    senders = [
        BOB,
        pb.Counterparty(handle="carla", platform="slack"),
        pb.Counterparty(handle="dan", platform="SLACK", display_name="Dan"),
        BOB,
    ]
    resp = await env.build(ASK, senders=senders)
    parties = [b for b in resp.blocks if b.block == pb.BLOCK_COUNTERPARTY]
    assert [p.counterparty.handle for p in parties] == ["bob", "dan"]
    assert parties[1].markdown.startswith("## Counterparty: Dan (slack)") and "Formal." in parties[1].markdown
    # The denominator is the engine's fixed list, whatever the senders; two profiles are one kind.
    assert resp.summary.line == "prefetch: 2/7 hits"


async def test_a_sender_on_any_platform_a_turn_may_carry_gets_their_block(env):
    """Profiles take every sender a turn may carry and file the platform folded ("Straße" as
    "strasse"); the turn start compares a sender's platform folded too (it compared it lowercased:
    "straße" found no profile), and a sender with no profile costs no other sender's block."""
    await env.profile("bob")
    await env.profile("dana", platform="MS Teams")
    await env.profile("jörg", platform="Straße")
    dana = pb.Counterparty(handle="dana", platform="MS Teams", display_name="Dana")
    jorg = pb.Counterparty(handle="jörg", platform="Straße", display_name="Jörg")
    eve = pb.Counterparty(handle="eve", platform="Lab:Chat/EU", display_name="Eve")
    resp = await env.build(ASK, senders=[dana, jorg, eve, BOB])
    parties = [b for b in resp.blocks if b.block == pb.BLOCK_COUNTERPARTY]
    assert [p.counterparty.handle for p in parties] == ["dana", "jörg", "bob"]
    assert not [b for b in resp.summary.blocks if b.source_error]


# ------------------------------------------------------------------------------------ onboarding


async def test_onboarding_renders_until_marked_and_again_when_the_unit_chain_changes(env):
    await env.page("platform", "Welcome to platform", "How the platform team works.", ["Onboarding"])
    await env.page("data", "Welcome to data", "How the data team works.", ["Onboarding"])
    chain = ["platform", "engineering"]
    first = block(await env.build(ASK, unit_chain=chain), pb.BLOCK_ONBOARDING)
    assert first.hit and "Welcome to platform" in first.markdown and "platform › engineering" in first.markdown
    marked = await env.builtins.MarkOnboarded(pb.MarkOnboardedRequest(company="acme", seat="ana", unit_chain=chain))
    assert marked.chain_hash and "platform › engineering" in marked.text
    assert not block(await env.build(ASK, unit_chain=chain, turn_id="t2"), pb.BLOCK_ONBOARDING).hit
    moved = block(await env.build(ASK, unit_chain=["data", "engineering"], turn_id="t3"), pb.BLOCK_ONBOARDING)
    assert moved.hit and "Welcome to data" in moved.markdown  # a new chain re-fires the hint


# ------------------------------------------------------------------------------------ degradation


async def test_a_source_that_cannot_be_read_degrades_its_block_and_the_summary_says_so(
    make_settings, dsn, clock, local_embedder, edge_index
):
    # Episodes and skills are not served: their reads fail, the turn does not.
    settings = default_settings(make_settings)
    names = ["diary", "profiles", "knowledge", "prefetch"]
    async with open_env(settings, dsn, clock, embedder=local_embedder, index=edge_index, names=names) as env:
        await env.note("Bob prefers weekly digests of the billing export.")
        resp = await env.build(ASK)
        assert block(resp, pb.BLOCK_PERSONAL_MEMORY).hit
        assert not block(resp, pb.BLOCK_SIMILAR_PRIOR_WORK).hit and not block(resp, pb.BLOCK_SKILLS).hit
        errors = {b.block: b.source_error for b in resp.summary.blocks if b.source_error}
        assert errors == {pb.BLOCK_SIMILAR_PRIOR_WORK: "episodes: UNAVAILABLE", pb.BLOCK_SKILLS: "skills: UNAVAILABLE"}
        [event] = await env.events("prefetch_summary")
        assert event["payload"]["unread_sources"] == {
            "similar_prior_work": "episodes: UNAVAILABLE",
            "skills": "skills: UNAVAILABLE",
        }


async def test_a_failed_embedding_skips_the_similarity_searches_and_the_summary_says_so(
    make_settings, dsn, clock, local_embedder, edge_index
):
    embedder = CountingEmbedder(local_embedder)
    async with open_env(default_settings(make_settings), dsn, clock, embedder=embedder, index=edge_index) as env:
        note = await env.note("Bob prefers weekly digests of the billing export.")
        await env.turn("Message from Bob: Slack message", "Send the billing digest", "Sent it.")
        embedder.fail = EmbeddingTimeout("scripted")
        embedder.texts.clear()
        resp = await env.build(ASK)
        assert embedder.texts.count(ASK) == 1  # tried once; neither search embedded it again
    assert resp.summary.turn_embedding == pb.TURN_EMBEDDING_FAILED
    assert not block(resp, pb.BLOCK_SIMILAR_PRIOR_WORK).hit  # not "nothing similar": the search did not run
    assert list(block(resp, pb.BLOCK_PERSONAL_MEMORY).ids) == [note]  # recency and lexical halves still run
    assert "turn embedding failed" in resp.summary.line


async def test_no_embedder_is_unconfigured_and_the_lexical_halves_still_answer(make_settings, dsn, clock, edge_index):
    async with open_env(default_settings(make_settings), dsn, clock, embedder=None, index=edge_index) as env:
        await env.turn("Message from Bob: Slack message", "Send the billing export digest", "Sent it.")
        resp = await env.build(ASK)
    assert resp.summary.turn_embedding == pb.TURN_EMBEDDING_UNCONFIGURED
    assert block(resp, pb.BLOCK_SIMILAR_PRIOR_WORK).selection_count == 1


async def test_a_request_without_its_identity_is_refused(env):
    from tests.test_prefetch_support import refused

    code, info, bad = await refused(
        env.prefetch.BuildTurnContext(pb.BuildTurnContextRequest(company="acme", seat="ana", role="swe", ask="x"))
    )
    assert code.name == "INVALID_ARGUMENT" and info.reason == "FIELD_REQUIRED"
    assert info.domain == "prefetch.agentlearn.dev" and bad.field_violations[0].field == "turn_id"


async def test_the_prefetch_is_one_trace_with_a_span_per_block(make_settings, dsn, clock, local_embedder, edge_index):
    """Issue 7: BuildTurnContext is one trace, a span per block, each labelled with what it rendered."""
    from opentelemetry import trace as ot
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from agentlearn.prefetch.v1 import prefetch_service_pb2 as ppb
    from agentlearn.prefetch.v1 import prefetch_service_pb2_grpc as pgrpc
    from libs.common import telemetry
    from libs.common.config import TelemetryConfig
    from tests.support.app import open_app

    exporter = InMemorySpanExporter()
    telemetry.configure_tracing(TelemetryConfig(), extra_processors=[SimpleSpanProcessor(exporter)])
    assert isinstance(ot.get_tracer_provider(), TracerProvider)
    async with open_app(make_settings(), dsn, clock=clock, embedder=local_embedder, index=edge_index) as app:
        stub = pgrpc.PrefetchServiceStub(app.channel)
        await stub.BuildTurnContext(
            ppb.BuildTurnContextRequest(
                company="acme", seat="ana", role="swe", turn_id="run-trace", ask="How do I deploy?"
            )
        )
    spans = exporter.get_finished_spans()
    [root] = [s for s in spans if s.name == "prefetch" and s.attributes.get("agentlearn.turn_id") == "run-trace"]
    blocks = [s for s in spans if s.name.startswith("block ") and s.context.trace_id == root.context.trace_id]
    assert {s.name for s in blocks} >= {
        "block similar_prior_work",
        "block personal_memory",
        "block skills",
        "block relevant_knowledge",
        "block onboarding",
    }
    assert all("agentlearn.block.hit" in s.attributes and "agentlearn.block.bytes" in s.attributes for s in blocks)
    rpc = [s for s in spans if s.name.endswith("PrefetchService/BuildTurnContext")]
    assert rpc and rpc[0].context.trace_id == root.context.trace_id


# ------------------------------------------------------------------------------------ frozen per run id


async def test_a_runs_context_is_frozen_no_model_call_or_note_use_twice(
    make_settings, dsn, clock, local_embedder, edge_index, scripted_openai
):
    """Frozen at turn start: a second call for the same run id (a self_iterate round, a retry) is
    answered with the first call's blocks — it used to ask the models again and count the selected
    notes' uses again. Another run id is built afresh."""
    scripted_openai.chat_handler = lambda body: (
        json.dumps({"selected": ["n1"]}) if purpose_of(body) == "memory_filter" else "billing export digest"
    )
    settings = llm_settings(make_settings, scripted_openai)
    async with open_env(settings, dsn, clock, embedder=local_embedder, index=edge_index) as env:
        digest = await env.note("Bob prefers weekly digests of the billing export, sent on Mondays.")
        first = await env.build(ASK, turn_id="run-7")
        calls = len(scripted_openai.received("chat"))
        assert calls > 0 and await env.uses(digest) == 1
        again = await env.build(ASK, turn_id="run-7")
        assert again == first
        assert len(scripted_openai.received("chat")) == calls  # no model asked again
        assert await env.uses(digest) == 1  # the note's use counted once
        assert len(await env.events("prefetch_summary")) == 1  # one summary per turn
        other = await env.build(ASK, turn_id="run-8")
        assert len(scripted_openai.received("chat")) > calls and await env.uses(digest) == 2
        assert other.markdown == first.markdown
    # Durable across replicas: a process started afterwards answers the run from what was kept.
    async with open_env(settings, dsn, clock, embedder=local_embedder, index=edge_index) as env:
        scripted_openai.clear()
        assert await env.build(ASK, turn_id="run-7") == first
        assert scripted_openai.received("chat") == []


async def test_concurrent_calls_for_one_run_build_it_once(env):
    await env.note("Bob prefers weekly digests of the billing export, sent on Mondays.")
    await env.turn("Message from Bob: Slack message", "Send me the billing export digest", "Sent it.")
    results = await asyncio.gather(*(env.build(ASK, turn_id="run-9") for _ in range(4)))
    assert all(r == results[0] for r in results)
    assert len(await env.events("prefetch_summary")) == 1


async def test_a_seat_with_no_budget_room_has_its_turn_parked_and_no_prefetch_runs(
    make_settings, dsn, clock, local_embedder, edge_index, scripted_openai
):
    """The budget park: at the seat's ceiling BuildTurnContext refuses (RESOURCE_EXHAUSTED,
    BUDGET_EXHAUSTED, the ceiling and when the window rolls over) before any block is built — it
    used to run every model call anyway. A run frozen before the ceiling was reached keeps its
    context; the next window builds again."""
    scripted_openai.chat_handler = lambda body: json.dumps({"selected": []})
    budget = {"seat_ceiling_tokens": 100, "window_hours": 24}
    settings = llm_settings(
        make_settings, scripted_openai, companies={"acme": {"roles": ROLES, "token_budget": budget}}
    )
    async with open_env(settings, dsn, clock, embedder=local_embedder, index=edge_index) as env:
        await env.note("Bob prefers weekly digests of the billing export, sent on Mondays.")
        before = await env.build(ASK, turn_id="run-1")
        cfg = settings.company("acme").token_budget
        await env.app.infra.budget.charge("acme", "ana", 100, clock.now(), cfg)
        scripted_openai.clear()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await env.build(ASK, turn_id="run-2")
        code, info, _ = error_info(err.value)
        assert (code, info.reason, info.domain) == (
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "BUDGET_EXHAUSTED",
            "prefetch.agentlearn.dev",
        )
        assert info.metadata["ceiling"] == "seat" and info.metadata["window_end"]
        assert scripted_openai.received("chat") == []
        assert len(await env.events("prefetch_summary")) == 1  # run-1's only
        assert await env.build(ASK, turn_id="run-1") == before  # frozen before the ceiling
        clock.advance(hours=24)
        assert (await env.build(ASK, turn_id="run-2")).summary.line


async def test_an_ask_longer_than_a_search_query_is_read_whole_not_refused(
    make_settings, dsn, clock, local_embedder, edge_index
):
    """A long task description is an ask like any other (spec: the ask is embedded "whole: an ask
    longer than the embedding model's input ... is split between words and its pieces' vectors
    pooled"): the turn start answers, its vector is of the whole ask, and the searches' text query
    is the ask's beginning, cut between words to what their contracts take."""
    from services.prefetch.turn_context import SEARCH_QUERY_CHARS, search_query
    from tests.test_prefetch_support import CountingEmbedder, default_settings, open_env

    settings = default_settings(make_settings, learning={"prefetch": {"embed_budget_seconds": 60}})
    embedder = CountingEmbedder(local_embedder)
    async with open_env(settings, dsn, clock, embedder=embedder, index=edge_index) as env:
        env.embedder = embedder
        ids = await seed_everything(env)
        filler = " ".join(f"step{i} of the quarterly migration checklist" for i in range(400))
        ask = f"{ASK} {filler}"
        assert len(ask) > SEARCH_QUERY_CHARS
        resp = await env.build(ask, senders=[BOB])
        assert resp.summary.turn_embedding == pb.TURN_EMBEDDING_EMBEDDED
        assert ask in embedder.texts  # embedded whole, once
        memory = block(resp, pb.BLOCK_PERSONAL_MEMORY)
        assert ids["digest"] in memory.ids
        # Every search ran (none refused the query): no block names a source it could not read.
        assert [b.source_error for b in resp.summary.blocks if b.source_error] == []
    query = search_query(ask)
    assert len(query) <= SEARCH_QUERY_CHARS and ask.startswith(query) and ask[len(query)] == " "
