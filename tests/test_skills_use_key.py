"""``use_skill`` counts one use per resolution (spec: `skill_used` "One per use_skill(name)
resolution"; `use_count` bumped "after a successful resolution"): a CallTool the engine retries
with its key (UNAVAILABLE, DEADLINE_EXCEEDED) is the same resolution, and used to be counted twice.
UseSkill takes the key (``request_id``) and records it with the use, in one statement. Real
services over gRPC on the embedded PostgreSQL."""

from __future__ import annotations

import json

import pytest

from agentlearn.prefetch.v1 import prefetch_service_pb2 as pb
from agentlearn.skills.v1 import skill_service_pb2 as skill_pb
from libs.common.events import read_events
from tests.test_prefetch_support import counting_env


@pytest.fixture
async def env(make_settings, dsn, clock, local_embedder, edge_index):
    async with counting_env(make_settings, dsn, clock, local_embedder, edge_index) as e:
        yield e


def use_skill(name: str, request_id: str, turn_id: str = "run-1") -> pb.CallToolRequest:
    return pb.CallToolRequest(
        name="use_skill",
        arguments_json=json.dumps({"name": name}),
        company="acme",
        seat="ana",
        role="swe",
        turn_id=turn_id,
        request_id=request_id,
    )


async def uses(env, skill_id: str) -> int:  # type: ignore[no-untyped-def]
    got = await env.skills.GetSkill(skill_pb.GetSkillRequest(company="acme", seat="ana", skill_id=skill_id))
    return int(got.skill.use_count)


async def test_a_retried_use_skill_call_counts_one_use_and_one_event(env):
    skill = await env.skill("billing-digest", "Export billing and post the weekly digest")
    first = await env.builtins.CallTool(use_skill("billing-digest", "call-1"))
    again = await env.builtins.CallTool(use_skill("billing-digest", "call-1"))  # the engine's retry
    assert first.text == again.text == skill.body  # the retry still answers the body
    assert await uses(env, skill.id) == 1
    assert len(await read_events(env.app.infra.pool, "skill_used")) == 1

    await env.builtins.CallTool(use_skill("billing-digest", "call-2"))  # another call: another use
    await env.builtins.CallTool(use_skill("billing-digest", "call-1", turn_id="run-2"))  # another run's
    assert await uses(env, skill.id) == 3
    assert len(await read_events(env.app.infra.pool, "skill_used")) == 3


async def test_useskill_with_a_key_used_before_answers_the_body_and_says_so(env):
    skill = await env.skill("billing-digest", "Export billing and post the weekly digest")
    request = skill_pb.UseSkillRequest(
        company="acme", seat="ana", skill_name="billing-digest", turn_id="run-1", request_id="k1"
    )
    first = await env.skills.UseSkill(request)
    again = await env.skills.UseSkill(request)
    assert not first.already_applied and again.already_applied
    assert again.skill.body == skill.body and again.skill.use_count == first.skill.use_count == 1
    # Without a key every call is a use, as before.
    keyless = skill_pb.UseSkillRequest(company="acme", seat="ana", skill_name="billing-digest")
    await env.skills.UseSkill(keyless)
    last = await env.skills.UseSkill(keyless)
    assert not last.already_applied and last.skill.use_count == 3
    # The key is kept with the run's (an erasure of the run takes it with them).
    keys = await env.app.infra.pool.fetch("SELECT request_id FROM skill_use_requests ORDER BY request_id")
    assert [k["request_id"][: len("run-1:use_skill:k1:")] for k in keys] == ["run-1:use_skill:k1:"]


async def test_a_key_reused_for_another_skill_is_a_use_of_that_skill(env):
    """A key names one request: the same request id for another skill (an engine forwarding
    provider call ids that restart each response) counts that skill's use. It was answered
    already_applied and never counted, because the key was the run's and the request id's alone."""
    billing = await env.skill("billing-digest", "Export billing and post the weekly digest")
    access = await env.skill("access-review", "Rotate the quarterly access review")
    await env.builtins.CallTool(use_skill("billing-digest", "call_0"))
    other = await env.skills.UseSkill(
        skill_pb.UseSkillRequest(
            company="acme", seat="ana", skill_name="access-review", turn_id="run-1", request_id="call_0"
        )
    )
    assert not other.already_applied and other.skill.body == access.body
    assert await uses(env, access.id) == 1 and await uses(env, billing.id) == 1
    retry = await env.builtins.CallTool(use_skill("access-review", "call_0"))  # still a retry of that call
    assert retry.text == access.body and await uses(env, access.id) == 1
