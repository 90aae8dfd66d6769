"""The writing builtins' idempotency keys through CallTool: two different skills distilled in one
run are two proposals whatever the run id's length (the key was cut at 200 characters, so a long
run id made the second share the first's key and be answered the first's proposal), and a retry
of one is still "already proposed"; a skill refinement's (and rollback's) key reused for another
request is refused, not answered as applied while the first body stays. Real services over gRPC."""

from __future__ import annotations

import json

import grpc
import pytest

from agentlearn.prefetch.v1 import prefetch_service_pb2 as pb
from agentlearn.skills.v1 import skill_service_pb2 as skill_pb
from tests.test_prefetch_support import default_settings, open_env, refused

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


async def test_refine_skill_reusing_a_key_for_another_body_is_refused_and_the_first_body_stays(env):
    await env.skill("billing-digest", "Export billing and post the digest")
    first = await call(env, "refine_skill", {"skill_name": "billing-digest", "content": "# body A\n"}, request_id="c-0")
    assert "version 2" in first.text
    retry = await call(env, "refine_skill", {"skill_name": "billing-digest", "content": "# body A\n"}, request_id="c-0")
    assert "version 2" in retry.text  # a retry: the same request, nothing written again

    code, info, _ = await refused(
        call(env, "refine_skill", {"skill_name": "billing-digest", "content": "# body B\n"}, request_id="c-0")
    )
    assert code == grpc.StatusCode.FAILED_PRECONDITION and info.reason == "REQUEST_ID_REUSED"
    assert info.metadata["field"] == "request_id" and info.metadata["version"] == "2"
    got = await env.skills.GetSkill(skill_pb.GetSkillRequest(company="acme", seat="ana", skill_name="billing-digest"))
    assert got.skill.body == "# body A\n" and got.skill.version == 2


async def test_a_rollback_key_reused_for_another_version_is_refused(env):
    await env.skill("billing-digest", "Export billing and post the digest")
    for i, body in enumerate(["# two\n", "# three\n"]):
        await call(env, "refine_skill", {"skill_name": "billing-digest", "content": body}, request_id=f"r-{i}")

    def rollback(version: int):  # type: ignore[no-untyped-def]
        return env.skills.RollbackSkill(
            skill_pb.RollbackSkillRequest(
                company="acme", seat="ana", skill_name="billing-digest", version=version, request_id="rb-1"
            )
        )

    rolled = await rollback(1)
    assert (await rollback(1)).skill.version == rolled.skill.version == 4  # a retry writes nothing
    code, info, _ = await refused(rollback(2))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and info.reason == "REQUEST_ID_REUSED"
    got = await env.skills.GetSkill(skill_pb.GetSkillRequest(company="acme", seat="ana", skill_name="billing-digest"))
    assert got.skill.version == 4 and got.skill.body == rolled.skill.body
