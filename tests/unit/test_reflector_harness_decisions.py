"""The reflection harness's decisions on in-memory fakes of its ports (tests/unit/fakes/
reflector_store.py): the gates in the spec's order, a passing failure retried with backoff and only
the unfinished workers re-run, dead-lettering after ``max_attempts``, the budget gate's deferral
(its attempt given back), a turn reflected once (a redelivery or a stale claim changes nothing),
and the record and its queue row always moving together. No Postgres, no model, no gRPC."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from agentlearn.reflector.v1 import reflector_service_pb2 as pb
from libs.common.config import Settings
from libs.common.errors import InvalidArgument
from libs.common.jobs import JobState
from services.reflector.domain import (
    JOB_KIND,
    Gate,
    ReflectionState,
    Turn,
    WorkerOutcome,
    WorkerStatus,
)
from services.reflector.harness import Harness
from services.reflector.service import ReflectorService
from services.reflector.workers.base import EpisodePending, WorkerContext
from services.reflector.workers.synthesizer import Synthesizer
from tests.unit.fakes.reflector import FakeEvents, worker_harness
from tests.unit.fakes.reflector_store import FakeBudget, FakeReflectionDb

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
KEY = ("acme", "agent-1", "run-1")


@dataclass
class ScriptedWorker:
    """A worker whose runs follow a script: each entry is an outcome status, or an exception to
    raise. It counts its runs; ``skip_when`` is its own gate."""

    name: str
    script: list[WorkerStatus | Exception] = field(default_factory=lambda: [WorkerStatus.WROTE])
    skip: str | None = None
    runs: int = 0

    def gate(self, turn: Turn) -> str | None:
        return self.skip

    async def run(self, turn: Turn, ctx: WorkerContext) -> WorkerOutcome:
        step = self.script[min(self.runs, len(self.script) - 1)]
        self.runs += 1
        if isinstance(step, Exception):
            raise step
        return WorkerOutcome(self.name, step)


@dataclass
class Rig:
    harness: Harness
    service: ReflectorService[Any]
    db: FakeReflectionDb
    events: FakeEvents
    budget: FakeBudget

    def record(self) -> Any:
        return self.db.state.records[KEY]

    def job(self) -> Any:
        return self.db.job()


def _settings(**overrides: Any) -> Settings:
    doc: dict[str, Any] = {
        "company_defaults": {"roles": {"support": {}}},
        "learning": {"reflection": {"max_attempts": 3, "retry_backoff_seconds": 10, "retry_backoff_max_seconds": 60}},
    }
    for path, value in overrides.items():
        node = doc
        *parents, leaf = path.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return Settings.model_validate(doc)


def _rig(workers: list[ScriptedWorker], settings: Settings | None = None, budget: FakeBudget | None = None) -> Rig:
    settings = settings or _settings()
    fakes = worker_harness(T0, settings=settings)
    db = FakeReflectionDb()
    budget = budget or FakeBudget()
    harness = Harness(settings, db.queue, db.store, workers, fakes.ctx, budget, fakes.events, "holder-1")
    service = ReflectorService(db.store, fakes.clock, fakes.events, harness)
    return Rig(harness, service, db, fakes.events, budget)


def _turn(
    *, role: str = "support", tools: tuple[str, ...] = ("search",), learning: bool | None = None
) -> pb.TurnCompleted:
    start, end = Timestamp(), Timestamp()
    start.FromDatetime(T0 - timedelta(minutes=1))
    end.FromDatetime(T0)
    turn = pb.TurnCompleted(
        company="acme",
        seat="agent-1",
        turn_id="run-1",
        role=role,
        ask="find the invoice",
        outcome=pb.TURN_OUTCOME_DONE,
        tools_called=list(tools),
        tool_sequence=list(tools[-1:]),
        start_time=start,
        end_time=end,
    )
    if learning is not None:
        turn.learning_enabled = learning
    return turn


def _clock(rig: Rig) -> Any:
    return rig.harness._clock  # the ManualClock the rig built (worker_harness's)


async def test_a_submitted_turn_is_reflected_once_and_its_job_finishes_with_it() -> None:
    a, b = ScriptedWorker("persist_decider"), ScriptedWorker("episodist", [WorkerStatus.NOTHING])
    rig = _rig([a, b])
    assert await rig.service.submit(_turn()) == (True, ReflectionState.QUEUED)
    assert await rig.service.submit(_turn()) == (False, ReflectionState.QUEUED)  # one job per run id

    assert await rig.harness.drain() == 1
    record = rig.record()
    assert record.state is ReflectionState.COMPLETED and record.attempts == 1
    assert [(w.worker, w.status) for w in record.workers] == [
        ("persist_decider", WorkerStatus.WROTE),
        ("episodist", WorkerStatus.NOTHING),
    ]
    assert rig.job().state == JobState.DONE
    assert (a.runs, b.runs) == (1, 1)
    assert "reflection_completed" in rig.events.kinds()
    # Nothing left to claim: a second drain takes nothing and runs nothing.
    assert await rig.harness.drain() == 0 and (a.runs, b.runs) == (1, 1)


async def test_the_gates_close_in_the_spec_order_and_run_no_worker() -> None:
    cases = [
        ({}, [], _turn(), Gate.NO_WORKERS),
        ({}, None, _turn(role="sales"), Gate.NO_ROLE),
        ({"company_defaults__accept_unknown_roles": True}, None, _turn(role="sales", tools=()), Gate.NO_ENGAGEMENT),
        ({}, None, _turn(learning=False), Gate.OPTED_OUT),
        ({"learning__enabled": False}, None, _turn(), Gate.OPTED_OUT),
        ({"learning__enabled": False}, None, _turn(learning=True, tools=()), Gate.NO_ENGAGEMENT),
        ({}, None, _turn(tools=()), Gate.NO_ENGAGEMENT),
    ]
    for overrides, wired, turn, gate in cases:
        worker = ScriptedWorker("persist_decider")
        rig = _rig([worker] if wired is None else wired, _settings(**overrides))
        await rig.service.submit(turn)
        await rig.harness.drain()
        assert (rig.record().state, rig.record().gate) == (ReflectionState.GATED, gate), (overrides, turn.role)
        assert rig.record().workers == [] and worker.runs == 0
        assert rig.job().state == JobState.DONE


async def test_a_spent_budget_defers_the_turn_and_gives_its_attempt_back() -> None:
    worker = ScriptedWorker("persist_decider")
    rig = _rig(
        [worker],
        _settings(company_defaults__token_budget={"seat_ceiling_tokens": 100}),
        FakeBudget(seat_spent=100),
    )
    await rig.service.submit(_turn())
    assert await rig.harness.drain() == 1
    record, job = rig.record(), rig.job()
    assert (record.state, record.gate) == (ReflectionState.DEFERRED, Gate.NO_BUDGET)
    recheck = T0 + timedelta(seconds=rig.harness._config.budget_recheck_seconds)
    assert record.next_attempt_time == recheck and job.run_after == recheck
    assert (job.state, job.job.attempts, worker.runs) == (JobState.QUEUED, 0, 0)

    # Not due yet: nothing is claimed. Once due and with room again, it runs.
    assert await rig.harness.drain() == 0
    rig.budget.seat_spent = 0
    _clock(rig).set(recheck)
    await rig.harness.drain()
    assert rig.record().state is ReflectionState.COMPLETED and worker.runs == 1


async def test_an_unreadable_budget_counter_reflects_anyway() -> None:
    worker = ScriptedWorker("persist_decider")
    settings = _settings(company_defaults__token_budget={"seat_ceiling_tokens": 100})
    rig = _rig([worker], settings, FakeBudget(broken=True))
    await rig.service.submit(_turn())
    await rig.harness.drain()
    assert rig.record().state is ReflectionState.COMPLETED and worker.runs == 1


async def test_a_passing_failure_retries_with_backoff_and_reruns_only_the_unfinished_worker() -> None:
    done = ScriptedWorker("persist_decider")
    flaky = ScriptedWorker("episodist", [EpisodePending("not yet"), WorkerStatus.WROTE])
    rig = _rig([done, flaky])
    await rig.service.submit(_turn())
    await rig.harness.drain()
    record, job = rig.record(), rig.job()
    assert record.state is ReflectionState.RETRYING and record.reason.startswith("episodist: episode_pending")
    assert record.next_attempt_time == T0 + timedelta(seconds=10) == job.run_after
    assert {w.worker: w.status for w in record.workers} == {
        "persist_decider": WorkerStatus.WROTE,
        "episodist": WorkerStatus.RETRYING,
    }
    assert (job.state, job.job.attempts) == (JobState.QUEUED, 1)
    assert "reflection_retrying" in rig.events.kinds()

    _clock(rig).set(T0 + timedelta(seconds=10))
    await rig.harness.drain()
    record = rig.record()
    assert record.state is ReflectionState.COMPLETED and record.attempts == 2
    assert {w.worker: w.status for w in record.workers} == {
        "persist_decider": WorkerStatus.WROTE,
        "episodist": WorkerStatus.WROTE,
    }
    assert (done.runs, flaky.runs) == (1, 2)  # the finished worker's write is not redone


async def test_a_final_failure_is_the_workers_outcome_and_the_turn_completes() -> None:
    broken = ScriptedWorker("persist_decider", [ValueError("bad arithmetic")])
    rig = _rig([broken, ScriptedWorker("episodist")])
    await rig.service.submit(_turn())
    await rig.harness.drain()
    record = rig.record()
    assert record.state is ReflectionState.COMPLETED
    assert record.workers[0].status is WorkerStatus.FAILED and record.workers[0].failure.startswith("error:")
    assert record.workers[1].status is WorkerStatus.WROTE and broken.runs == 1


async def test_a_worker_that_skips_itself_is_recorded_skipped_and_not_run() -> None:
    shy = ScriptedWorker("profiler", skip="no_sender")
    rig = _rig([shy, ScriptedWorker("episodist")])
    await rig.service.submit(_turn())
    await rig.harness.drain()
    first = rig.record().workers[0]
    assert (first.worker, first.status, first.gate) == (
        "profiler",
        WorkerStatus.SKIPPED,
        "no_sender",
    )
    assert shy.runs == 0


async def test_backoff_doubles_up_to_its_ceiling_and_the_last_attempt_dead_letters() -> None:
    flaky = ScriptedWorker("episodist", [EpisodePending("never")])
    rig = _rig([flaky, ScriptedWorker("persist_decider")])
    assert [rig.harness.backoff(n).total_seconds() for n in (1, 2, 3, 4, 5)] == [10, 20, 40, 60, 60]
    await rig.service.submit(_turn())
    waits = []
    for _ in range(3):
        await rig.harness.drain()
        if rig.record().state is ReflectionState.RETRYING:
            waits.append((rig.record().next_attempt_time - _clock(rig).now()).total_seconds())
            _clock(rig).set(rig.record().next_attempt_time)
    assert waits == [10, 20]
    record, job = rig.record(), rig.job()
    assert record.state is ReflectionState.DEAD_LETTERED and record.reason.startswith("gave up after 3 attempts")
    # Given up: the still-retryable outcome is final now; the finished one is kept.
    assert {w.worker: w.status for w in record.workers} == {
        "episodist": WorkerStatus.FAILED,
        "persist_decider": WorkerStatus.WROTE,
    }
    assert job.state == JobState.DEAD and flaky.runs == 3
    assert "reflection_dead_lettered" in rig.events.kinds()
    assert await rig.harness.drain() == 0  # never claimed again


async def test_an_unreadable_payload_is_dead_lettered_without_a_run() -> None:
    worker = ScriptedWorker("persist_decider")
    rig = _rig([worker])
    await rig.db.store.queue_turn(
        "run-1", kind=JOB_KIND, key="agent-1/run-1", company="acme", seat="agent-1",
        payload=b"\xff\xff not a turn", trace_carrier={}, now=T0,
    )  # fmt: skip
    await rig.harness.drain()
    assert rig.record().state is ReflectionState.DEAD_LETTERED and rig.record().reason.startswith("unreadable")
    assert rig.job().state == JobState.DEAD and worker.runs == 0


async def test_a_redelivered_finished_turn_is_not_reflected_again() -> None:
    """Gate 5: a record already final is not taken; the queue row follows it and no worker runs."""
    worker = ScriptedWorker("persist_decider")
    rig = _rig([worker])
    await rig.service.submit(_turn())
    await rig.harness.drain()
    assert worker.runs == 1
    # The queue hands the job out again (an operator's re-queue of a done row, a replica's race).
    rig.job().state = JobState.QUEUED
    assert await rig.harness.drain() == 1
    assert rig.record().state is ReflectionState.COMPLETED and rig.record().attempts == 1
    assert rig.job().state == JobState.DONE and worker.runs == 1


async def test_a_stale_claim_moves_neither_the_job_nor_the_record() -> None:
    """A holder whose claim lapsed and was re-taken cannot finish the turn: the fence refuses the
    queue move, so the record is left to the new holder."""
    worker = ScriptedWorker("persist_decider")
    rig = _rig([worker])
    await rig.service.submit(_turn())
    (stale,) = await rig.db.queue.claim_many(JOB_KIND, "holder-1", T0, 30, 1)
    # The lease lapses and another worker takes it (attempt 2).
    (fresh,) = await rig.db.queue.claim_many(JOB_KIND, "holder-2", T0 + timedelta(seconds=31), 30, 1)
    assert fresh.attempts == 2
    await rig.harness.process(stale)
    # The stale pass ran, but neither row was closed by it: the job is still the new holder's.
    job = rig.job()
    assert (job.state, job.locked_by) == (JobState.RUNNING, "holder-2")
    assert rig.record().state is ReflectionState.RUNNING


async def test_a_fault_of_the_store_mid_pass_retries_the_turn_keeping_what_finished() -> None:
    """The database fails as the pass closes: the close rolls back with its queue move, and the
    turn is put back with backoff (the harness's own fault is a passing one)."""
    worker = ScriptedWorker("persist_decider")
    rig = _rig([worker])
    await rig.service.submit(_turn())
    rig.db.store.fail.add("close")
    await rig.harness.drain()
    record, job = rig.record(), rig.job()
    assert record.state is ReflectionState.RETRYING and "the database went away" in record.reason
    assert (job.state, job.run_after) == (JobState.QUEUED, T0 + timedelta(seconds=10))
    assert rig.db.rollbacks == 1
    _clock(rig).set(job.run_after)
    await rig.harness.drain()
    assert rig.record().state is ReflectionState.COMPLETED and worker.runs == 2


async def test_the_passes_bookkeeping_is_handed_to_the_store_once_a_pass() -> None:
    rig = _rig([ScriptedWorker("persist_decider")])
    await rig.service.submit(_turn())
    await rig.harness.drain()
    assert len(rig.db.store.bookkeeping) == 1 and rig.db.store.bookkeeping[0].closed


async def test_reads_page_newest_first_and_count() -> None:
    rig = _rig([ScriptedWorker("persist_decider")])
    for i in range(3):
        turn = _turn()
        turn.turn_id = f"run-{i}"
        _clock(rig).set(T0 + timedelta(minutes=i))
        await rig.service.submit(turn)
    records, token, total = await rig.service.list("acme", "agent-1", 2, "")
    assert [r.turn_id for r in records] == ["run-2", "run-1"] and total == 3 and token
    rest, token2, _ = await rig.service.list("acme", "agent-1", 2, token)
    assert [r.turn_id for r in rest] == ["run-0"] and not token2


async def test_a_zero_hour_budget_window_still_defers_the_turn_into_the_future() -> None:
    """Config refuses ``window_hours: 0``; the harness reads a window as at least an hour wide (as
    every other reader does) all the same, so a deferred turn is never due again at once: it was
    re-claimed without pause, hundreds of attempts a second."""
    worker = ScriptedWorker("persist_decider")
    settings = _settings(
        company_defaults__token_budget={"seat_ceiling_tokens": 100},
        learning__reflection__budget_recheck_seconds=7200,
    )
    # Past the knob's own check: what the harness does with a window it was handed.
    object.__setattr__(settings.company_defaults.token_budget, "window_hours", 0)
    rig = _rig([worker], settings, FakeBudget(seat_spent=100))
    await rig.service.submit(_turn())
    assert await rig.harness.drain() == 1
    record = rig.record()
    assert record.state is ReflectionState.DEFERRED
    assert record.next_attempt_time == T0 + timedelta(hours=1)  # the next hour, not now
    assert await rig.harness.drain() == 0 and worker.runs == 0  # not due: nothing is claimed


async def test_a_draft_whose_episode_the_episodist_failed_for_good_ends_unstamped_not_retried() -> None:
    """The synthesizer waits for the turn's episode only while the episodist may still record it: a
    final episodist failure (here a refusal) ends the draft unstamped, saying why, and the turn
    completes; it was retried as episode_pending until dead-lettered."""
    episodist = ScriptedWorker("episodist", [WorkerStatus.FAILED])
    synthesizer = Synthesizer(min_tool_calls=3)
    rig = _rig([episodist, synthesizer])  # type: ignore[list-item]
    await rig.service.submit(_turn(tools=("search", "read", "reply")))
    await rig.harness.drain()
    record = rig.record()
    assert record.state is ReflectionState.COMPLETED, record.reason
    drafted = record.workers[1]
    assert drafted.status is WorkerStatus.WROTE
    assert "left unstamped" in drafted.detail and "episodist failed" in drafted.detail


async def test_a_role_that_is_no_identifier_is_refused_at_submit_naming_the_field() -> None:
    """One role rule everywhere: RecordEpisode files the role as an identifier, so a turn of role
    "Tech Lead" would never get an episode; SubmitTurn refuses it naming ``turn.role``."""
    rig = _rig([ScriptedWorker("episodist")])
    with pytest.raises(InvalidArgument) as err:
        await rig.service.submit(_turn(role="Tech Lead"))
    assert (err.value.reason, err.value.metadata.get("field")) == ("FIELD_INVALID", "turn.role")
    assert KEY not in rig.db.state.records
