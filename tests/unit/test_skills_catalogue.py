"""The catalogue's use cases on the in-memory store: the gates, create, use, offers, marked uses,
telemetry failures and health. No Postgres, no model, no gRPC (the integration tier is
tests/test_skills_catalogue.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from libs.common.config import SkillSynthesisConfig
from libs.common.errors import AlreadyExists, InvalidArgument, NotFound, ResourceExhausted
from services.skills.domain import Gate, SkillDraft, SkillState, SkillTrigger
from tests.unit.fakes.skills import TOOLS, make


async def test_create_stores_the_draft_and_announces_it():
    s = make()
    skill = await s.create("open-pr")
    assert (skill.version, skill.state, skill.use_count, skill.cluster_size) == (1, SkillState.ACTIVE, 0, 1)
    assert await s.service.get(s.key()) == skill
    [(kind, payload)] = s.events.emitted
    assert kind == "skill_synthesized" and payload["turn_id"] == "run-open-pr" and payload["tool_count"] == 4


async def test_the_name_is_checked_after_stripping():
    s = make()
    skill = await s.create("  open-pr  ")
    assert skill.name == "open-pr"
    for bad, reason in (("   ", "FIELD_REQUIRED"), ("x" * 101, "FIELD_INVALID"), ("two\nlines", "FIELD_INVALID")):
        with pytest.raises(InvalidArgument) as err:
            await s.create(bad, tools=["other"])
        assert (err.value.reason, err.value.violations[0].field) == (reason, "name")


async def test_the_gates_refuse_a_taken_name_a_duplicate_tool_set_and_a_full_catalogue():
    s = make(synthesis=SkillSynthesisConfig(max_skills_per_agent=2))
    await s.create("open-pr")
    with pytest.raises(AlreadyExists) as taken:
        await s.create("open-pr", tools=["unrelated"])
    assert taken.value.reason == "SKILL_NAME_TAKEN"
    with pytest.raises(AlreadyExists) as dup:
        await s.create("open-pr-again", tools=list(reversed(TOOLS)))
    assert dup.value.reason == "SKILL_DUPLICATE_TOOL_SET"
    await s.create("triage", tools=["jira_search"])
    with pytest.raises(ResourceExhausted) as full:
        await s.create("third", tools=["slack_post"])
    assert full.value.reason == "SKILL_CATALOGUE_FULL"
    assert len(s.store.rows) == 2


async def test_a_full_catalogue_is_the_verdict_and_still_names_the_duplicate():
    # The cap decides; the duplicate is named beside it, so a synthesizer retrying the draft that
    # took the last slot can find its own skill and stamp its episode.
    s = make(synthesis=SkillSynthesisConfig(max_skills_per_agent=1))
    mine = await s.create("open-pr")
    verdict = await s.service.check_candidate("acme", "ana", list(reversed(TOOLS)))
    assert verdict.gate is Gate.CATALOGUE_FULL and verdict.duplicate is not None
    assert verdict.duplicate[0].id == mine.id and verdict.duplicate[1] == 1.0
    other = await s.service.check_candidate("acme", "ana", ["slack_post"])
    assert other.gate is Gate.CATALOGUE_FULL and other.duplicate is None


async def test_an_archived_skill_is_learned_for_the_duplicate_check_but_not_for_the_cap():
    s = make(synthesis=SkillSynthesisConfig(max_skills_per_agent=1))
    await s.create("open-pr")
    await s.service.archive(s.key())
    verdict = await s.service.check_candidate("acme", "ana", TOOLS)
    assert verdict.gate is Gate.DUPLICATE and verdict.duplicate is not None
    assert verdict.duplicate[0].name == "open-pr" and verdict.live_count == 0
    assert (await s.service.check_candidate("acme", "ana", ["other"])).gate is Gate.OPEN


async def test_a_single_skill_names_one_turn_and_a_clustered_one_at_least_two():
    s = make()

    async def draft(trigger: SkillTrigger, size: int, turns: list[str]) -> object:
        return await s.service.create("acme", "ana", SkillDraft("n", "s", "b", ("t",), trigger, size, tuple(turns)))

    for trigger, size, turns, field in (
        (SkillTrigger.SINGLE, 3, ["r1"], "cluster_size"),
        (SkillTrigger.SINGLE, 1, ["r1", "r2"], "source_turn_ids"),
        (SkillTrigger.CLUSTERED, 1, ["r1"], "cluster_size"),
        (SkillTrigger.CLUSTERED, 2, [], "source_turn_ids"),
    ):
        with pytest.raises(InvalidArgument) as err:
            await draft(trigger, size, turns)
        assert err.value.violations[0].field == field
    assert not s.store.rows


async def test_a_use_counts_moves_the_clock_and_revives_a_stale_skill():
    s = make()
    skill = await s.create("open-pr")
    s.store.rows[skill.id].skill = await s.store.set_state(None, skill.id, SkillState.STALE, s.clock.now(),
                                                           reset_clock=False)  # fmt: skip
    s.clock.advance(days=3)
    used = await s.service.use(s.key(), "run-9")
    assert used.revived and not used.telemetry_write_failed
    assert used.skill.use_count == 1 and used.skill.state is SkillState.ACTIVE
    assert used.skill.last_used_time == s.clock.now() == used.skill.unused_since
    assert s.events.kinds()[-2:] == ["skill_used", "skill_revived"]


async def test_an_archived_or_unknown_skill_is_not_used():
    s = make()
    await s.create("open-pr")
    await s.service.archive(s.key())
    with pytest.raises(Exception) as archived:
        await s.service.use(s.key(), None)
    assert getattr(archived.value, "reason", None) == "SKILL_ARCHIVED"
    with pytest.raises(NotFound):
        await s.service.use(s.key("nope"), None)


async def test_a_stamp_that_cannot_be_written_returns_the_body_and_reports_it():
    s = make()
    skill = await s.create("open-pr")
    s.store.fail_stamps = True
    used = await s.service.use(s.key(), "run-1")
    assert used.telemetry_write_failed and used.skill.body == skill.body and used.skill.use_count == 0
    offered = await s.service.mark_offered("acme", "ana", [], ["open-pr"], "run-1")
    assert offered.marked == 0 and offered.failure is not None
    assert s.events.kinds().count("skill_telemetry_write_failed") == 2


async def test_offers_move_only_the_named_live_skills_and_count_no_use():
    s = make()
    a = await s.create("open-pr")
    b = await s.create("triage", tools=["jira_search"])
    await s.create("deploy", tools=["kubectl"])
    s.clock.advance(days=1)
    result = await s.service.mark_offered("acme", "ana", [str(b.id)], ["open-pr", "  "], "run-2")
    assert result.marked == 2 and result.failure is None
    after = {sk.name: sk for sk in await s.store.all_skills("acme", "ana")}
    assert after["open-pr"].last_offered_time == after["triage"].last_offered_time == s.clock.now()
    assert after["deploy"].last_offered_time is None and after[a.name].use_count == 0


async def test_offers_over_the_limit_on_both_lists_together_are_refused():
    s = make()
    ids = ["00000000-0000-0000-0000-000000000001"] * 300
    with pytest.raises(InvalidArgument) as err:
        await s.service.mark_offered("acme", "ana", ids, [f"s{i}" for i in range(201)], None)
    assert err.value.reason == "TOO_MANY_IDS"


async def test_marked_uses_count_once_per_request_id():
    s = make()
    skill = await s.create("open-pr")
    assert await s.service.mark_used("acme", "ana", [str(skill.id)], "run-1", "k1") == (1, [], False)
    assert await s.service.mark_used("acme", "ana", [str(skill.id)], "run-1", "k1") == (0, [], True)
    assert (await s.service.get(s.key())).use_count == 1


async def test_list_pages_by_name_and_health_counts_every_state():
    s = make()
    for name, tool in (("c", "t3"), ("a", "t1"), ("b", "t2")):
        await s.create(name, tools=[tool])
    await s.service.archive(s.key("b"))
    page, token, total = await s.service.list_skills("acme", "ana", 1, "", False)
    assert [k.name for k in page] == ["a"] and total == 2 and token
    page, token, _ = await s.service.list_skills("acme", "ana", 1, token, False)
    assert [k.name for k in page] == ["c"] and token == ""
    await s.service.use(s.key("a"), None)
    health = await s.service.health("acme", "ana")
    assert (health.total_skills, health.archived_skills, health.total_skill_uses) == (3, 1, 1)
    assert health.below_threshold is False


async def test_a_summary_or_body_of_spaces_is_missing():
    s = make()
    for field, kw in (("summary", {"summary": "   "}), ("body", {"body": " \n "})):
        draft = replace(SkillDraft.single("n", "s", "b", ["t"], "r1"), **kw)
        with pytest.raises(InvalidArgument) as err:
            await s.service.create("acme", "ana", draft)
        assert (err.value.reason, err.value.violations[0].field) == ("FIELD_REQUIRED", field)
    assert not s.store.rows


async def test_a_first_page_that_holds_the_whole_catalogue_is_its_own_total():
    s = make()
    for name, tool in (("c", "t3"), ("a", "t1"), ("b", "t2")):
        await s.create(name, tools=[tool])
    await s.service.archive(s.key("b"))
    counted: list[bool] = []
    count = s.store.count

    async def counting(company: str, seat: str, include_archived: bool) -> int:
        counted.append(include_archived)
        return await count(company, seat, include_archived)

    s.store.count = counting  # type: ignore[method-assign]  # record the fake's count calls
    page, token, total = await s.service.list_skills("acme", "ana", 50, "", False)
    assert ([k.name for k in page], token, total, counted) == (["a", "c"], "", 2, [])
    page, token, total = await s.service.list_skills("acme", "ana", 50, "", True)
    assert (len(page), total, counted) == (3, 3, [])
    # A page that is not the whole catalogue still asks the store for the total.
    page, token, total = await s.service.list_skills("acme", "ana", 2, "", True)
    assert (len(page), bool(token), total, counted) == (2, True, 3, [True])
