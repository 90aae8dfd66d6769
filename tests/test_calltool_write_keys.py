"""The writing builtins' idempotency keys through CallTool: two different skills distilled in one
run are two proposals whatever the run id's length (the key was cut at 200 characters, so a long
run id made the second share the first's key and be answered the first's proposal), and a retry
of one is still "already proposed". Real services over gRPC."""

from __future__ import annotations

import json

import pytest

from agentlearn.prefetch.v1 import prefetch_service_pb2 as pb
from agentlearn.skills.v1 import skill_service_pb2 as skill_pb
from tests.test_prefetch_support import default_settings, open_env

LONG_RUN = "r" * 200  # a run id at its bound (CallToolRequest.turn_id, at most 200)


@pytest.fixture
async def env(make_settings, dsn, clock, local_embedder, edge_index):
    async with open_env(default_settings(make_settings), dsn, clock, embedder=local_embedder, index=edge_index) as e:
        yield e


def call(env, name: str, arguments: dict, **kw):  # type: ignore[no-untyped-def]
    kw.setdefault("company", "acme")
    kw.setdefault("seat", "ana")
    kw.setdefault("turn_id", "run-1")
    return env.builtins.CallTool(pb.CallToolRequest(name=name, arguments_json=json.dumps(arguments), role="swe", **kw))


BILLING = {
    "name": "alpha-billing-export",
    "summary": "Export the weekly billing report",
    "body": "1. run billing.export\n2. post the digest",
    "tool_sequence": ["billing.export", "slack.post"],
}
ACCESS = {
    "name": "access-review-rotation",
    "summary": "Rotate on-call access reviews quarterly",
    "body": "1. list the grants\n2. revoke the stale ones",
    "tool_sequence": ["iam.list", "iam.revoke"],
}


async def test_two_skills_distilled_in_one_long_run_are_two_proposals(env):
    first = await call(env, "distill_skill", BILLING, turn_id=LONG_RUN)
    second = await call(env, "distill_skill", ACCESS, turn_id=LONG_RUN)
    a, b = json.loads(first.result_json), json.loads(second.result_json)
    assert a["disposition"] == "created" and b["disposition"] == "created", second.text
    assert a["proposal_id"] != b["proposal_id"]
    listed = await env.skills.ListSkillProposals(skill_pb.ListSkillProposalsRequest(company="acme", seat="ana"))
    assert sorted(p.name for p in listed.proposals) == ["access-review-rotation", "alpha-billing-export"]
    assert {p.source.turn_id for p in listed.proposals} == {LONG_RUN}

    # A retry of the first (the same run and name) files nothing and names the first proposal.
    again = await call(env, "distill_skill", BILLING, turn_id=LONG_RUN)
    assert json.loads(again.result_json)["disposition"] == "already_proposed"
    assert json.loads(again.result_json)["proposal_id"] == a["proposal_id"]
