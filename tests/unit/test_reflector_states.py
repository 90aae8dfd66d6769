"""The reflection state machine (issue 13): every allowed move, the queue row's state each one
implies, and a refused move. Pure domain: no Postgres, no model, no gRPC."""

from __future__ import annotations

import pytest

from services.reflector.domain import (
    TRANSITIONS,
    IllegalTransition,
    ReflectionState,
    check_transition,
    sources,
)

S = ReflectionState
ALLOWED = sorted((a, b) for a, nexts in TRANSITIONS.items() for b in nexts)
REFUSED = sorted((a, b) for a in S for b in S if b not in TRANSITIONS[a])


def test_every_state_has_its_moves_and_its_queue_projection():
    assert set(TRANSITIONS) == set(S)
    assert {s: s.job_state for s in S} == {
        S.QUEUED: "queued",
        S.RETRYING: "queued",
        S.DEFERRED: "queued",
        S.RUNNING: "running",
        S.COMPLETED: "done",
        S.GATED: "done",
        S.DEAD_LETTERED: "dead",
        S.ERASED: "done",
    }


@pytest.mark.parametrize(("current", "target"), ALLOWED, ids=[f"{a}->{b}" for a, b in ALLOWED])
def test_an_allowed_move_passes_and_the_guard_lets_it(current, target):
    check_transition("run-1", current, target)
    assert str(current) in sources(target)


@pytest.mark.parametrize(("current", "target"), REFUSED, ids=[f"{a}->{b}" for a, b in REFUSED])
def test_a_move_not_in_the_table_is_refused_and_the_guard_refuses_it(current, target):
    with pytest.raises(IllegalTransition) as exc:
        check_transition("run-1", current, target)
    assert (exc.value.current, exc.value.target) == (current, target)
    assert str(current) not in sources(target)


def test_the_machine_s_shape():
    # Every pass starts with a take; a finished turn is never taken again (the duplicate gate),
    # except a dead letter an operator re-queued.
    assert sources(S.RUNNING) == sorted(["queued", "retrying", "deferred", "running", "dead_lettered"])
    for end in (S.COMPLETED, S.GATED, S.DEFERRED, S.QUEUED):
        assert sources(end) == ["running"]
    assert S.COMPLETED.final and S.GATED.final and not S.DEAD_LETTERED.final
    # ERASED is reached by no move (an erasure deletes the record) and left by none.
    assert S.ERASED.final and sources(S.ERASED) == []
    assert [s for s in S if s.waiting] == [S.QUEUED, S.RETRYING, S.DEFERRED]
    with pytest.raises(IllegalTransition):
        check_transition("run-1", None, S.RUNNING)  # no record: nothing to move
