"""BuiltinService.CallTool: every tool ListTools offers runs by name with JSON arguments (real
results through the typed builtin), the arguments are validated against the same schema with every
violation named at once, a tool the role is not offered is NOT_FOUND, a writing tool needs its own
RPC's scope, a typed refusal keeps its reason with its field renamed to where the caller wrote it,
and request_id makes a write retry-safe. Real services over gRPC."""

from __future__ import annotations

import json

import pytest
from google.protobuf import message_factory

from agentlearn.diary.v1 import diary_service_pb2 as diary_pb
from agentlearn.prefetch.v1 import prefetch_service_pb2 as pb
from agentlearn.prefetch.v1 import prefetch_service_pb2_grpc as pb_grpc
from services.prefetch.calltool import TOOL_CONTEXT_FIELDS, method_of
from services.prefetch.domain import chain_hash
from tests.support.app import open_app
from tests.test_prefetch_support import SERVICES, default_settings, open_env, refused

BOB = pb.Counterparty(handle="bob", platform="slack", display_name="Bob")


@pytest.fixture
async def env(make_settings, dsn, clock, local_embedder, edge_index):
    async with open_env(default_settings(make_settings), dsn, clock, embedder=local_embedder, index=edge_index) as e:
        yield e


def call(env, name: str, arguments: dict | str | None = None, *, role: str = "swe", **kw):  # type: ignore[no-untyped-def]
    text = arguments if isinstance(arguments, str) else json.dumps(arguments or {})
    kw.setdefault("company", "acme")
    kw.setdefault("seat", "ana")
    kw.setdefault("turn_id", "run-1")
    return env.builtins.CallTool(pb.CallToolRequest(name=name, arguments_json=text, role=role, **kw))


async def test_every_tool_listtools_offers_is_a_builtin_rpc_whose_request_has_each_parameter(env):
    tools = (await env.prefetch.ListTools(pb.ListToolsRequest(company="acme", role="swe"))).tools
    assert {t.name for t in tools} >= {"refresh_memory", "reflect_and_persist", "search_knowledge", "refine_skill"}
    for tool in tools:
        method = method_of(tool.name)
        assert method is not None, tool.name
        fields = message_factory.GetMessageClass(method.input_type).DESCRIPTOR.fields_by_name
        for parameter in json.loads(tool.parameters_json)["properties"]:
            assert parameter in fields, (tool.name, parameter)
        assert "company" in fields and "seat" in fields, tool.name
        assert not set(json.loads(tool.parameters_json)["properties"]) & set(TOOL_CONTEXT_FIELDS), tool.name


async def test_a_note_written_through_calltool_is_found_by_refresh_memory_through_calltool(env):
    wrote = await call(env, "reflect_and_persist", {"content": "Dana approves prod deploys in #releases."})
    assert wrote.result_type == "agentlearn.prefetch.v1.ReflectAndPersistResponse"
    note_id = json.loads(wrote.result_json)["note_id"]
    assert "Saved to your diary as a durable fact" in wrote.text
    stored = await env.diary.GetNote(diary_pb.GetNoteRequest(company="acme", seat="ana", note_id=note_id))
    assert stored.note.turn_id == "run-1" and stored.note.source == diary_pb.NOTE_SOURCE_REFLECT_AND_PERSIST

    found = await call(env, "refresh_memory", {"context_hint": "who approves prod deploys"}, senders=[BOB])
    answer = json.loads(found.result_json)
    assert answer["note_ids"] == [note_id] and answer["refreshes_spent"] == 1
    assert "Dana approves prod deploys in #releases." in found.text


async def test_refresh_memory_through_calltool_is_told_a_sender_named_by_handle_alone(env):
    # As at turn start: a handle alone names a party to the task, and a note about them bears on it.
    note_id = await env.note("Dana gets anxious about production incidents; reassure her first.")
    hint = {"context_hint": "The release train is late again"}
    named = await call(env, "refresh_memory", hint, senders=[pb.Counterparty(handle="dana")])
    assert json.loads(named.result_json)["note_ids"] == [note_id] and "Dana gets anxious" in named.text
    unnamed = await call(env, "refresh_memory", hint, turn_id="run-2")
    assert json.loads(unnamed.result_json).get("note_ids", []) == [] and "Dana" not in unnamed.text


async def test_the_other_tools_run_through_calltool_with_real_answers(env):
    await env.turn("Task assigned: flaky test", "Fix the flaky checkout test", "Stabilised the fixture.")
    episodes = await call(env, "query_episodes", {"query": "flaky checkout test", "limit": 3})
    assert "Fix the flaky checkout test" in episodes.text and len(json.loads(episodes.result_json)["episode_ids"]) == 1

    skill = await env.skill("billing-digest", "Export billing and post the digest")
    used = await call(env, "use_skill", {"name": "billing-digest"})
    assert used.text == skill.body and json.loads(used.result_json)["skill_id"] == skill.id
    refined = await call(env, "refine_skill", {"skill_name": "billing-digest", "content": "# v2\n", "reason": "r"})
    assert json.loads(refined.result_json)["version"] == 2
    assert (await call(env, "use_skill", {"name": "billing-digest"})).text == "# v2\n"

    page = await env.page("eng", "Billing export runbook", "How to run the weekly billing export.")
    searched = await call(env, "search_knowledge", {"query": "billing export runbook"})
    result = json.loads(searched.result_json)
    assert result["status"] == "SEARCH_STATUS_SEARCHED" and result["hits"][0]["page_id"] == page.id

    onboarded = await call(env, "mark_onboarded", unit_chain=["platform", "engineering"])
    assert json.loads(onboarded.result_json)["chain_hash"] == chain_hash(["platform", "engineering"])
    assert "platform › engineering" in onboarded.text


async def test_bad_arguments_are_invalid_argument_naming_every_argument_at_once(env):
    code, info, bad = await refused(
        call(env, "reflect_and_persist", {"tier": "forever", "ttl_days": "five", "mood": "great"})
    )
    assert code.name == "INVALID_ARGUMENT" and info.reason == "TOOL_ARGUMENTS_INVALID"
    assert info.domain == "prefetch.agentlearn.dev" and info.metadata["tool"] == "reflect_and_persist"
    described = {v.field: v.description for v in bad.field_violations}
    assert set(described) == {
        "arguments_json.content",
        "arguments_json.tier",
        "arguments_json.ttl_days",
        "arguments_json.mood",
    }
    assert described["arguments_json.content"] == "content is required"
    assert described["arguments_json.tier"] == 'tier must be one of long, short, got "forever"'
    assert described["arguments_json.ttl_days"] == "ttl_days must be an integer, got a string"
    assert "mood is not a parameter of reflect_and_persist" in described["arguments_json.mood"]

    _, info, bad = await refused(call(env, "refresh_memory", {"context_hint": "x", "limit": 500}))
    assert [(v.field, v.description) for v in bad.field_violations] == [
        ("arguments_json.limit", "limit must be at most 50, got 500")
    ]
    # A note's length alone is the diary's to refuse, as the typed call's is (NOTE_TOO_LONG).
    _, info, bad = await refused(call(env, "reflect_and_persist", {"content": "x" * 2001}))
    assert info.reason == "NOTE_TOO_LONG" and bad.field_violations[0].field == "arguments_json.content"
    assert bad.field_violations[0].description == "content is 2001 characters; a note holds at most 2000"


async def test_arguments_that_are_not_a_json_object_name_arguments_json(env):
    _, info, bad = await refused(call(env, "refresh_memory", "{context_hint: nope"))
    assert info.reason == "ARGUMENTS_NOT_JSON" and bad.field_violations[0].field == "arguments_json"
    _, info, bad = await refused(call(env, "refresh_memory", '["billing"]'))
    assert info.reason == "ARGUMENTS_NOT_OBJECT" and "got an array" in bad.field_violations[0].description


async def test_every_bad_envelope_field_is_named_at_once(env):
    code, _, bad = await refused(
        env.builtins.CallTool(pb.CallToolRequest(name="", company="", seat="bad seat!", turn_id="t" * 201))
    )
    assert code.name == "INVALID_ARGUMENT"
    assert [v.field for v in bad.field_violations] == ["name", "company", "seat", "role", "turn_id"]


async def test_an_unknown_tool_and_a_withdrawn_one_are_not_found(make_settings, dsn, clock, local_embedder, edge_index):
    settings = default_settings(make_settings, learning={"skill_refinement": {"enabled": False}})
    async with open_env(settings, dsn, clock, embedder=local_embedder, index=edge_index) as env:
        code, info, _ = await refused(call(env, "delete_everything", {}))
        assert code.name == "NOT_FOUND" and info.reason == "TOOL_NOT_FOUND"
        assert info.metadata["tool"] == "delete_everything" and "refresh_memory" in info.metadata["tools"]
        code, info, _ = await refused(call(env, "refine_skill", {"skill_name": "x", "content": "y"}))
        assert code.name == "NOT_FOUND" and info.reason == "TOOL_NOT_OFFERED"
        assert "refine_skill" not in info.metadata["tools"].split(",")
        code, info, _ = await refused(call(env, "search_knowledge", {"query": "billing"}, role="intern"))
        assert code.name == "NOT_FOUND" and info.reason == "TOOL_NOT_OFFERED" and info.metadata["role"] == "intern"
        code, info, _ = await refused(call(env, "call_tool", {}))
        assert info.reason == "TOOL_NOT_FOUND"


async def test_a_refusal_for_an_unknown_tool_lists_every_tool_the_role_has_whole(env):
    """The role's tool names are ~125 bytes together: the refusal's 96-byte metadata cut dropped
    use_skill and ended the list in a name that is no tool ("u...")."""
    tools = (await env.prefetch.ListTools(pb.ListToolsRequest(company="acme", role="swe"))).tools
    _, info, _ = await refused(call(env, "delete_everything", {}))
    assert info.reason == "TOOL_NOT_FOUND"
    assert info.metadata["tools"].split(",") == sorted(t.name for t in tools)


async def test_a_typed_refusal_keeps_its_reason_and_names_the_argument(env):
    code, info, bad = await refused(call(env, "reflect_and_persist", {"content": "Sprint freeze.", "tier": "short"}))
    assert code.name == "INVALID_ARGUMENT" and info.domain == "diary.agentlearn.dev"
    assert bad.field_violations[0].field == "arguments_json.ttl_days"
    assert info.metadata["field"] == "arguments_json.ttl_days"
    code, info, _ = await refused(call(env, "use_skill", {"name": "nope"}))
    assert code.name == "NOT_FOUND" and info.reason == "SKILL_NOT_FOUND"


async def test_request_id_makes_a_retried_write_store_one_note(env):
    arguments = {"content": "Bob prefers weekly digests.", "tier": "short", "ttl_days": 5}
    first = await call(env, "reflect_and_persist", arguments, request_id="call-7")
    retry = await call(env, "reflect_and_persist", arguments, request_id="call-7")
    assert json.loads(first.result_json)["note_id"] == json.loads(retry.result_json)["note_id"]
    assert first.text == retry.text
    other = await call(env, "reflect_and_persist", arguments, request_id="call-8")
    assert json.loads(other.result_json)["note_id"] != json.loads(first.result_json)["note_id"]
    notes = await env.diary.ListNotes(diary_pb.ListNotesRequest(company="acme", seat="ana"))
    assert len(notes.notes) == 2


async def test_a_retried_write_whose_note_was_deleted_since_says_it_saved_nothing(env):
    """The diary's key outlives its note: a retry after the note was deleted writes nothing, and the
    model is told so rather than "saved"."""
    arguments = {"content": "Bob prefers weekly digests."}
    first = await call(env, "reflect_and_persist", arguments, request_id="call-9")
    note_id = json.loads(first.result_json)["note_id"]
    await env.diary.DeleteNote(diary_pb.DeleteNoteRequest(company="acme", seat="ana", note_id=note_id))
    retry = await call(env, "reflect_and_persist", arguments, request_id="call-9")
    assert "Not saved" in retry.text and "was deleted" in retry.text
    assert json.loads(retry.result_json).get("note_id", "") == ""
    notes = await env.diary.ListNotes(diary_pb.ListNotesRequest(company="acme", seat="ana"))
    assert list(notes.notes) == []


async def test_a_writing_tool_needs_its_own_scope(make_settings, dsn, clock, local_embedder, edge_index):
    settings = default_settings(make_settings)
    async with open_app(
        settings, dsn, names=SERVICES, clock=clock, embedder=local_embedder, index=edge_index, auth_mode="tokens"
    ) as app:
        reader, _ = await app.infra.tokens.issue("acme", ["memory:read"], seat="ana")
        writer, _ = await app.infra.tokens.issue("acme", ["memory:read", "memory:write"], seat="ana")
        stub = pb_grpc.BuiltinServiceStub(app.channel)

        def tool(token: str, name: str, arguments: dict, seat: str = "ana"):  # type: ignore[no-untyped-def]
            return stub.CallTool(
                pb.CallToolRequest(
                    name=name, arguments_json=json.dumps(arguments), company="acme", seat=seat, role="swe", turn_id="r"
                ),
                metadata=(("authorization", f"Bearer {token}"),),
            )

        code, info, _ = await refused(tool(reader, "reflect_and_persist", {"content": "Dana approves deploys."}))
        assert code.name == "PERMISSION_DENIED" and info.reason == "SCOPE_MISSING"
        assert info.metadata["scope"] == "memory:write" and info.metadata["tool"] == "reflect_and_persist"
        read = await tool(reader, "refresh_memory", {"context_hint": "deploys"})
        assert json.loads(read.result_json)["note_ids"] == []  # the refused write stored nothing
        wrote = await tool(writer, "reflect_and_persist", {"content": "Dana approves deploys."})
        assert json.loads(wrote.result_json)["note_id"]
        code, info, _ = await refused(tool(writer, "refresh_memory", {"context_hint": "deploys"}, seat="bo"))
        assert code.name == "PERMISSION_DENIED" and info.reason == "CREDENTIAL_SCOPE_MISMATCH"


async def test_a_typed_request_that_breaks_its_contract_is_refused_before_the_tool_runs(env):
    """The typed request built from the arguments is checked against its own contract, as the edge
    checks every request: a NUL in the hint reached Postgres (INTERNAL) after the turn's refresh was
    already counted; a NUL in a search query came back OK with the knowledge service's refusal in
    words."""
    await env.note("Dana approves prod deploys in #releases.")
    for tool, argument in (("refresh_memory", "context_hint"), ("search_knowledge", "query")):
        code, info, bad = await refused(call(env, tool, {argument: "prod deploys\u0000x"}))
        assert code.name == "INVALID_ARGUMENT" and info.reason == "FIELD_INVALID"
        assert [v.field for v in bad.field_violations] == [f"arguments_json.{argument}"]
    # No refresh was spent on the refused call: the first one that runs is the turn's first.
    found = await call(env, "refresh_memory", {"context_hint": "who approves prod deploys"})
    assert json.loads(found.result_json)["refreshes_spent"] == 1
