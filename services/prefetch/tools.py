"""The builtins as OpenAI-style tool schemas (``ListTools``): layer 3 of the four layers.

Each tool carries one precise line of when-to-use text, because the guardrails live in the tool
descriptions rather than in prompt prose (spec: "Why tools alone are not enough"). The parameters
are what the model writes; the identity fields of each BuiltinService request (company, seat,
role, turn_id, senders) are the engine's to fill and never appear here. A parameter's name is its
request field's name, so an engine maps arguments onto the request one to one.

Withdrawn tools: ``refine_skill`` when ``learning.skill_refinement.enabled`` is false (RefineSkill
would refuse), ``distill_skill`` when the role's ``distill_skill`` permission is ``deny`` (DistillSkill
would refuse), ``search_knowledge`` when the role can search nothing (``Searcher.can_search``).
"""

from __future__ import annotations

from typing import Any

from libs.common.config import Settings
from services.prefetch.domain import (
    HINT_MAX_CHARS,
    QUERY_EPISODES_LIMIT,
    QUERY_MAX_CHARS,
    REFRESH_LIMIT,
    SEARCH_KNOWLEDGE_LIMIT,
)

__all__ = ["BUILTIN_NAMES", "SHORT_NOTE_MAX_TTL_DAYS", "tool_schemas"]

BUILTIN_NAMES = (
    "refresh_memory",
    "query_episodes",
    "reflect_and_persist",
    "use_skill",
    "refine_skill",
    "distill_skill",
    "search_knowledge",
    "mark_onboarded",
)
"""Every builtin, in the order ListTools returns them."""

SHORT_NOTE_MAX_TTL_DAYS = 3650
"""The diary's longest time to live of a SHORT note."""


def _object(properties: dict[str, dict[str, Any]], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


def _tool(name: str, description: str, parameters: dict[str, Any]) -> dict[str, Any]:
    assert "\n" not in description, name
    return {
        "name": name,
        "description": description,
        "parameters": parameters,
        "openai": {
            "type": "function",
            "function": {"name": name, "description": description, "parameters": parameters},
        },
    }


def tool_schemas(settings: Settings, company: str, role: str, can_search: bool) -> list[dict[str, Any]]:
    """The builtins the role's engine hands its model, each as ``{name, description, parameters,
    openai}``. ``company`` and ``role`` select nothing yet beyond what the caller decided
    (``can_search``); they are here so a per-role catalogue needs no new signature."""
    learning = settings.learning
    cap = learning.personal_memory.max_refreshes_per_turn
    note_chars = learning.diary.max_content_chars
    tools = [
        _tool(
            "refresh_memory",
            "Re-select your diary notes against your own account of the task: call it as soon as recon "
            "(reading the thread, ticket, diff or pages) has changed what you understand the task to be, even "
            f"if ## Personal memory already had entries; at most {cap} per turn, and repeating a hint is free.",
            _object(
                {
                    "context_hint": {
                        "type": "string",
                        "minLength": 1,
                        "maxLength": HINT_MAX_CHARS,
                        "description": "What the task is actually about now, in your own words: subject, "
                        "systems, people and goal (not the raw trigger).",
                    },
                    "limit": REFRESH_LIMIT.schema("Notes"),
                },
                ["context_hint"],
            ),
        ),
        _tool(
            "query_episodes",
            "Look up your own past turns — by similarity to a description, one conversation's turns, or your "
            "most recent — when knowing how you handled a similar task before (what was asked, what you did, "
            "how it ended) would change what you do now.",
            _object(
                {
                    "query": {
                        "type": "string",
                        "maxLength": QUERY_MAX_CHARS,
                        "description": "Describe the task to find similar past turns; omit to list by "
                        "conversation or recency.",
                    },
                    "conversation_id": {
                        "type": "string",
                        "description": "Your turns in this one conversation (thread, ticket), newest first.",
                    },
                    "outcome_filter": {
                        "type": "string",
                        "enum": ["done", "failed", "self_iterate"],
                        "description": "Only turns that ended this way; omit for any.",
                    },
                    "limit": QUERY_EPISODES_LIMIT.schema("Turns"),
                },
                [],
            ),
        ),
        _tool(
            "reflect_and_persist",
            "Save one durable, declarative fact you will need in later turns (a preference, convention, "
            "owner or constraint, e.g. 'Dana approves prod deploys in #releases') to your private diary — "
            f"not a to-do, a task log or an instruction to yourself; at most {note_chars} characters.",
            _object(
                {
                    "content": {
                        "type": "string",
                        "minLength": 1,
                        "maxLength": note_chars,
                        "description": "The fact, self-contained: who or what it is about and why it matters.",
                    },
                    "tier": {
                        "type": "string",
                        "enum": ["long", "short"],
                        "default": "long",
                        "description": "long: holds until it is contradicted; short: situational, expires "
                        "after ttl_days.",
                    },
                    "ttl_days": {
                        "type": "integer",
                        "minimum": 1,
                        "maximum": SHORT_NOTE_MAX_TTL_DAYS,
                        "description": "Days a short note lives (required with tier short; omit for long).",
                    },
                },
                ["content"],
            ),
        ),
        _tool(
            "use_skill",
            "Load the full procedure of one of your skills listed under ## Synthesized skills you've learned, "
            "by its exact name, before you follow it; never guess a name that is not listed.",
            _object(
                {"name": {"type": "string", "minLength": 1, "description": "The skill's exact name."}},
                ["name"],
            ),
        ),
    ]
    if learning.skill_refinement.enabled:
        tools.append(
            _tool(
                "refine_skill",
                "Replace a skill you loaded with use_skill with its corrected full text as soon as you find a "
                "step wrong, missing or stale while using it — don't wait to be asked; send the whole new body, "
                "not a diff.",
                _object(
                    {
                        "skill_name": {"type": "string", "minLength": 1, "description": "The skill's exact name."},
                        "content": {
                            "type": "string",
                            "minLength": 1,
                            "maxLength": learning.skill_refinement.max_body_chars,
                            "description": "The complete corrected SKILL.md body; it replaces the old one whole.",
                        },
                        "reason": {
                            "type": "string",
                            "description": "What was wrong and what you observed that shows it.",
                        },
                    },
                    ["skill_name", "content"],
                ),
            )
        )
    if settings.tool_permission(company, role, "distill_skill") != "deny":
        tools.append(
            _tool(
                "distill_skill",
                "Propose a reusable procedure you just carried out end to end (and saw work) as a new skill; a "
                "person reviews it before it is offered, and a duplicate of a skill or a rejected proposal is not "
                "filed.",
                _object(
                    {
                        "name": {
                            "type": "string",
                            "minLength": 1,
                            "maxLength": 100,
                            "description": "A short name: lowercase words joined by hyphens.",
                        },
                        "summary": {
                            "type": "string",
                            "minLength": 1,
                            "maxLength": 1000,
                            "description": "One line saying when the skill applies.",
                        },
                        "body": {
                            "type": "string",
                            "minLength": 1,
                            "maxLength": learning.skill_refinement.max_body_chars,
                            "description": "The SKILL.md body: the procedure step by step, as it worked.",
                        },
                        "tool_sequence": {
                            "type": "array",
                            "minItems": 1,
                            "items": {"type": "string", "minLength": 1},
                            "description": "The tools the procedure used, in the order it used them.",
                        },
                    },
                    ["name", "summary", "body", "tool_sequence"],
                ),
            )
        )
    if can_search:
        limit = SEARCH_KNOWLEDGE_LIMIT.configured(learning.prefetch.knowledge_results)
        tools.append(
            _tool(
                "search_knowledge",
                "Search your team's knowledge base (runbooks, playbooks, ADRs, conventions) with keywords you "
                "write, once recon shows what the task is really about or when ## Relevant knowledge had "
                "nothing; search a page's exact title to read it whole.",
                _object(
                    {
                        "query": {
                            "type": "string",
                            "minLength": 1,
                            "maxLength": QUERY_MAX_CHARS,
                            "description": "Keywords: the system, service, procedure or team names, not a "
                            "sentence; or a page's exact title.",
                        },
                        "limit": limit.schema("Pages"),
                    },
                    ["query"],
                ),
            )
        )
    tools.append(
        _tool(
            "mark_onboarded",
            "Call once, after you have read the pages listed under ## First-turn onboarding, so that section "
            "stops appearing; it returns by itself if your unit chain changes.",
            _object({}, []),
        )
    )
    return tools
