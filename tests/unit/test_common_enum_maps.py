"""libs.common.enum_maps.enum_to_pb: a domain enum's proto values by the AIP naming rule."""

from __future__ import annotations

from enum import StrEnum

import pytest

from agentlearn.skills.v1 import skill_service_pb2 as pb
from libs.common.enum_maps import enum_to_pb
from services.skills.domain import SkillState


def test_each_member_maps_to_the_proto_value_of_its_name() -> None:
    assert enum_to_pb(SkillState, pb.SkillState, "SKILL_STATE") == {
        SkillState.ACTIVE: pb.SKILL_STATE_ACTIVE,
        SkillState.STALE: pb.SKILL_STATE_STALE,
        SkillState.ARCHIVED: pb.SKILL_STATE_ARCHIVED,
    }


def test_a_subset_of_members_maps_only_those() -> None:
    assert enum_to_pb([SkillState.STALE], pb.SkillState, "SKILL_STATE") == {SkillState.STALE: pb.SKILL_STATE_STALE}


def test_a_member_the_proto_lacks_fails_when_the_table_is_built() -> None:
    class Wider(StrEnum):
        ACTIVE = "active"
        FROZEN = "frozen"

    with pytest.raises(ValueError, match="SKILL_STATE_FROZEN"):
        enum_to_pb(Wider, pb.SkillState, "SKILL_STATE")
