"""The prefetch's pure rules: the offline answers of every purpose it asks a model, the summary
line's denominator, hint normalisation, chain hashing and byte fitting."""

from __future__ import annotations

import json

from services.prefetch.domain import (
    Block,
    BlockKind,
    Summary,
    TurnEmbedding,
    chain_hash,
    fit_bytes,
    hint_key,
    normalise_hint,
)
from services.prefetch.knowledge_block import knowledge_query_rule
from services.prefetch.memory import memory_filter_rule
from services.prefetch.past_turns import rewrite_rule, summary_rule


def test_the_offline_filter_ranks_by_the_pools_scores_and_lifts_notes_naming_a_sender():
    def cand(cid: str, content: str, sim: float = 0.0, lex: float = 0.0) -> dict:
        found = (["vector"] if sim else []) + (["lexical"] if lex else []) or ["recency"]
        return {"id": cid, "content": content, "similarity": sim, "lexical_rank": lex, "found_by": found}

    data = {
        "query": "Deploy the billing service",
        "senders": [["Bob", "bob"]],
        "candidates": [
            cand("n1", "The cafeteria closes at two."),
            cand("n2", "Bob dislikes surprise meetings."),
            cand("n3", "Billing deploys need a change ticket.", sim=0.5, lex=1.0),
            cand("n4", "Deploying the billing service requires the billing on-call.", sim=0.7, lex=2.0),
        ],
        "max_selected": 10,
    }
    chosen = json.loads(memory_filter_rule(data))["selected"]
    assert chosen == ["n4", "n2", "n3"]  # the cafeteria: recency alone found it, it names no sender
    assert json.loads(memory_filter_rule({**data, "max_selected": 1}))["selected"] == ["n4"]


def test_the_offline_query_is_the_asks_key_words():
    assert knowledge_query_rule({"ask": "Hi! Could you please rotate the staging DB credentials?"}) == (
        "rotate staging credentials"
    )


def test_the_offline_rewrite_keeps_whole_first_sentences_within_the_budget():
    text = "First sentence is here. " + "Second one is much longer than that. " * 40
    out = rewrite_rule({"text": text, "limit_bytes": 80})
    assert out.startswith("First sentence is here.") and out.endswith("[…]") and len(out.encode()) <= 80


def test_the_offline_briefing_is_marked_and_bounded():
    turns = [
        {"date": f"2026-01-0{i}", "woken_by": "Message", "outcome": "done", "asked": "A. B.", "what_it_did": "C."}
        for i in range(1, 9)
    ]
    out = summary_rule({"turns": turns, "max_bytes": 200})
    assert out.startswith("(Offline briefing") and len(out.encode()) <= 200 and "asked: A." in out


def test_the_summary_line_counts_out_of_the_block_list():
    blocks = (
        Block(BlockKind.SIMILAR_PRIOR_WORK, "## x"),
        Block(BlockKind.PERSONAL_MEMORY),
        Block(BlockKind.COUNTERPARTY, "## Counterparty: Bob"),
    )
    s = Summary(blocks, 0, True, None, True)
    assert s.line == "prefetch: 2/7 hits (thin trigger: relevance filters gated)"
    assert s.payload()["counterparty_blocks"] == 1 and s.payload()["similar_prior_work_hit"] is True
    assert "turn_embedding" not in s.payload()  # absent where no search asked for a vector


def test_the_denominator_is_the_engines_fixed_list_whatever_the_senders():
    """N/7 whatever the number of senders: three counterparty blocks are one kind (the line used to
    read 3/8 with three senders and 1/5 with none)."""
    parties = tuple(Block(BlockKind.COUNTERPARTY, f"## Counterparty: {n}") for n in ("Bob", "Dan", "Eve"))
    many = Summary((Block(BlockKind.SKILLS, "## s"), *parties), 0, False, TurnEmbedding.EMBEDDED, False)
    none = Summary((Block(BlockKind.SKILLS, "## s"),), 0, False, TurnEmbedding.EMBEDDED, False)
    assert many.line == "prefetch: 2/7 hits" and none.line == "prefetch: 1/7 hits"
    assert many.payload()["block_count"] == none.payload()["block_count"] == 7


def test_hints_compare_case_and_whitespace_insensitively_and_chains_in_order():
    assert normalise_hint("  Billing\tEXPORT  ") == "billing export"
    assert hint_key("Billing export") == hint_key(" billing   EXPORT")
    assert chain_hash(["a", "b"]) != chain_hash(["b", "a"]) and chain_hash(["ab"]) != chain_hash(["a", "b"])


def test_fit_bytes_ends_between_words_and_handles_one_long_word():
    assert fit_bytes("alpha beta gamma", 11) == "alpha beta"
    assert fit_bytes("é" * 10, 5) == "éé"
