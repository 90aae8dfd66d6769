"""query_episodes and the one renderer it shares with ## Similar prior work (learning.PastTurns):
similarity (raw only, most similar first, the unreachable count naming conversation and recency),
conversation and recency (a compacted row as its pattern), what stopped a query that cannot run,
asks and accounts past 600 bytes condensed as a rewrite or named by size when no rewrite came
inside the one shared deadline (a slow scripted model), at most four rewrites at once, and the
block's briefing falling back to the bullets. Real services over gRPC."""

from __future__ import annotations

import pytest

from agentlearn.episodes.v1 import episode_service_pb2 as ep_pb
from agentlearn.prefetch.v1 import prefetch_service_pb2 as pb
from libs.common.embeddings import EmbeddingConfigurationError, EmbeddingRateLimited, EmbeddingRefused
from tests.support.scripted_openai import Reply
from tests.test_prefetch_support import (
    ROLES,
    CountingEmbedder,
    block,
    default_settings,
    llm_settings,
    open_env,
    purpose_of,
    refused,
)

OTHER_PATHS = "conversation (query_episodes with conversation_id) or by recency (query_episodes with no query)"
LONG_ASK = " ".join(f"Sentence {i} of a very long request about the billing export that runs on." for i in range(30))


def query(env, text: str = "", **kw):  # type: ignore[no-untyped-def]
    return env.builtins.QueryEpisodes(
        pb.QueryEpisodesRequest(company="acme", seat="ana", query=text, turn_id="t1", role="swe", **kw)
    )


@pytest.fixture
async def env(make_settings, dsn, clock, local_embedder, edge_index):
    settings = default_settings(make_settings, learning={"episode_lifecycle": {"max_raw_episodes_per_agent": 3}})
    async with open_env(settings, dsn, clock, embedder=local_embedder, index=edge_index) as e:
        yield e


# ------------------------------------------------------------------------------------ similarity


async def test_similarity_answers_raw_turns_most_similar_first(env):
    billing = await env.turn(
        "Message from Bob: Slack message", "Export billing to CSV", "Exported it.", tools=("billing.export",)
    )
    await env.turn("Message from Dan: email", "", "Booked the offsite dinner.", outcome=ep_pb.TURN_OUTCOME_FAILED)
    resp = await query(env, "billing export to csv", limit=1)
    assert resp.text.startswith('Your past turns most like "billing export to csv", most similar first:')
    assert list(resp.episode_ids) == [billing.id] and resp.unreachable_count == 0
    assert "- Woken by: Message from Bob: Slack message" in resp.text
    assert "  Outcome: done; tools: billing.export" in resp.text
    assert "  Asked: Export billing to CSV" in resp.text and "  What it did: Exported it." in resp.text
    failed = await query(env, "offsite dinner", outcome_filter="failed")
    assert "Asked:" not in failed.text  # a turn told nothing shows no ask
    assert "Outcome: failed" in failed.text and "Export billing" not in failed.text


async def test_turns_the_search_cannot_reach_are_counted_and_the_other_paths_named(
    make_settings, dsn, clock, local_embedder, edge_index
):
    settings = default_settings(make_settings)
    async with open_env(settings, dsn, clock, embedder=None, index=edge_index) as env:
        await env.turn("Message from Bob: Slack message", "Rotate the vault credentials", "Rotated them.")
        await env.turn("Message from Bob: Slack message", "Rotate the vault credentials again", "Rotated them.")
    async with open_env(settings, dsn, clock, embedder=local_embedder, index=edge_index) as env:
        empty = await query(env, "plan the offsite dinner")
        assert empty.unreachable_count == 2 and "this is new work" not in empty.text
        assert "2 turns of yours could not be searched by meaning yet" in empty.text and OTHER_PATHS in empty.text
        await env.turn("Message from Carla: email", "Plan the offsite dinner", "Booked it.")
        found = await query(env, "plan the offsite dinner")
        assert found.unreachable_count == 2 and found.text.count("- Woken by:") >= 1
        assert found.text.endswith(f"{OTHER_PATHS}.")


async def test_an_empty_answer_is_new_work_only_when_nothing_was_unreachable(env):
    resp = await query(env, "calibrate the telescope")
    assert resp.text == 'None of your past turns resembles "calibrate the telescope": this is new work.'


async def test_unrelated_turns_are_not_answered_as_similar_so_new_work_can_be_said(env):
    """With turns on record, none of them about the query: below the relevance floor nothing is a
    hit (it used to answer the closest turns whatever they were about), so the answer is new work —
    even for a turn that shares a word (Bob) with the query."""
    await env.turn("Message from Bob: Slack message", "Export billing to CSV", "Exported it.")
    await env.turn("Message from Dan: email", "Book the offsite dinner", "Booked a restaurant.")
    resp = await query(env, "Bob: calibrate the telescope mirror")
    assert resp.text == 'None of your past turns resembles "Bob: calibrate the telescope mirror": this is new work.'
    assert list(resp.episode_ids) == []


async def test_similar_prior_work_is_absent_when_nothing_resembles_the_ask(env):
    await env.turn("Message from Bob: Slack message", "Export billing to CSV", "Exported it.")
    await env.turn("Message from Dan: email", "Book the offsite dinner", "Booked a restaurant.")
    resp = await env.build("Bob: can you calibrate the telescope mirror tonight?")
    prior = block(resp, pb.BLOCK_SIMILAR_PRIOR_WORK)
    assert not prior.hit and prior.selection_count == 0


@pytest.mark.parametrize(
    "failure,words",
    [
        (None, "no embeddings configured, so stop asking by meaning"),
        (EmbeddingConfigurationError("bad key"), "until an operator fixes providers.embeddings"),
        (EmbeddingRefused("no"), "the embedder refused this query. A differently worded query may get past it"),
        (EmbeddingRateLimited("429"), "could not answer now (rate limited). Asking again may work"),
    ],
)
async def test_a_query_that_cannot_run_says_what_stopped_it(
    make_settings, dsn, clock, local_embedder, edge_index, failure, words
):
    embedder = None if failure is None else CountingEmbedder(local_embedder, fail=failure)
    async with open_env(default_settings(make_settings), dsn, clock, embedder=embedder, index=edge_index) as env:
        resp = await query(env, "billing export")
    assert words in resp.text and resp.text.endswith(f"{OTHER_PATHS}.")
    assert "this is new work" not in resp.text


async def test_an_unreadable_episode_store_is_said_as_what_it_was(
    make_settings, dsn, clock, local_embedder, edge_index
):
    names = ["diary", "knowledge", "prefetch"]
    async with open_env(
        default_settings(make_settings), dsn, clock, embedder=local_embedder, index=edge_index, names=names
    ) as env:
        resp = await query(env, "billing export")
        assert "the episode store could not be read (UNAVAILABLE)" in resp.text and OTHER_PATHS in resp.text
        recent = await query(env)
        assert "could not be read" in recent.text


# ------------------------------------------------------------------------------------ conversation, recency


async def test_conversation_and_recency_list_both_kinds_with_a_compacted_row_as_its_pattern(env):
    for i in range(3):
        await env.turn(
            "Message from Bob: Slack message",
            f"Export billing {i}",
            "Exported it.",
            tools=("billing.export", "slack.post"),
            days_ago=40,
            outcome=ep_pb.TURN_OUTCOME_FAILED if i == 0 else ep_pb.TURN_OUTCOME_DONE,
        )
    thread = [await env.turn("Message from Ana: Slack message", f"Reply {i}", conversation="C1/17") for i in range(2)]
    report = await env.app.passes()["episode-lifecycle"].run()
    assert report.clusters_compacted == 1
    recent = await query(env, limit=20)
    assert recent.text.startswith("Your most recent turns, newest first (")
    assert "- Pattern of 3 turns (" in recent.text and "2 of 3 ended done" in recent.text
    assert " to " in recent.text.split("- Pattern of 3 turns (")[1].split(")")[0]  # the dates it spans
    conversation = await query(env, conversation_id="C1/17")
    assert list(conversation.episode_ids) == [t.id for t in reversed(thread)]
    assert conversation.text.startswith("Your turns in conversation C1/17, newest first (2 of 2):")
    none = await query(env, conversation_id="C9")
    assert none.text == "You have no recorded turns in conversation C9."


async def test_an_unknown_outcome_filter_is_refused(env):
    code, info, bad = await refused(query(env, "x", outcome_filter="won"))
    assert (code.name, info.reason, bad.field_violations[0].field) == (
        "INVALID_ARGUMENT",
        "FIELD_INVALID",
        "outcome_filter",
    )


# ------------------------------------------------------------------------------------ long texts


async def test_an_ask_past_600_bytes_is_condensed_and_marked_as_a_rewrite(env):
    await env.turn("Message from Bob: Slack message", LONG_ASK, "Short account.")
    resp = await query(env)
    size = len(LONG_ASK.encode())
    assert f"  Asked (condensed from {size:,} bytes): Sentence 0 of a very long request" in resp.text
    assert "  What it did: Short account." in resp.text
    asked = next(line for line in resp.text.splitlines() if line.startswith("  Asked"))
    assert len(asked.encode()) < 700
    purposes = [e["payload"]["purpose"] for e in await env.events("auxiliary_spend")]
    assert purposes == ["episode_rewrite"]  # query_episodes is never summarised


async def test_texts_no_rewrite_reached_in_time_are_named_by_size_four_rewrites_at_once(
    make_settings, dsn, clock, local_embedder, edge_index, scripted_openai
):
    scripted_openai.rule("chat", lambda body: Reply(delay=20.0))  # a model slower than the deadline
    settings = llm_settings(
        make_settings, scripted_openai, timeout=30.0, learning={"episodes": {"rewrite_timeout_seconds": 2.0}}
    )
    async with open_env(settings, dsn, clock, embedder=local_embedder, index=edge_index) as env:
        for i in range(3):
            await env.turn("Message from Bob: Slack message", f"{i} {LONG_ASK}", f"{i} {LONG_ASK}")
        resp = await query(env, limit=3)
        assert resp.text.count("[not shown: ") == 6 and "no condensed version came in time" in resp.text
        assert "condensed from" not in resp.text
        assert 1 <= len(scripted_openai.received("chat")) <= 4  # six long texts, at most four rewrites at once


# ------------------------------------------------------------------------------------ the block's briefing


async def test_the_briefing_replaces_the_bullets_and_its_failure_falls_back_to_condensed_bullets(
    make_settings, dsn, clock, local_embedder, edge_index, scripted_openai
):
    def answer(body: dict) -> Reply | None:
        if purpose_of(body) == "episode_summary":
            return Reply(status=500)
        return None

    scripted_openai.rule("chat", answer)
    scripted_openai.chat_handler = lambda body: "CONDENSED by the model"
    settings = llm_settings(make_settings, scripted_openai)
    async with open_env(settings, dsn, clock, embedder=local_embedder, index=edge_index) as env:
        await env.turn("Message from Bob: Slack message", LONG_ASK, "Exported it.")
        prior = block(await env.build("a very long request about the billing export"), pb.BLOCK_SIMILAR_PRIOR_WORK)
        assert "Past turns of yours that resemble this one, most similar first:" in prior.markdown
        assert "Asked (condensed from" in prior.markdown and "CONDENSED by the model" in prior.markdown
        purposes = [purpose_of(b) for b in scripted_openai.received("chat")]
        assert purposes.count("episode_summary") == 1 and purposes.count("episode_rewrite") == 1


async def test_a_briefing_that_does_not_answer_in_time_leaves_the_bullets_the_rest_of_the_deadline(
    make_settings, dsn, clock, local_embedder, edge_index, scripted_openai
):
    def answer(body: dict) -> Reply | None:
        return Reply(delay=20.0) if purpose_of(body) == "episode_summary" else None

    scripted_openai.rule("chat", answer)
    scripted_openai.chat_handler = lambda body: (
        '{"selected": []}' if purpose_of(body) == "memory_filter" else "CONDENSED by the model"
    )
    settings = llm_settings(
        make_settings, scripted_openai, timeout=30.0, learning={"episodes": {"rewrite_timeout_seconds": 2.0}}
    )
    async with open_env(settings, dsn, clock, embedder=local_embedder, index=edge_index) as env:
        await env.turn("Message from Bob: Slack message", LONG_ASK, "Exported it.")
        prior = block(await env.build("a very long request about the billing export"), pb.BLOCK_SIMILAR_PRIOR_WORK)
    # The summary took the whole shared deadline: nothing was left for a rewrite.
    assert "[not shown: " in prior.markdown and "CONDENSED" not in prior.markdown
    assert prior.selection_count == 1


async def test_the_offline_briefing_reads_the_turns(env):
    await env.turn("Message from Bob: Slack message", "Export billing to CSV. Then post it.", "Exported it. Posted.")
    prior = block(await env.build("billing export csv"), pb.BLOCK_SIMILAR_PRIOR_WORK)
    assert prior.markdown.startswith("## Similar prior work\nA briefing on 1 past turn(s)")
    assert "woken by Message from Bob: Slack message; ended done; asked: Export billing to CSV." in prior.markdown


async def test_at_the_budget_ceiling_no_rewrite_is_asked_and_long_texts_are_named_by_size(
    make_settings, dsn, clock, local_embedder, edge_index, scripted_openai
):
    """Spec ("What the auxiliary calls cost"): no in-turn call is made while the turn's meter holds
    a full window. query_episodes asked a rewrite of every long text past the ceiling; it now names
    them by size, saying why, on every path (recency, conversation, similarity)."""
    budget = {"seat_ceiling_tokens": 100, "window_hours": 24}
    settings = llm_settings(
        make_settings, scripted_openai, companies={"acme": {"roles": ROLES, "token_budget": budget}}
    )
    async with open_env(settings, dsn, clock, embedder=local_embedder, index=edge_index) as env:
        await env.turn("Message from Bob: Slack message", LONG_ASK, "Short account.")
        cfg = settings.company("acme").token_budget
        await env.app.infra.budget.charge("acme", "ana", 1000, clock.now(), cfg)
        scripted_openai.clear()
        size = len(LONG_ASK.encode())
        for resp in (await query(env), await query(env, LONG_ASK[:300])):
            assert f"  Asked: [not shown: {size:,} bytes, too long for one line, and the token budget" in resp.text
            assert "  What it did: Short account." in resp.text and "condensed from" not in resp.text
        assert scripted_openai.received("chat") == []
        assert (await env.app.infra.budget.room("acme", "ana", clock.now(), cfg)).seat_spent == 1000
