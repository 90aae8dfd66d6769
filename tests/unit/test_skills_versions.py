"""Versions, rollback, pin, archive and restore on the in-memory store: whole-body refinement keeps
the prior body, a rollback is a forward step, an idempotency key makes a retry a no-op, operator
edits are announced once. No Postgres, no model, no gRPC."""

from __future__ import annotations

import pytest

from agentlearn.common.v1.erasure_pb2 import ErasureSubject
from agentlearn.common.v1.provenance_pb2 import Provenance
from libs.common.config import SkillRefinementConfig, SkillSynthesisConfig
from libs.common.errors import FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted
from services.skills.domain import SkillChange, SkillState
from tests.unit.fakes.skills import make


async def test_a_refinement_keeps_the_prior_body_as_a_version():
    s = make()
    await s.create("open-pr", body="A\n")
    refined = await s.service.refine(s.key(), "B\n", "clearer", "run-2")
    assert (refined.body, refined.version, refined.change, refined.change_reason) == (
        "B\n", 2, SkillChange.REFINED, "clearer")  # fmt: skip
    versions, token, total = await s.service.list_versions(s.key(), 0, "")
    assert [(v.version, v.body, v.current) for v in versions] == [(2, "B\n", True), (1, "A\n", False)]
    assert total == 2 and token == ""
    assert versions[1].supersede_time == s.clock.now()


async def test_the_body_cap_and_the_switch_are_config():
    s = make(refinement=SkillRefinementConfig(max_body_chars=10))
    await s.create("open-pr", body="A\n")
    with pytest.raises(InvalidArgument) as err:
        await s.service.refine(s.key(), "x" * 11, "", None)
    assert err.value.reason == "SKILL_BODY_TOO_LONG"
    off = make(refinement=SkillRefinementConfig(enabled=False))
    await off.create("open-pr")
    with pytest.raises(FailedPrecondition) as disabled:
        await off.service.refine(off.key(), "B\n", "", None)
    assert disabled.value.reason == "REFINEMENT_DISABLED"


async def test_only_the_kept_versions_remain_and_a_dropped_one_cannot_be_rolled_back_to():
    s = make(refinement=SkillRefinementConfig(max_versions_kept=2))
    await s.create("open-pr", body="v1\n")
    for i in range(2, 6):
        await s.service.refine(s.key(), f"v{i}\n", "", None)
    versions, _, total = await s.service.list_versions(s.key(), 0, "")
    assert [v.version for v in versions] == [5, 4, 3] and total == 3
    with pytest.raises(NotFound) as gone:
        await s.service.rollback(s.key(), 1)
    assert gone.value.reason == "SKILL_VERSION_NOT_FOUND"


async def test_a_rollback_is_a_forward_step_and_its_retry_writes_nothing():
    s = make()
    await s.create("open-pr", body="A\n")
    await s.service.refine(s.key(), "B\n", "", None)
    rolled = await s.service.rollback(s.key(), 1, request_id="rb-1")
    assert (rolled.body, rolled.version, rolled.restored_from_version) == ("A\n", 3, 1)
    again = await s.service.rollback(s.key(), 1, request_id="rb-1")
    assert again.version == 3
    with pytest.raises(FailedPrecondition) as current:
        await s.service.rollback(s.key(), 3)
    assert current.value.reason == "SKILL_VERSION_CURRENT"
    assert s.events.kinds().count("skill_refined") == 2


async def test_a_refinement_retry_with_its_key_is_not_a_second_version():
    s = make()
    await s.create("open-pr")
    first = await s.service.refine(s.key(), "B\n", "", None, request_id="r-1")
    second = await s.service.refine(s.key(), "B\n", "", None, request_id="r-1")
    assert first.version == second.version == 2 and second.body == "B\n"
    # The key reused for another body is another request: refused, not answered as applied.
    with pytest.raises(FailedPrecondition) as err:
        await s.service.refine(s.key(), "C\n", "", None, request_id="r-1")
    assert err.value.reason == "REQUEST_ID_REUSED" and err.value.metadata["field"] == "request_id"
    assert (await s.service.get(s.key())).body == "B\n"


async def test_an_archived_skill_is_not_refined_until_restored():
    s = make()
    await s.create("open-pr")
    archived = await s.service.archive(s.key())
    assert archived.state is SkillState.ARCHIVED
    assert (await s.service.archive(s.key())).state is SkillState.ARCHIVED  # idempotent
    with pytest.raises(FailedPrecondition) as err:
        await s.service.refine(s.key(), "B\n", "", None)
    assert err.value.reason == "SKILL_ARCHIVED"
    s.clock.advance(days=1)
    restored = await s.service.restore(s.key())
    assert restored.state is SkillState.ACTIVE and restored.unused_since == s.clock.now()
    assert s.events.kinds().count("skill_archived") == 1 and s.events.kinds().count("skill_restored") == 1


async def test_a_restore_respects_the_cap():
    s = make(synthesis=SkillSynthesisConfig(max_skills_per_agent=1))
    await s.create("open-pr")
    await s.service.archive(s.key())
    await s.create("triage", tools=["jira_search"])
    with pytest.raises(ResourceExhausted) as err:
        await s.service.restore(s.key())
    assert err.value.reason == "SKILL_CATALOGUE_FULL"


async def test_pin_and_unpin_are_announced_once_each():
    s = make()
    await s.create("open-pr")
    assert (await s.service.set_pinned(s.key(), True)).pinned
    assert (await s.service.set_pinned(s.key(), True)).pinned
    assert not (await s.service.set_pinned(s.key(), False)).pinned
    assert s.events.kinds().count("skill_pinned") == 1 and s.events.kinds().count("skill_unpinned") == 1


async def test_a_rollback_carries_the_restored_versions_provenance():
    s = make()
    skill = await s.create("open-pr", body="A\n")
    assert list(s.store.rows[skill.id].version_provenance.turn_ids) == ["run-open-pr"]
    await s.service.refine(s.key(), "B\n", "", "run-2", provenance=Provenance(subjects=[ErasureSubject(handle="dave")]))
    row = s.store.rows[skill.id]
    assert (list(row.version_provenance.turn_ids), row.version_provenance.writer) == (["run-2"], "refine_skill")
    await s.service.rollback(s.key(), 1)
    assert list(row.version_provenance.turn_ids) == ["run-open-pr"]
    assert row.version_provenance.writer == "synthesis:single"
