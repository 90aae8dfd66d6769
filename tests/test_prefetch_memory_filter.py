"""The offline memory filter ranks the diary's pool by what the pool already knows: the fused vector
similarity (min-max over the pool's vector hits) and lexical rank (over the pool's highest), equal
weights, newest first among equals, a floor, and senders' names still lifting a note. The rule on
its own data, then BuildTurnContext end to end (real diary, real MiniLM, the offline provider)."""

from __future__ import annotations

import json

import pytest

from agentlearn.prefetch.v1 import prefetch_service_pb2 as pb
from services.prefetch.memory import FUSED_FLOOR, fused_scores, memory_filter_rule
from tests.support.scripted_openai import Reply
from tests.test_prefetch_support import block, default_settings, llm_settings, open_env, purpose_of, user_of


def cand(cid: str, content: str, *, sim: float = 0.0, lex: float = 0.0, t: str = "2026-01-01T00:00:00"):  # type: ignore[no-untyped-def]
    found = (["vector"] if sim else []) + (["lexical"] if lex else []) or ["recency"]
    return {"id": cid, "content": content, "similarity": sim, "lexical_rank": lex, "found_by": found, "create_time": t}


def chosen(query: str, candidates: list[dict], *, senders=(), limit: int = 10) -> list[str]:  # type: ignore[no-untyped-def]
    data = {"query": query, "senders": [list(s) for s in senders], "candidates": candidates, "max_selected": limit}
    return json.loads(memory_filter_rule(data))["selected"]


def test_a_candidate_converts_as_the_timestamps_own_formatting_says_every_time():
    """MemoryNote.from_candidate (one construction, remembered timestamp strings) gives what
    Timestamp.ToDatetime().isoformat() gives, whole seconds and microseconds alike, and the same
    note twice gives the same note; content words (remembered per text) are a fresh list each call."""
    from google.protobuf import timestamp_pb2

    from agentlearn.diary.v1 import diary_service_pb2 as diary_pb
    from services.prefetch.memory import MemoryNote
    from services.prefetch.text import content_words

    for seconds, nanos in ((1_764_556_800, 0), (1_764_556_801, 123_456_789), (0, 999), (1_800_000_000, 1_000)):
        created = timestamp_pb2.Timestamp(seconds=seconds, nanos=nanos)
        expires = timestamp_pb2.Timestamp(seconds=seconds + 86_400, nanos=nanos)
        c = diary_pb.RecallCandidate(
            note=diary_pb.Note(
                id="n1", content="Bob", tier=diary_pb.NOTE_TIER_SHORT, create_time=created, expire_time=expires
            ),
            similarity=0.5,
            lexical_rank=1.25,
            found_by=[diary_pb.RECALL_HALF_VECTOR, diary_pb.RECALL_HALF_NEIGHBOUR],
        )
        for _ in range(2):
            note = MemoryNote.from_candidate(c)
            assert note.create_time == created.ToDatetime().isoformat()
            assert note.expire_time == expires.ToDatetime().isoformat()
            assert (note.tier, note.similarity, note.lexical_rank) == ("short", 0.5, 1.25)
            assert note.found_by == {"vector", "neighbour"}
    long = MemoryNote.from_candidate(diary_pb.RecallCandidate(note=diary_pb.Note(id="n2", content="x")))
    assert (long.tier, long.create_time, long.expire_time, long.found_by) == ("long", "", "", frozenset())
    words = content_words("Deploying the staging databases on Sundays")
    assert words == ["deploy", "stag", "databas", "sunday"]
    words.append("mutated")
    assert content_words("Deploying the staging databases on Sundays") == ["deploy", "stag", "databas", "sunday"]


def test_a_note_related_by_meaning_is_shown_over_an_unrelated_one_sharing_a_word():
    # The vector half's best hit shares no word with the ask; the word-sharing note is a weak
    # lexical hit and no vector hit at all. Word overlap chose the second and never the first.
    notes = [
        cand("n1", "The travel agency's office moved to the third floor.", lex=0.5),
        cand("n2", "Trip costs are paid back once finance approves the receipts.", sim=0.56),
        cand("n3", "Travel expenses over 500 euros need a sign-off.", sim=0.47, lex=1.0),
        cand("n4", "Finance closes the books on the fifth.", sim=0.43),
    ]
    assert chosen("How do I get reimbursed for my travel expenses?", notes) == ["n3", "n2", "n1"]
    assert chosen("How do I get reimbursed for my travel expenses?", notes, limit=2) == ["n3", "n2"]


def test_scores_are_relative_to_the_pool_with_equal_weights():
    notes = [
        cand("best-vector", "a", sim=0.80),
        cand("worst-vector", "b", sim=0.50),
        cand("mid-vector", "c", sim=0.65),
        cand("best-lexical", "d", lex=6.0),
        cand("half-lexical", "e", lex=3.0),
        cand("recent-only", "f"),
    ]
    assert fused_scores(notes) == pytest.approx([0.5, 0.0, 0.25, 0.5, 0.25, 0.0])
    # The same pool with every similarity shifted: the same scores (min-max), and a lone hit is the best.
    shifted = [{**c, "similarity": c["similarity"] - 0.1 if c["similarity"] else 0.0} for c in notes]
    assert fused_scores(shifted) == pytest.approx(fused_scores(notes))
    assert fused_scores([cand("only", "x", sim=0.43)]) == [0.5]


def test_below_the_floor_nothing_is_shown_and_ties_go_to_the_newer_note():
    notes = [
        cand("old", "a", sim=0.9, t="2026-01-01T00:00:00"),
        cand("new", "b", sim=0.9, t="2026-03-01T00:00:00"),
        cand("weak", "c", sim=0.5),  # the pool's weakest vector hit: 0
        cand("faint", "d", lex=0.1),  # a tenth of the best lexical rank: 0.05
        cand("strong-lexical", "e", lex=1.0),
        cand("recency", "f"),
    ]
    assert FUSED_FLOOR > 0.05
    assert chosen("anything", notes) == ["new", "old", "strong-lexical"]


def test_a_note_naming_a_sender_is_lifted_even_when_recency_alone_found_it():
    notes = [
        cand("n1", "The cafeteria closes at two."),
        cand("n2", "Bob dislikes surprise meetings."),
        cand("n3", "Billing deploys need a change ticket.", sim=0.5, lex=2.0),
        cand("n4", "Deploying billing requires the billing on-call.", sim=0.7, lex=3.0),
    ]
    assert chosen("Deploy the billing service", notes) == ["n4", "n3"]
    assert chosen("Deploy the billing service", notes, senders=[("Bob", "bob")]) == ["n4", "n2", "n3"]


def test_the_filter_is_told_every_distinct_named_sender_a_handle_alone_included():
    from services.prefetch.domain import Sender
    from services.prefetch.memory import party_senders

    dana, bob = Sender(handle="dana"), Sender(handle="bob", platform="slack", display_name="Bob")
    senders = [dana, bob, Sender(handle="bob", platform="SLACK"), Sender(), Sender(display_name="Eve"), dana]
    assert party_senders(senders) == [dana, bob, Sender(display_name="Eve")]
    assert chosen("The release train is late", [cand("n1", "Dana runs the release train.")]) == []
    told = [s.words() for s in party_senders([dana])]
    assert chosen("The release train is late", [cand("n1", "Dana runs the release train.")], senders=told) == ["n1"]


# ------------------------------------------------------------------------------------ end to end

ASK = "How do I get reimbursed for my travel expenses?"


@pytest.fixture
async def env(make_settings, dsn, clock, local_embedder, edge_index):
    async with open_env(default_settings(make_settings), dsn, clock, embedder=local_embedder, index=edge_index) as e:
        yield e


async def test_the_block_shows_the_note_that_means_the_ask_before_one_that_only_shares_a_word(env):
    meaning = await env.note("Trip costs are paid back once finance approves the receipts.")
    word = await env.note("The travel agency's office moved to the third floor.")
    both = await env.note("Travel expenses over 500 euros need a manager's sign-off.")
    unrelated = await env.note("The cafeteria closes at two.")
    resp = await env.build(ASK)
    memory = block(resp, pb.BLOCK_PERSONAL_MEMORY)
    shown = list(memory.ids)
    # Word overlap never showed the first (it shares no word with the ask) and showed the second.
    assert meaning in shown and unrelated not in shown
    assert shown.index(both) < shown.index(meaning) and (word not in shown or shown.index(meaning) < shown.index(word))
    lines = memory.markdown.splitlines()
    assert any(line.startswith("- Trip costs") for line in lines) and not any("cafeteria" in line for line in lines)
    assert await env.uses(unrelated) == 0 and await env.uses(meaning) == 1


async def test_a_model_is_shown_the_same_listing_as_before(
    make_settings, dsn, clock, local_embedder, edge_index, scripted_openai
):
    scripted_openai.rule(
        "chat", lambda body: Reply(body={"choices": []}) if purpose_of(body) != "memory_filter" else None
    )
    scripted_openai.chat_handler = lambda body: json.dumps({"selected": []})
    settings = llm_settings(make_settings, scripted_openai)
    async with open_env(settings, dsn, clock, embedder=local_embedder, index=edge_index) as env:
        await env.note("Trip costs are paid back once finance approves the receipts.")
        await env.build(ASK)
        [request] = [b for b in scripted_openai.received("chat") if purpose_of(b) == "memory_filter"]
        user = user_of(request)
        assert "Trip costs are paid back" in user
        # What the pool knows is for the offline rule only: the model judges the notes' text.
        assert "similarity" not in user and "lexical" not in user and "0.5" not in user
