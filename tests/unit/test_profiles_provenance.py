"""Profiles use cases on the in-memory store (unit tier, issue 13): each observation is recorded
with its own provenance, an entry is traced to the observations that stated it, and the
provenance read refuses what it must. No Postgres, no gRPC, no model."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from libs.common.clock import ManualClock
from libs.common.errors import InvalidArgument, NotFound
from services.profiles.domain import Limits, ObservationRecord, ObservationSource, Profile, Subject, prunable
from services.profiles.service import ProfileService
from tests.unit.fakes.profiles import FakeProfileStore


class _Events:
    def __init__(self) -> None:
        self.kinds: list[str] = []

    async def emit(self, kind: str, **payload: object) -> None:
        self.kinds.append(kind)


def _service() -> tuple[ProfileService, FakeProfileStore, ManualClock]:
    store, clock = FakeProfileStore(), ManualClock()
    return ProfileService(store=store, clock=clock, events=_Events()), store, clock


def _source(turn: str, handle: str, model: str = "offline") -> ObservationSource:
    return ObservationSource(
        turn_ids=(turn,),
        work_key=f"work-{turn}",
        subjects=((handle, "", "slack"),),
        model=model,
        prompt_version="abc123",
        writer="profiler",
    )


async def test_every_observation_keeps_its_own_provenance_and_entries_trace_to_their_turns() -> None:
    service, store, clock = _service()
    first, _ = await service.upsert_profile(
        "acme", "ana", ("carla", "", "slack"), "Brief.", ["Ship on Fridays"], [], ["kafka"], "run-1",
        source=_source("run-1", "carla"),
    )  # fmt: skip
    clock.advance(seconds=60)
    await service.upsert_profile(
        "acme", "ana", ("carla", "", "slack"), "", ["Use euros"], ["No calls"], ["KAFKA", "billing"], "run-2",
        source=_source("run-2", "carla", model="gpt-x"),
    )  # fmt: skip
    profile, observations, entries = await service.provenance("acme", "ana", str(first.id))
    assert [o.source.turn_ids for o in observations] == [("run-2",), ("run-1",)]
    assert [o.source.model for o in observations] == ["gpt-x", "offline"]
    assert all(o.source.subjects == (("carla", "", "slack"),) for o in observations)
    by_text = {(e.field, e.text): [o.source.turn_ids[0] for o in e.observations] for e in entries}
    assert by_text[("past_decisions", "Ship on Fridays")] == ["run-1"]
    assert by_text[("past_decisions", "Use euros")] == ["run-2"]
    assert by_text[("sensitivities", "No calls")] == ["run-2"]
    # Re-stated in another spelling: both turns stated it, the first added it.
    assert by_text[("topics", "KAFKA")] == ["run-1", "run-2"]
    assert by_text[("communication_style", "Brief.")] == ["run-1"]
    assert profile.observation_count == 2 and len(store.records) == 2


async def test_an_observation_without_provenance_records_its_turn_and_the_subject_observed() -> None:
    service, _, _ = _service()
    profile, _ = await service.upsert_profile("acme", "ana", ("", "U42", "Slack"), "", [], [], ["cdn"], "run-9")
    _, [obs], _ = await service.provenance("acme", "ana", str(profile.id))
    assert obs.source.turn_ids == ("run-9",) and obs.source.subjects == (("", "U42", "slack"),)
    assert obs.source.model == "" and obs.topics == ("cdn",)


async def test_a_replayed_observation_records_nothing_twice() -> None:
    service, store, _ = _service()
    args = ("acme", "ana", ("carla", "", "slack"), "", [], [], ["kafka"], "run-1")
    await service.upsert_profile(*args, request_id="k1", source=_source("run-1", "carla"))
    await service.upsert_profile(*args, request_id="k1", source=_source("run-1", "carla"))
    # The same turn under another key: the merge sees the turn already applied.
    await service.upsert_profile(*args, request_id="k2", source=_source("run-1", "carla"))
    assert len(store.records) == 1


async def test_provenance_refuses_a_bad_id_and_hides_another_observers_profile() -> None:
    service, _, _ = _service()
    profile, _ = await service.upsert_profile("acme", "ana", ("carla", "", "slack"), "", [], [], ["x"], "run-1")
    with pytest.raises(InvalidArgument) as bad:
        await service.provenance("acme", "ana", "not-a-uuid")
    assert [v.field for v in bad.value.violations] == ["profile_id"]
    with pytest.raises(NotFound):
        await service.provenance("acme", "ben", str(profile.id))
    with pytest.raises(NotFound):
        await service.provenance("other", "ana", str(profile.id))
    with pytest.raises(NotFound):
        await service.provenance("acme", "ana", str(uuid.uuid4()))


async def test_the_history_is_bounded_yet_every_entry_keeps_the_observation_that_added_it() -> None:
    store, clock = FakeProfileStore(), ManualClock()
    service = ProfileService(store=store, clock=clock, events=_Events(), limits=Limits(kept_observations=2))
    subject = ("carla", "", "slack")
    profile, _ = await service.upsert_profile("acme", "ana", subject, "", [], [], ["kafka"], "run-1")
    for n in range(2, 7):  # five more turns, each re-stating kafka and adding a topic of its own
        clock.advance(seconds=60)
        await service.upsert_profile("acme", "ana", subject, "", [], [], ["kafka", f"t{n}"], f"run-{n}")
    _, observations, entries = await service.provenance("acme", "ana", str(profile.id))
    # The two newest, plus past them the first to state each entry still held: run-1 added kafka,
    # run-2..run-4 added t2..t4. Nothing else is kept.
    assert sorted(o.source.turn_ids[0] for o in observations) == ["run-1", "run-2", "run-3", "run-4", "run-5", "run-6"]
    by_text = {e.text: [o.source.turn_ids[0] for o in e.observations] for e in entries}
    assert by_text["kafka"][0] == "run-1" and by_text["t3"] == ["run-3"]
    # Three more turns only re-state kafka: past the newest two, run-7 added nothing still held
    # (run-1 added kafka) and goes; every adder stays.
    for n in (7, 8, 9):
        clock.advance(seconds=60)
        await service.upsert_profile("acme", "ana", subject, "", [], [], ["kafka"], f"run-{n}")
    _, observations, entries = await service.provenance("acme", "ana", str(profile.id))
    kept = sorted(o.source.turn_ids[0] for o in observations)
    assert kept == ["run-1", "run-2", "run-3", "run-4", "run-5", "run-6", "run-8", "run-9"]
    assert {e.text: e.observations[0].source.turn_ids[0] for e in entries}["t6"] == "run-6"


def test_prunable_keeps_the_first_to_state_each_held_entry() -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)

    def obs(n: int, topics: tuple[str, ...]) -> ObservationRecord:
        return ObservationRecord(
            id=uuid.uuid4(), profile_id=uuid.uuid4(), source=_source(f"run-{n}", "carla"), communication_style="",
            past_decisions=(), sensitivities=(), topics=topics, observe_time=start + timedelta(minutes=n),
        )  # fmt: skip

    older = [obs(3, ("a", "gone")), obs(2, ("A",)), obs(1, ("b",))]
    profile = Profile(
        id=uuid.uuid4(), company="acme", observer="ana", subject=Subject("slack", "carla", None), subject_key="carla",
        communication_style="", past_decisions=(), sensitivities=(), topics=("a", "b"), observation_count=3,
        create_time=start, update_time=start, last_turn_id="run-3",
    )  # fmt: skip
    # run-2 first stated "a", run-1 "b"; run-3 re-stated "a" and stated an entry no longer held.
    assert prunable(profile, older) == [older[0].id]
