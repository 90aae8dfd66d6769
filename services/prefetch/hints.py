"""The gate-path hints and the fixed prose of the turn-start blocks, as data in one place.

A hint is what a relevance block renders instead of going silently empty (spec: "Thin-trigger
gate", "Relevant-knowledge prefetch § Hardening"); each points at the one tool that fetches what
the block could not: ``refresh_memory``, ``search_knowledge``, ``query_episodes``. The hints read
correctly whether or not anything exists to be found: the recall hint in particular is rendered for
a seat that may have no past turns at all.
"""

from __future__ import annotations

__all__ = [
    "EMPTY_KNOWLEDGE_HINT",
    "EMPTY_MEMORY_HINT",
    "EMPTY_RECALL_HINT",
    "KNOWLEDGE_INTRO",
    "MEMORY_INTRO",
    "ONBOARDING_INTRO",
    "PRIOR_WORK_BRIEFING_INTRO",
    "PRIOR_WORK_INTRO",
    "SKILLS_INTRO",
    "UNSEARCHED_KNOWLEDGE_HINT",
]

EMPTY_MEMORY_HINT = (
    "Nothing in your diary was matched to this trigger yet; it may only point at the real task. Once "
    "you have read what it points at and know what the task is about, call refresh_memory with your "
    "own account of the task to pull the notes that bear on it."
)
"""EmptyMemoryHint: rendered only when the seat has notes (a seat with none has nothing to refresh)."""

EMPTY_RECALL_HINT = (
    "Your past turns were not searched for this trigger. If this task resembles something you have "
    "done before, call query_episodes with a description of it once you know what it is; it also "
    "reads one conversation's turns, or your most recent ones."
)
"""EmptyRecallHint: rendered whenever the gate skipped the search, phrased conditionally because
only the skipped vector query could say whether such turns exist."""

EMPTY_KNOWLEDGE_HINT = (
    "No team knowledge-base pages were surfaced for this trigger. Once you know what the task is "
    "about, call search_knowledge with your own query: a playbook, runbook or convention your team "
    "wrote down may cover it."
)
"""EmptyKnowledgeHint: the gate skipped the search (and a search could return something), or the
search ran and returned nothing."""

UNSEARCHED_KNOWLEDGE_HINT = (
    "The team knowledge base could not be searched at turn start (the backend did not answer), so "
    "nothing is known about which pages exist. Call search_knowledge with your own query before "
    "concluding a page does not exist, and before writing one that may already be there."
)
"""UnsearchedKnowledgeHint: the search never ran, which says nothing about what exists."""

MEMORY_INTRO = "Notes from your own diary that bear on this task (declarative facts you recorded earlier):"
PRIOR_WORK_INTRO = "Past turns of yours that resemble this one, most similar first:"
PRIOR_WORK_BRIEFING_INTRO = "A briefing on {count} past turn(s) of yours that resemble this one:"
SKILLS_INTRO = (
    "Procedures you drafted from your own past work. Load one with use_skill(name) before following "
    "it; a skill marked as unused is still loadable but may be out of date."
)
KNOWLEDGE_INTRO = (
    "Team knowledge-base pages that may bear on this task (title, where it lives, a snippet). These "
    "are snippets only: open a page's full body, or run a search of your own, with the knowledge-base "
    "tools your role has."
)
ONBOARDING_INTRO = (
    "You have not onboarded to your current team structure ({chain}). Read the onboarding pages "
    "below, then call mark_onboarded so this section stops appearing (it returns if your unit chain "
    "changes)."
)
COUNTERPARTY_INTRO = "What you have observed of {name} ({platform}); your own notes, private to you:"
