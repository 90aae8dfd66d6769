"""A note too long for the diary is refused through CallTool as through the typed
ReflectAndPersist: NOTE_TOO_LONG with the diary's limit and the note's length, the field where the
caller wrote it (arguments_json.content); it was TOOL_ARGUMENTS_INVALID, a reason docs/integrating.md
does not name for it. Real services over gRPC."""

from __future__ import annotations

import json

import grpc
import pytest

from agentlearn.prefetch.v1 import prefetch_service_pb2 as pb
from tests.test_prefetch_support import default_settings, open_env, refused

TOO_LONG = "x " * 1001  # 2,002 characters; a note holds at most 2,000 by default


@pytest.fixture
async def env(make_settings, dsn, clock, local_embedder, edge_index):
    async with open_env(default_settings(make_settings), dsn, clock, embedder=local_embedder, index=edge_index) as e:
        yield e


def reflect(env, arguments: dict):  # type: ignore[no-untyped-def]
    return env.builtins.CallTool(
        pb.CallToolRequest(
            name="reflect_and_persist",
            arguments_json=json.dumps(arguments),
            role="swe",
            company="acme",
            seat="ana",
            turn_id="run-1",
            request_id="c-long",
        )
    )


async def test_a_note_too_long_is_note_too_long_through_calltool_as_through_the_typed_rpc(env):
    code, info, bad = await refused(reflect(env, {"content": TOO_LONG}))
    typed = await refused(
        env.builtins.ReflectAndPersist(pb.ReflectAndPersistRequest(company="acme", seat="ana", content=TOO_LONG))
    )
    assert code == typed[0] == grpc.StatusCode.INVALID_ARGUMENT
    assert info.reason == typed[1].reason == "NOTE_TOO_LONG" and info.domain == typed[1].domain
    assert (info.metadata["limit"], info.metadata["length"]) == ("2000", "2002")
    assert info.metadata["field"] == "arguments_json.content"
    assert [v.field for v in bad.field_violations] == ["arguments_json.content"]
    # With another argument wrong too, every violation is still named at once by the schema.
    code, info, bad = await refused(reflect(env, {"content": TOO_LONG, "tier": 7}))
    assert info.reason == "TOOL_ARGUMENTS_INVALID"
    assert {v.field for v in bad.field_violations} == {"arguments_json.content", "arguments_json.tier"}
