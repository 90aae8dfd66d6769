"""CallTool's own envelope checks answer as every collecting RPC does (docs/integrating.md,
"Errors"): several bad fields give the first one's reason and facts with metadata.violations,
fields and reasons, as the edge's contract refusal of the same request would; one bad field keeps
its own facts (field, limit, length). They answered FIELD_INVALID with only metadata.fields when
several, and a lone bad field lost metadata.field. Real gRPC on real Postgres, behind the edge."""

from __future__ import annotations

from collections.abc import Awaitable

import grpc
import pytest
from google.rpc.error_details_pb2 import BadRequest, ErrorInfo

from agentlearn.prefetch.v1 import prefetch_service_pb2 as pb
from tests.support.grpc_errors import error_info
from tests.test_prefetch_support import default_settings, open_env


@pytest.fixture
async def env(make_settings, dsn, clock, edge_index):  # type: ignore[no-untyped-def]
    settings = default_settings(make_settings)  # type: ignore[no-untyped-call]
    async with open_env(settings, dsn, clock, embedder=None, index=edge_index) as e:
        yield e


async def _refused(call: Awaitable[object]) -> tuple[grpc.StatusCode, str, ErrorInfo, BadRequest]:
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await call
    code, info, bad = error_info(exc.value)
    return code, exc.value.details() or "", info, bad


def _call(env, *, name: str = "refresh_memory", role: str = "swe") -> Awaitable[object]:  # type: ignore[no-untyped-def]
    request = pb.CallToolRequest(name=name, arguments_json="{}", company="acme", seat="ana", role=role, turn_id="run-1")
    return env.builtins.CallTool(request)  # type: ignore[no-any-return]


async def test_several_bad_envelope_fields_answer_as_the_other_collecting_rpcs(env):  # type: ignore[no-untyped-def]
    # Both pass the edge (a name up to 256 characters, a role that is not empty) and meet the
    # service's own checks (a name of at most 200, a role that is not white space).
    code, message, info, bad = await _refused(_call(env, name="x" * 250, role="  "))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and info.domain == "prefetch.agentlearn.dev"
    assert [v.field for v in bad.field_violations] == ["name", "role"]
    assert info.reason == "FIELD_TOO_LONG" and info.metadata["field"] == "name"
    assert (info.metadata["violations"], info.metadata["fields"]) == ("2", "name,role")
    assert info.metadata["reasons"] == "FIELD_TOO_LONG,FIELD_REQUIRED"
    assert (info.metadata["limit"], info.metadata["length"]) == ("200", "250")
    assert bad.field_violations[1].description == "FIELD_REQUIRED: role is required"
    assert message == "2 violations: name is 250 characters; the limit is 200; role is required"


async def test_one_bad_envelope_field_keeps_its_own_facts(env):  # type: ignore[no-untyped-def]
    code, message, info, bad = await _refused(_call(env, role="  "))
    assert (code, info.reason, message) == (grpc.StatusCode.INVALID_ARGUMENT, "FIELD_REQUIRED", "role is required")
    assert dict(info.metadata) == {"field": "role"}
    assert [(v.field, v.description) for v in bad.field_violations] == [("role", message)]

    code, message, info, bad = await _refused(_call(env, name="x" * 250))
    assert (code, info.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "FIELD_TOO_LONG")
    assert message == "name is 250 characters; the limit is 200"
    assert dict(info.metadata) == {"field": "name", "limit": "200", "length": "250"}
