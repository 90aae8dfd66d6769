"""The persist decider's decisions on fakes: what a turn's people said becomes at most one diary
note of the right tier, through the diary port, with the offline provider's rules deciding."""

from __future__ import annotations

from datetime import timedelta

from agentlearn.diary.v1 import diary_service_pb2 as diary_pb
from libs.common.config import Settings
from libs.common.outcomes import TurnOutcome
from services.reflector.domain import WorkerStatus
from services.reflector.workers.persist_decider import PersistDecider
from tests.unit.fakes.reflector import make_turn, worker_harness


def _writes(h) -> list[diary_pb.WriteNoteRequest]:
    return [c for c in h.diary.calls if isinstance(c, diary_pb.WriteNoteRequest)]


async def test_a_stated_preference_is_written_as_one_long_note_keyed_by_the_work() -> None:
    turn = make_turn(said="I prefer weekly digests over daily pings.", work_key="ticket-9")
    h = worker_harness(turn.end_time)
    out = await PersistDecider().run(turn, h.ctx)
    assert out.status is WorkerStatus.WROTE and out.detail == "LONG"
    [write] = _writes(h)
    assert write.tier == diary_pb.NOTE_TIER_LONG
    assert write.source == diary_pb.NOTE_SOURCE_PERSIST_DECIDER
    assert write.request_id == "ticket-9:persist_decider"
    assert "bob prefers weekly digests" in write.content
    assert out.written == [f"note:{h.diary.notes[0].id} LONG"]
    kind, fields = h.events.emitted[-1]
    assert kind == "persist_decider_completed" and fields["written"] is True


async def test_a_redelivered_turn_whose_note_was_deleted_since_writes_and_records_nothing() -> None:
    turn = make_turn(said="I prefer weekly digests over daily pings.", work_key="ticket-9")
    h = worker_harness(turn.end_time)
    first = await PersistDecider().run(turn, h.ctx)
    assert first.status is WorkerStatus.WROTE
    h.diary.delete(h.diary.notes[0].id)
    again = await PersistDecider().run(turn, h.ctx)
    assert again.status is WorkerStatus.SKIPPED and again.gate == "note_removed" and again.written == []
    assert h.diary.notes == []
    assert h.events.emitted[-1][1]["written"] is False


async def test_a_paraphrase_of_a_recent_note_writes_nothing() -> None:
    turn = make_turn(said="I would prefer a weekly digest.")
    h = worker_harness(turn.end_time)
    h.diary.seed("acme", "agent-1", "bob prefers weekly digests.")
    out = await PersistDecider().run(turn, h.ctx)
    assert out.status is WorkerStatus.NOTHING and out.detail == "NOOP"
    assert _writes(h) == []
    [recall] = [c for c in h.diary.calls if isinstance(c, diary_pb.RecallNotesRequest)]
    assert recall.recency_limit == h.ctx.settings.learning.reflection.recent_notes_shown


async def test_situational_state_is_a_short_note_whose_days_count_from_when_it_was_said() -> None:
    turn = make_turn(said="I'm on vacation until the 20th.")  # said 2026-03-02: through the 20th is 19 days
    h = worker_harness(turn.end_time + timedelta(days=4))  # reflected four days late
    out = await PersistDecider().run(turn, h.ctx)
    assert out.status is WorkerStatus.WROTE and out.detail == "SHORT"
    [write] = _writes(h)
    assert write.tier == diary_pb.NOTE_TIER_SHORT
    assert write.ttl_days == 15


async def test_situational_state_already_over_when_reflected_is_skipped_unwritten() -> None:
    turn = make_turn(said="I'm out of office today.")
    h = worker_harness(turn.end_time + timedelta(days=3))
    out = await PersistDecider().run(turn, h.ctx)
    assert out.status is WorkerStatus.SKIPPED and out.gate == "already_over"
    assert _writes(h) == []
    assert h.events.emitted[-1][1]["written"] is False


async def test_a_note_past_the_diary_limit_is_skipped_not_trimmed() -> None:
    settings = Settings.model_validate({"learning": {"diary": {"max_content_chars": 30}}})
    turn = make_turn(said="I prefer weekly digests that list every open ticket by owner.")
    h = worker_harness(turn.end_time, settings=settings)
    out = await PersistDecider().run(turn, h.ctx)
    assert out.status is WorkerStatus.SKIPPED and out.gate == "note_too_long"
    assert _writes(h) == []


def test_the_gates_close_on_unsettled_and_self_persisted_turns() -> None:
    decider = PersistDecider()
    assert decider.gate(make_turn(said="x", outcome=TurnOutcome.SELF_ITERATE)) == "unsettled"
    assert decider.gate(make_turn(said="x", self_persisted=True)) == "self_persisted"
    assert decider.gate(make_turn(said="x", outcome=TurnOutcome.FAILED)) is None


def test_a_call_to_reflect_and_persist_closes_the_gate_as_the_flag_does() -> None:
    """Spec: skipped "when the turn already self-persisted in-flight (the executor called
    reflect_and_persist)" — the call is the signal as much as the flag."""
    decider = PersistDecider()
    said = "I prefer weekly digests over daily pings."
    assert decider.gate(make_turn(said=said, tools=("search_docs", "reflect_and_persist", "reply"))) == "self_persisted"
    assert decider.gate(make_turn(said=said, tools=("search_docs", "reply"))) is None
