"""The synthesizer, the refiner and skill use on fake skills and episodes ports: the gates that
close before any model call, the offline provider's draft, the stamp of the source episode, and a
redo that finds its own earlier draft instead of drafting twice (also when that draft filled the
catalogue)."""

from __future__ import annotations

import pytest

from agentlearn.skills.v1 import skill_service_pb2 as sk_pb
from libs.common.outcomes import TurnOutcome
from services.reflector.domain import OfferedSkill, WorkerStatus
from services.reflector.workers.base import EpisodePending, failure_kind
from services.reflector.workers.episodist import Episodist
from services.reflector.workers.refiner import Refiner
from services.reflector.workers.skill_use import SkillUse
from services.reflector.workers.synthesizer import Synthesizer
from tests.unit.fakes.reflector import make_turn, worker_harness

TOOLS = ("search_tickets", "read_ticket", "post_reply")


def _creates(h) -> list[sk_pb.CreateSkillRequest]:
    return [c for c in h.skills.calls if isinstance(c, sk_pb.CreateSkillRequest)]


async def test_a_procedure_is_drafted_and_its_source_episode_stamped() -> None:
    turn = make_turn(said="Please triage the open tickets", tools=TOOLS)
    h = worker_harness(turn.end_time)
    await Episodist().run(turn, h.ctx)
    out = await Synthesizer(min_tool_calls=3).run(turn, h.ctx)
    assert out.status is WorkerStatus.WROTE and out.detail == "drafted"
    [create] = _creates(h)
    assert list(create.tool_sequence) == list(TOOLS)
    assert list(create.source_turn_ids) == ["run-1"]
    assert create.trigger == sk_pb.SKILL_TRIGGER_SINGLE
    skill = next(iter(h.skills.skills.values()))
    assert h.episodes.episodes["run-1"].consolidated_into_skill_id == skill.id
    assert out.written == [f"skill:{skill.id} {create.name}", "episode stamped"]


async def test_a_duplicate_tool_set_is_skipped_before_any_model_call() -> None:
    turn = make_turn(said="triage", tools=TOOLS)
    h = worker_harness(turn.end_time, first_pass=True)
    h.skills.seed("acme", "agent-1", "ticket-triage", list(reversed(TOOLS)), archived=True)
    out = await Synthesizer(min_tool_calls=3).run(turn, h.ctx)
    assert out.status is WorkerStatus.SKIPPED and out.gate == "duplicate"
    assert out.detail == "duplicates ticket-triage (archived)"
    assert _creates(h) == []


async def test_a_full_catalogue_is_skipped() -> None:
    turn = make_turn(said="triage", tools=TOOLS)
    h = worker_harness(turn.end_time)
    h.skills.max_skills = 1
    h.skills.seed("acme", "agent-1", "other", ["a", "b", "c"])
    out = await Synthesizer(min_tool_calls=3).run(turn, h.ctx)
    assert (out.status, out.gate) == (WorkerStatus.SKIPPED, "catalogue_full")


async def test_a_failed_turn_is_declined_by_the_offline_rules() -> None:
    turn = make_turn(said="triage", tools=TOOLS, outcome=TurnOutcome.FAILED)
    h = worker_harness(turn.end_time)
    out = await Synthesizer(min_tool_calls=3).run(turn, h.ctx)
    assert out.status is WorkerStatus.NOTHING and out.detail.startswith("declined")
    assert _creates(h) == []


async def test_a_draft_waiting_for_its_episode_is_retried_and_the_redo_stamps_it_without_drafting_again() -> None:
    turn = make_turn(said="Please triage the open tickets", tools=TOOLS)
    h = worker_harness(turn.end_time)
    with pytest.raises(EpisodePending) as pending:
        await Synthesizer(min_tool_calls=3).run(turn, h.ctx)  # no episode yet: the episodist failed
    assert failure_kind(pending.value) == "episode_pending"
    await Episodist().run(turn, h.ctx)
    out = await Synthesizer(min_tool_calls=3).run(turn, h.ctx)  # the retry (not the first pass)
    assert out.status is WorkerStatus.WROTE and "episode stamped" in out.written
    assert len(_creates(h)) == 1 and len(h.skills.skills) == 1


async def test_a_redo_whose_own_draft_filled_the_catalogue_stamps_it() -> None:
    # The first attempt's skill took the last slot: the retry's gate is CATALOGUE_FULL, and the
    # duplicate it names is that skill, so the redo stamps the episode rather than skip it.
    turn = make_turn(said="Please triage the open tickets", tools=TOOLS)
    h = worker_harness(turn.end_time)
    h.skills.max_skills = 1
    with pytest.raises(EpisodePending):
        await Synthesizer(min_tool_calls=3).run(turn, h.ctx)
    await Episodist().run(turn, h.ctx)
    out = await Synthesizer(min_tool_calls=3).run(turn, h.ctx)
    assert out.status is WorkerStatus.WROTE and "episode stamped" in out.written
    [skill] = h.skills.skills.values()
    assert h.episodes.episodes["run-1"].consolidated_into_skill_id == skill.id and len(_creates(h)) == 1


async def test_a_draft_whose_name_another_turn_took_is_dropped_not_stamped() -> None:
    turn = make_turn(said="Please triage the open tickets", tools=TOOLS)
    h = worker_harness(turn.end_time)
    await Episodist().run(turn, h.ctx)
    h.skills.seed("acme", "agent-1", "triage-open-tickets", ["x", "y", "z"])  # the offline draft's name
    out = await Synthesizer(min_tool_calls=3).run(turn, h.ctx)
    assert out.status is WorkerStatus.NOTHING and out.detail.startswith("draft dropped: a skill named")
    assert len(_creates(h)) == 1 and len(h.skills.skills) == 1
    assert h.episodes.episodes["run-1"].consolidated_into_skill_id == ""


def test_the_synthesizer_gates_on_settled_turns_and_run_length() -> None:
    synth = Synthesizer(min_tool_calls=3)
    assert synth.gate(make_turn(tools=TOOLS, outcome=TurnOutcome.SELF_ITERATE)) == "unsettled"
    assert synth.gate(make_turn(tools=TOOLS[:2])) == "below_min_tool_calls"
    assert synth.gate(make_turn(tools=("t",) * 501)) == "tool_run_too_long"


async def test_a_failure_running_a_skills_tools_is_appended_as_a_counter_example() -> None:
    h = worker_harness(make_turn().end_time)
    skill = h.skills.seed("acme", "agent-1", "ticket-triage", list(TOOLS))
    turn = make_turn(
        said="triage", tools=TOOLS[:2], outcome=TurnOutcome.FAILED, offered=(OfferedSkill(skill.id, skill.name),)
    )
    out = await Refiner(on_success=True, on_failure=True).run(turn, h.ctx)
    assert out.status is WorkerStatus.WROTE and out.detail == "ticket-triage"
    [append] = [c for c in h.skills.calls if isinstance(c, sk_pb.AppendSkillObservationRequest)]
    assert append.kind == sk_pb.OBSERVATION_KIND_COUNTER_EXAMPLE
    assert append.skill_id == skill.id and append.request_id == "run-1:refiner"
    assert out.written == [f"skill:{skill.id} v2"]


async def test_a_turn_whose_offered_skills_are_gone_costs_no_model_call() -> None:
    h = worker_harness(make_turn().end_time)
    gone = h.skills.seed("acme", "agent-1", "old", list(TOOLS), archived=True)
    turn = make_turn(said="x", tools=TOOLS, offered=(OfferedSkill(gone.id, gone.name),))
    out = await Refiner(on_success=True, on_failure=True).run(turn, h.ctx)
    assert out.status is WorkerStatus.NOTHING and "no model call" in out.detail
    assert not [c for c in h.skills.calls if isinstance(c, sk_pb.AppendSkillObservationRequest)]


async def test_a_success_within_the_skills_own_tools_teaches_nothing() -> None:
    h = worker_harness(make_turn().end_time)
    skill = h.skills.seed("acme", "agent-1", "ticket-triage", list(TOOLS))
    turn = make_turn(said="triage", tools=TOOLS, offered=(OfferedSkill(skill.id, skill.name),))
    out = await Refiner(on_success=True, on_failure=True).run(turn, h.ctx)
    assert (out.status, out.detail) == (WorkerStatus.NOTHING, "NOOP")


def test_the_refiner_gates_follow_its_switches() -> None:
    offered = (OfferedSkill("s1", "n"),)
    assert Refiner(on_success=False, on_failure=True).gate(make_turn(offered=offered)) == "auto_refine_on_success_off"
    failed = make_turn(offered=offered, outcome=TurnOutcome.FAILED)
    assert Refiner(on_success=True, on_failure=False).gate(failed) == "auto_refine_on_failure_off"
    assert Refiner(on_success=True, on_failure=True).gate(make_turn()) == "no_skills_used"


async def test_every_offered_live_skill_is_marked_used_once() -> None:
    h = worker_harness(make_turn().end_time)
    live = h.skills.seed("acme", "agent-1", "a", ["x"])
    gone = h.skills.seed("acme", "agent-1", "b", ["y"], archived=True)
    turn = make_turn(offered=(OfferedSkill(live.id, "a"), OfferedSkill(gone.id, "b")))
    out = await SkillUse().run(turn, h.ctx)
    assert out.status is WorkerStatus.WROTE and out.written == ["skill_uses:1"]
    assert h.skills.uses == {live.id: 1}
    assert SkillUse().gate(make_turn()) == "no_skills_offered"
