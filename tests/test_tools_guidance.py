"""Layer 3 and layer 2: the builtins' tool schemas (one line of when-to-use each) and the guidance
blocks returned only when their trigger tool is registered."""

from __future__ import annotations

import json

import jsonschema
import pytest

from services.prefetch.guidance import BUNDLED, guidance_blocks, load_guidance
from services.prefetch.tools import BUILTIN_NAMES, tool_schemas

ALL = list(BUILTIN_NAMES)


def _names(tools: list[dict]) -> list[str]:
    return [t["name"] for t in tools]


# ------------------------------------------------------------------------------------- tool schemas


def test_every_builtin_is_a_valid_openai_tool_with_a_one_line_description(make_settings):
    tools = tool_schemas(make_settings(), "acme", "sre", can_search=True)
    assert _names(tools) == ALL
    for tool in tools:
        desc = tool["description"]
        assert desc and "\n" not in desc and desc == desc.strip(), tool["name"]
        assert 40 <= len(desc) <= 320, (tool["name"], len(desc))
        params = tool["parameters"]
        jsonschema.Draft202012Validator.check_schema(params)
        assert params["type"] == "object" and params["additionalProperties"] is False
        assert set(params["required"]) <= set(params["properties"])
        for prop, schema in params["properties"].items():
            assert schema.get("description"), (tool["name"], prop)
        assert tool["openai"] == {
            "type": "function",
            "function": {"name": tool["name"], "description": desc, "parameters": params},
        }
        json.dumps(tool)  # the servicer sends them as JSON text


def test_parameters_are_the_model_facing_fields_of_each_builtin_request(make_settings):
    tools = {t["name"]: t["parameters"] for t in tool_schemas(make_settings(), "acme", "sre", can_search=True)}
    fields = {name: (sorted(p["properties"]), sorted(p["required"])) for name, p in tools.items()}
    assert fields == {
        "refresh_memory": (["context_hint", "limit"], ["context_hint"]),
        "query_episodes": (["conversation_id", "limit", "outcome_filter", "query"], []),
        "reflect_and_persist": (["content", "tier", "ttl_days"], ["content"]),
        "use_skill": (["name"], ["name"]),
        "refine_skill": (["content", "reason", "skill_name"], ["content", "skill_name"]),
        "distill_skill": (["body", "name", "summary", "tool_sequence"], ["body", "name", "summary", "tool_sequence"]),
        "search_knowledge": (["limit", "query"], ["query"]),
        "mark_onboarded": ([], []),
    }
    # Identity is the engine's to fill, never the model's.
    for params in tools.values():
        assert not {"company", "seat", "role", "turn_id", "senders"} & set(params["properties"])


def test_schemas_carry_the_limits_the_services_enforce(make_settings):
    settings = make_settings(
        learning={"diary": {"max_content_chars": 1500}, "personal_memory": {"max_refreshes_per_turn": 2}}
    )
    tools = {t["name"]: t for t in tool_schemas(settings, "acme", "sre", can_search=True)}
    persist = tools["reflect_and_persist"]
    assert persist["parameters"]["properties"]["content"]["maxLength"] == 1500
    assert "1500" in persist["description"]
    assert "at most 2 per turn" in tools["refresh_memory"]["description"]
    assert tools["query_episodes"]["parameters"]["properties"]["outcome_filter"]["enum"] == [
        "done",
        "failed",
        "self_iterate",
    ]
    validator = jsonschema.Draft202012Validator(persist["parameters"])
    assert validator.is_valid({"content": "Dana approves prod deploys.", "tier": "short", "ttl_days": 3})
    assert not validator.is_valid({"content": "x" * 1501})
    assert not validator.is_valid({"content": "fine", "tier": "forever"})
    assert not validator.is_valid({"content": "fine", "seat": "someone-else"})
    search = jsonschema.Draft202012Validator(tools["search_knowledge"]["parameters"])
    assert search.is_valid({"query": "deploy runbook", "limit": 20})
    assert not search.is_valid({"query": "deploy runbook", "limit": 21})
    assert not search.is_valid({"limit": 3})
    assert jsonschema.Draft202012Validator(tools["mark_onboarded"]["parameters"]).is_valid({})


def test_refine_skill_is_withdrawn_when_refinement_is_off(make_settings):
    off = make_settings(learning={"skill_refinement": {"enabled": False}})
    assert "refine_skill" not in _names(tool_schemas(off, "acme", "sre", can_search=True))
    assert "refine_skill" in _names(tool_schemas(make_settings(), "acme", "sre", can_search=True))


def test_search_knowledge_is_withdrawn_when_the_role_can_search_nothing(make_settings):
    names = _names(tool_schemas(make_settings(), "acme", "sre", can_search=False))
    assert names == [n for n in ALL if n != "search_knowledge"]


# ------------------------------------------------------------------------------------- guidance

TRIGGERS = {
    "reflect-and-persist": ["reflect_and_persist"],
    "refine-skill": ["refine_skill"],
    "retrieval-research": [
        "query_episodes",
        "refresh_memory",
        "search_knowledge",
        "confluence_search",
        # The Atlassian MCP server is a trigger of its own (spec), page search or not.
        "atlassian_get_user",
        "confluence_get_page",
        "jira_search",
        "mcp__atlassian__jira_get_issue",
    ],
    "observed-directives": ["mattermost_post_message"],
    "getting-unstuck": [
        "mattermost_post_message",
        "atlassian_get_user",
        "confluence_get_page",
        "confluence_search",
        "jira_search",
        "mcp__atlassian__jira_get_issue",
        "a2a_ask",
    ],
    "channel-discovery": [
        "mattermost_post_message",
        "mattermost_list_channels",
        "mattermost_join_channel",
        "mattermost_search_users",
        "mattermost_reply_to_thread",
    ],
}


def test_the_six_bundled_blocks_ship_as_markdown():
    blocks = load_guidance()
    assert [b.name for b in blocks] == list(BUNDLED) == list(TRIGGERS)
    for block in blocks:
        assert block.markdown.startswith("### ")
        assert len(block.markdown) > 300
        assert "---" not in block.markdown.splitlines()[0]


def test_nothing_registered_means_no_guidance():
    assert guidance_blocks([]) == []
    assert guidance_blocks(["web_search", "github_create_pr", "mattermost_add_reaction"]) == []


@pytest.mark.parametrize("name", list(TRIGGERS))
def test_each_block_is_returned_only_when_one_of_its_trigger_tools_is_registered(name):
    for tool in TRIGGERS[name]:
        blocks = {b["name"]: b for b in guidance_blocks(["web_search", tool])}
        assert name in blocks, tool
        assert blocks[name]["triggered_by"] == [tool]
        assert "web_search" not in str([b["triggered_by"] for b in blocks.values()])
    others = [t for n, ts in TRIGGERS.items() if n != name for t in ts if t not in TRIGGERS[name]]
    assert name not in {b["name"] for b in guidance_blocks(others)}


def test_blocks_come_in_a_stable_order_with_every_trigger_named():
    tools = [t for ts in TRIGGERS.values() for t in ts]
    blocks = guidance_blocks(list(reversed(tools)))
    assert [b["name"] for b in blocks] == list(TRIGGERS)
    unstuck = next(b for b in blocks if b["name"] == "getting-unstuck")
    assert set(unstuck["triggered_by"]) == set(TRIGGERS["getting-unstuck"])


def test_near_miss_tool_names_do_not_trigger():
    assert guidance_blocks(["reflect_and_persist_v2", "my_refine_skill"]) == []
    assert guidance_blocks(["mattermost_add_reaction", "slack_post_message"]) == []
    # confluence_search_user is an Atlassian server tool (both server-triggered blocks), but it
    # searches people, not pages: no knowledge line names it.
    blocks = {b["name"]: b for b in guidance_blocks(["reflect_and_persist_v2", "confluence_search_user"])}
    assert list(blocks) == ["retrieval-research", "getting-unstuck"]
    assert all(b["triggered_by"] == ["confluence_search_user"] for b in blocks.values())
    assert "- `" not in blocks["retrieval-research"]["markdown"]


def _research(tools: list[str]) -> dict | None:
    return next((b for b in guidance_blocks(tools) if b["name"] == "retrieval-research"), None)


def test_retrieval_research_states_the_rule_once_then_one_line_per_re_query_tool_present():
    full = _research(["query_episodes", "search_knowledge", "refresh_memory"])
    assert full is not None
    md = full["markdown"]
    assert md.count("even when a block already had") == 1
    lines = [line for line in md.splitlines() if line.startswith("- `")]
    assert [line.split("`")[1] for line in lines] == ["query_episodes", "search_knowledge", "refresh_memory"]
    assert full["triggered_by"] == ["query_episodes", "search_knowledge", "refresh_memory"]

    only_memory = _research(["refresh_memory", "reflect_and_persist"])
    assert only_memory is not None
    assert [line.split("`")[1] for line in only_memory["markdown"].splitlines() if line.startswith("- `")] == [
        "refresh_memory"
    ]
    assert "query_episodes" not in only_memory["markdown"]
    assert "search_knowledge" not in only_memory["markdown"]
    assert only_memory["triggered_by"] == ["refresh_memory"]


def test_retrieval_research_names_the_knowledge_backends_page_search_tools_in_one_line():
    block = _research(["mcp__atlassian__confluence_search", "search_knowledge", "confluence_get_page"])
    assert block is not None
    lines = [line for line in block["markdown"].splitlines() if line.startswith("- `")]
    assert len(lines) == 1
    assert lines[0].startswith("- `mcp__atlassian__confluence_search`, `search_knowledge`:")
    assert "confluence_get_page" not in block["markdown"]  # a fetch, not a page search
    assert block["triggered_by"] == ["mcp__atlassian__confluence_search", "search_knowledge", "confluence_get_page"]
    assert _research(["reflect_and_persist", "web_search"]) is None


def test_retrieval_research_fires_on_the_atlassian_mcp_server_and_names_only_its_page_search():
    # Spec: the trigger is any_of query_episodes / the atlassian MCP server / refresh_memory; the
    # knowledge line names the backend's page-search tools the role has (confluence_search), never
    # the server's fetch or Jira tools.
    atlassian = ["mcp__atlassian__confluence_get_page", "mcp__atlassian__jira_get_issue"]
    block = _research([*atlassian, "mcp__atlassian__confluence_search", "web_search"])
    assert block is not None
    lines = [line for line in block["markdown"].splitlines() if line.startswith("- `")]
    assert len(lines) == 1 and lines[0].startswith("- `mcp__atlassian__confluence_search`: search the team")
    assert block["triggered_by"] == [*atlassian, "mcp__atlassian__confluence_search"]

    # The server without a page-search tool: the shared rule still applies, with no knowledge line.
    fetch_only = _research(atlassian)
    assert fetch_only is not None and fetch_only["triggered_by"] == atlassian
    assert fetch_only["markdown"].count("even when a block already had") == 1
    assert not [line for line in fetch_only["markdown"].splitlines() if line.startswith("- `")]
    with_memory = _research([*atlassian, "refresh_memory"])
    assert with_memory is not None
    assert [line.split("`")[1] for line in with_memory["markdown"].splitlines() if line.startswith("- `")] == [
        "refresh_memory"
    ]


def test_registered_tools_are_deduplicated():
    [block] = guidance_blocks(["reflect_and_persist", " reflect_and_persist ", ""])
    assert block["triggered_by"] == ["reflect_and_persist"]
