"""The refiner's offline rule writes a bullet the skill service takes (AppendSkillObservation's
observation is at most 1,000 characters): a long label or many unnamed tools used to push it over,
and the auto path then left the lesson out whole."""

from __future__ import annotations

import json

from agentlearn.skills.v1 import skill_service_pb2 as sk_pb
from libs.common.contract import string_max_len
from services.reflector.workers.refiner import offline_rule

_LIMIT = string_max_len(sk_pb.AppendSkillObservationRequest, "observation")
_SKILL = {"name": "deploy", "tool_sequence": ["build", "push"]}


def test_a_failed_turn_with_the_longest_label_gives_a_bullet_within_the_bound() -> None:
    label = "Message from Carla about the release " + "word " * 200  # the label's own 1,000
    answer = json.loads(
        offline_rule(
            {
                "tools_called": ["build", "push"],
                "skills": [_SKILL],
                "outcome": "failed",
                "label": label[:1000],
                "what_it_did": "x" * 5000,
            }
        )
    )
    assert answer["skill"] == "deploy"
    assert len(answer["observation"]) <= _LIMIT
    assert answer["observation"].startswith("Message from Carla about the release")
    assert " …" in answer["observation"]


def test_a_success_with_many_extra_tools_names_some_and_counts_the_rest() -> None:
    extra = [f"tool_{i:03d}_with_a_rather_long_descriptive_name" for i in range(200)]
    answer = json.loads(
        offline_rule(
            {
                "tools_called": ["build", *extra],
                "skills": [_SKILL],
                "outcome": "done",
                "label": "L" * 1000,
            }
        )
    )
    observation = answer["observation"]
    assert len(observation) <= _LIMIT
    assert observation.startswith("also needed tool_000")
    assert "more when woken by" in observation


def test_a_short_turn_reads_as_before() -> None:
    answer = json.loads(
        offline_rule(
            {"tools_called": ["build", "lint"], "skills": [_SKILL], "outcome": "done", "label": "Message from Bob"}
        )
    )
    assert answer["observation"] == "also needed lint when woken by Message from Bob"
