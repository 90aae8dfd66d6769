"""The episodist on a fake episodes port: one row per turn, a redelivered run of the same work
collapsed into the first's row, the label freed of the run id."""

from __future__ import annotations

import dataclasses

import pytest

from agentlearn.episodes.v1 import episode_service_pb2 as ep_pb
from libs.common.contract import violations
from libs.common.outcomes import TurnOutcome
from libs.common.run_ids import label_names_run_id
from services.reflector.domain import Interaction, Sender, WorkerStatus
from services.reflector.workers.episodist import Episodist
from tests.unit.fakes.reflector import make_turn, worker_harness


async def test_a_turn_is_recorded_once_with_its_outcome_and_a_label_without_the_run_id() -> None:
    turn = make_turn(said="deploy it", outcome=TurnOutcome.FAILED, tools=("git", "ci"), label="cron run-1 nightly")
    h = worker_harness(turn.end_time)
    out = await Episodist().run(turn, h.ctx)
    [request] = h.episodes.calls
    assert isinstance(request, ep_pb.RecordEpisodeRequest)
    assert request.outcome == ep_pb.TURN_OUTCOME_FAILED
    assert request.label == "cron nightly"
    assert list(request.tools_called) == ["git", "ci"]
    assert request.subjects == ["bob"]
    assert out.status is WorkerStatus.WROTE and out.detail == "recorded"
    assert out.written == [f"episode:{h.episodes.episodes['run-1'].id}"]
    again = await Episodist().run(turn, h.ctx)  # a redone reflection of the same run
    assert again.detail == "already recorded" and len(h.episodes.episodes) == 1


async def test_a_second_run_of_the_same_work_is_collapsed_into_the_first() -> None:
    first = make_turn(said="fix ticket 9", work_key="ticket-9", turn_id="run-1")
    h = worker_harness(first.end_time)
    await Episodist().run(first, h.ctx)
    second = dataclasses.replace(first, turn_id="run-2")
    out = await Episodist().run(second, h.ctx)
    assert out.status is WorkerStatus.NOTHING
    assert "collapsed" in out.detail and "run-1" in out.detail
    assert list(h.episodes.episodes) == ["run-1"]


def test_a_turn_without_times_has_no_episode() -> None:
    turn = dataclasses.replace(make_turn(said="x"), start_time=None)
    assert Episodist().gate(turn) == "no_times"
    assert Episodist().gate(make_turn(said="x")) is None


async def test_the_senders_go_as_people_each_identifier_in_its_field_every_one_of_them() -> None:
    """RecordEpisode's ``senders`` (the episode's provenance) take ErasureSubject's contract, which
    takes every sender SubmitTurn accepts: a one-letter handle and a platform with a space go as
    people too, none left out (an erasure finds her episode by them)."""
    base = make_turn(said="export it")
    people = (
        Sender("carla", "U07XK9Q2", "Slack"),
        Sender("", "U0ZED42", "Slack"),
        Sender("carla", "U07XK9Q2", "Slack"),  # she spoke twice: one person
        Sender("x", "", "slack"),
        Sender("dan", "", "ms teams"),
    )
    turn = dataclasses.replace(base, interactions=tuple(Interaction(p, "hi", base.end_time) for p in people))
    h = worker_harness(turn.end_time)
    await Episodist().run(turn, h.ctx)
    [request] = h.episodes.calls
    assert isinstance(request, ep_pb.RecordEpisodeRequest)
    assert not violations(request)  # the contract takes every one of them
    assert [(s.handle, s.external_id, s.platform) for s in request.senders] == [
        ("carla", "U07XK9Q2", "Slack"),
        ("", "U0ZED42", "Slack"),
        ("x", "", "slack"),
        ("dan", "", "ms teams"),
    ]
    assert list(request.subjects) == ["U07XK9Q2", "U0ZED42", "carla", "dan", "x"]


@pytest.mark.parametrize(
    ("label", "run_id", "recorded"),
    [
        # The id inside a longer word is not the run id (RecordEpisode's own rule): left whole.
        ("review PR #5120 on POC-512", "512", "review PR #5120 on POC"),
        ("run-421 nightly", "run-42", "run-421 nightly"),
        ("cron run-1 nightly", "run-1", "cron nightly"),
        ("nightly: run-42", "run-42", "nightly"),
    ],
)
async def test_the_run_id_leaves_the_label_only_where_it_is_a_word_of_its_own(
    label: str, run_id: str, recorded: str
) -> None:
    turn = make_turn(said="x", turn_id=run_id, label=label)
    h = worker_harness(turn.end_time)
    await Episodist().run(turn, h.ctx)
    [request] = h.episodes.calls
    assert isinstance(request, ep_pb.RecordEpisodeRequest)
    assert request.label == recorded
    assert not label_names_run_id(request.label, run_id)
