"""Practice bullets on the in-memory store: an observation is one bullet under the one practice
heading, a new version each; past the body cap or on an archived skill it is skipped and said so;
the knobs switch each kind off. No Postgres, no model, no gRPC."""

from __future__ import annotations

import pytest

from agentlearn.common.v1.erasure_pb2 import ErasureSubject
from agentlearn.common.v1.provenance_pb2 import Provenance
from libs.common.config import SkillRefinementConfig
from libs.common.errors import FailedPrecondition, InvalidArgument
from services.skills.domain import (
    PRACTICE_HEADING,
    ObservationKind,
    ObservationSkip,
    SkillChange,
    append_practice_bullet,
    remove_practice_bullets,
)
from tests.unit.fakes.skills import make


async def test_observations_become_bullets_under_one_heading():
    s = make()
    await s.create("open-pr", body="# open-pr\n\n1. Do it.\n")
    first = await s.service.append_observation(s.key(), ObservationKind.OBSERVED, "check CI\nfirst", "run-2")
    second = await s.service.append_observation(s.key(), ObservationKind.COUNTER_EXAMPLE, "not on forks", "run-3")
    assert first.skipped_reason is None and second.skipped_reason is None
    body = second.skill.body
    assert body.count(PRACTICE_HEADING) == 1 and body.startswith("# open-pr\n\n1. Do it.\n")
    assert body.endswith("- Observed in practice: check CI first\n- Counter-example: not on forks\n")
    assert second.skill.version == 3 and second.skill.change is SkillChange.OBSERVATION_APPENDED
    assert s.events.kinds().count("skill_refined") == 2


async def test_a_redelivered_bullet_is_appended_once():
    s = make()
    await s.create("open-pr")
    await s.service.append_observation(s.key(), ObservationKind.OBSERVED, "x", None, request_id="obs-1")
    again = await s.service.append_observation(s.key(), ObservationKind.OBSERVED, "x", None, request_id="obs-1")
    assert again.skill.version == 2 and again.skill.body.count("- Observed in practice: x") == 1


async def test_past_the_body_cap_or_on_an_archived_skill_the_bullet_is_skipped():
    s = make(refinement=SkillRefinementConfig(max_body_chars=60))
    await s.create("open-pr", body="# open-pr\n")
    capped = await s.service.append_observation(s.key(), ObservationKind.OBSERVED, "y" * 80, None)
    assert capped.skipped_reason is ObservationSkip.BODY_CAP and capped.skill.version == 1
    await s.service.archive(s.key())
    late = await s.service.append_observation(s.key(), ObservationKind.OBSERVED, "short", None)
    assert late.skipped_reason is ObservationSkip.ARCHIVED and late.skill.version == 1
    assert s.events.kinds().count("skill_refinement_skipped") == 2


async def test_a_blank_observation_is_refused_and_the_knobs_switch_kinds_off():
    s = make(refinement=SkillRefinementConfig(auto_refine_on_failure=False))
    await s.create("open-pr")
    with pytest.raises(InvalidArgument) as blank:
        await s.service.append_observation(s.key(), ObservationKind.OBSERVED, "   ", None)
    assert blank.value.reason == "FIELD_REQUIRED" and blank.value.violations[0].field == "observation"
    with pytest.raises(FailedPrecondition) as off:
        await s.service.append_observation(s.key(), ObservationKind.COUNTER_EXAMPLE, "z", None)
    assert off.value.reason == "OBSERVATION_KIND_DISABLED"


async def test_each_bullet_records_where_it_came_from():
    s = make()
    skill = await s.create("open-pr")
    given = Provenance(model="m-1", prompt_version="abc", subjects=[ErasureSubject(handle="carla", platform="slack")])
    await s.service.append_observation(s.key(), ObservationKind.OBSERVED, "x", "run-7", provenance=given)
    await s.service.append_observation(s.key(), ObservationKind.OBSERVED, "y", None)
    [(v1, b1, p1), (v2, b2, p2)] = s.store.rows[skill.id].bullets
    assert (v1, b1, list(p1.turn_ids)) == (2, "- Observed in practice: x", ["run-7"])
    assert (p1.writer, p1.model, p1.prompt_version) == ("refiner", "m-1", "abc")
    assert [x.handle for x in p1.subjects] == ["carla"] and given.writer == ""  # the caller's message is not edited
    assert (v2, b2, list(p2.turn_ids), p2.writer) == (3, "- Observed in practice: y", [], "refiner")


def test_removing_bullets_is_the_inverse_of_appending_them():
    base = "# open-pr\n\n1. Do it.\n"
    one = append_practice_bullet(base, "- Observed in practice: a")
    two = append_practice_bullet(one, "- Counter-example: b")
    assert remove_practice_bullets(two, ["- Counter-example: b"]) == one
    assert remove_practice_bullets(one, ["- Observed in practice: a"]) == base  # the heading goes too
    # One occurrence per removed bullet: another person's identical line stays.
    twice = append_practice_bullet(one, "- Observed in practice: a")
    assert remove_practice_bullets(twice, ["- Observed in practice: a"]) == one
    # A line outside the section is never touched, even when it reads like the bullet.
    odd = "- Observed in practice: a\n\n" + one
    assert remove_practice_bullets(odd, ["- Observed in practice: a"]) == "- Observed in practice: a\n\n" + base
    assert remove_practice_bullets(base, ["- Observed in practice: a"]) == base
