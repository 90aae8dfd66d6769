"""The auto refiner never clips the model's observation: one longer than the skill service takes is
left out whole (spec: "refused, never truncated ... A clip lands mid-step"), the turn's outcome says
so, and the log names its size but not its text. The model is a scripted OpenAI-compatible server;
the skills service runs for real."""

from __future__ import annotations

import json
import logging

import pytest

from agentlearn.reflector.v1 import reflector_service_pb2 as pb
from agentlearn.skills.v1 import skill_service_pb2 as sk_pb
from tests.support.app import open_app
from tests.support.turns import turn
from tests.test_reflector_workers import ALL, Env, scripted

LIMIT = 1000  # AppendSkillObservation's observation max_len


def words(n: int) -> str:
    """An observation of exactly ``n`` characters, words and spaces (what a model writes)."""
    text = " ".join(f"step{i:04d} check the registry quota before pushing" for i in range(n // 10 + 1))
    return text[:n].rstrip() + "x" * (n - len(text[:n].rstrip()))


@pytest.fixture
async def env(make_settings, dsn, clock, local_embedder, edge_index, scripted_openai):  # type: ignore[no-untyped-def]
    """every service, the refiner the only worker, the scripted model as the auxiliary chain"""
    settings = make_settings(learning={"reflection": {"workers": ["refiner"]}}, providers=scripted(scripted_openai))
    async with open_app(settings, dsn, names=ALL, clock=clock, embedder=local_embedder, index=edge_index) as app:
        yield Env(app)


async def failed_turn_refined(env: Env, clock, scripted_openai, observation: str):  # type: ignore[no-untyped-def]
    scripted_openai.chat_handler = lambda body: json.dumps(
        {"noop": False, "skill": "deploy", "observation": observation}
    )
    s = await env.skill("deploy", ["build", "push", "deploy"])
    r = await env.reflect(
        turn(
            "run-1",
            now=clock.now(),
            outcome=pb.TURN_OUTCOME_FAILED,
            tools=["build", "push", "deploy"],
            offered=[(s.id, s.name)],
        )
    )
    got = (await env.skills.GetSkill(sk_pb.GetSkillRequest(company="acme", seat="ana", skill_id=s.id))).skill
    return env.worker(r, "refiner"), got


async def test_an_observation_over_the_bound_is_left_out_whole(env, clock, scripted_openai, caplog):
    observation = words(LIMIT + 1)
    with caplog.at_level(logging.INFO, logger="services.reflector.workers.refiner"):
        w, skill = await failed_turn_refined(env, clock, scripted_openai, observation)
    assert (w.status, w.gate) == (pb.WORKER_STATUS_SKIPPED, "observation_too_long")
    assert f"{LIMIT + 1} characters" in w.detail and observation[:40] not in w.detail
    assert skill.version == 1 and "What practice added" not in skill.body  # no fragment appended
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert f"{LIMIT + 1} characters" in logged and observation[:40] not in logged
    # The prompt states the bound the model is held to.
    [call] = scripted_openai.received("chat")
    assert "at most 1,000 characters" in call["messages"][0]["content"]


async def test_an_observation_at_the_bound_is_appended_whole(env, clock, scripted_openai):
    observation = words(LIMIT)
    w, skill = await failed_turn_refined(env, clock, scripted_openai, observation)
    assert w.status == pb.WORKER_STATUS_WROTE
    assert skill.version == 2 and skill.body.endswith(f"- Counter-example: {observation}\n")
