"""The profiles' erasure rule for another person's profile (unit tier, issue 13): an entry goes when
it names the erased person, or when only observations resting on them stated it; an entry another
observation also stated stays. Plain mappings stand for the rows."""

from __future__ import annotations

import uuid

from libs.common.erasure import Kind, Target
from services.profiles.erasure import remaining_entries

CARLA = Target(erasure_id=uuid.uuid4(), company="acme", kind=Kind.SUBJECT, handle="carla", names=("Carla Moreno",))


def _obs(style: str = "", decisions=(), cares=(), topics=()) -> dict[str, object]:  # type: ignore[no-untyped-def]
    return {
        "communication_style": style,
        "past_decisions": list(decisions),
        "sensitivities": list(cares),
        "topics": list(topics),
    }


def test_entries_only_her_observations_stated_go_and_shared_ones_stay() -> None:
    profile = _obs("Terse.", ["Chose Postgres"], ["No calls"], ["zeppelin", "airships", "backups"])
    theirs = [_obs("Terse.", ["Chose Postgres"], ["No calls"], ["ZEPPELIN ", "airships"])]
    his = [_obs("", [], [], ["zeppelin", "backups"])]
    left = remaining_entries(profile, CARLA, theirs, his)
    assert left == {
        "communication_style": "",
        "past_decisions": [],
        "sensitivities": [],
        "topics": ["zeppelin", "backups"],
    }


def test_an_entry_naming_her_goes_even_when_no_observation_rests_on_her() -> None:
    profile = _obs("Polite.", ["Asked carla for the numbers"], [], ["billing", "carla moreno's budget"])
    left = remaining_entries(profile, CARLA, [], [])
    assert left == {"communication_style": "Polite.", "past_decisions": [], "sensitivities": [], "topics": ["billing"]}


def test_entries_merged_before_observations_were_recorded_stay_unless_they_name_her() -> None:
    # No observation stated "legacy" (it predates profile_observations): nothing ties it to her.
    profile = _obs("", [], [], ["legacy", "airships"])
    left = remaining_entries(profile, CARLA, [_obs(topics=["airships"])], [])
    assert left["topics"] == ["legacy"]
