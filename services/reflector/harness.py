"""The deterministic harness: claims queued turns, runs the gates in the spec's order, then the
workers, each under its own failure isolation, and always completes the turn's record.

Gates, in order (spec "7. Reflector", "Gates, in order"), each reported by name:

1. no workers — nothing is wired;
2. no role — the turn's role is not one this company has;
3. opted out — the role's ``learning_enabled`` (unset inherits ``learning.enabled``);
4. no budget — the seat or the company is at its ceiling. The only transient gate: the turn goes
   back on the queue and runs when the window rolls over or the ceiling moves. A counter that
   cannot be read reflects anyway: unknown is not "no";
5. duplicate — a run id is reflected once, durably: the queue holds one job per seat and run id
   (SubmitTurn says so) and a finished record is never run again, across restarts and replicas;
6. no engagement — skipped, or done having called no tool;
7. per-worker skip — each worker states its own applicability.

No lesson is lost to a passing fault. A worker that fails for a retryable reason (a service
unavailable, out of time or shedding load; the model rate-limited, timing out, erroring or
unreachable: ``RETRYABLE_FAILURES``) is recorded ``retrying``, not finished; once every worker has
run, the turn goes back on the queue with backoff (``retry_backoff_seconds``, doubling, at most
``retry_backoff_max_seconds``) and the next attempt runs only the workers that have not finished.
After ``max_attempts`` attempts it is dead-lettered with its reason. The same holds for a fault of
the harness itself (the database gone mid-pass): the turn is retried, or its claim lapses and it is
taken again.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Sequence
from datetime import datetime, timedelta

from opentelemetry import context as otel_context
from opentelemetry import trace

from agentlearn.reflector.v1 import reflector_service_pb2 as pb
from libs.common import telemetry
from libs.common.budgets import BudgetLedger, window_start
from libs.common.config import Settings
from libs.common.events import EventSink
from libs.common.jobs import Job, JobQueue, listen
from services.reflector.convert import turn_from_pb
from services.reflector.domain import (
    JOB_KIND,
    RETRYABLE_FAILURES,
    Gate,
    Turn,
    WorkerOutcome,
    WorkerStatus,
    turn_id_of,
)
from services.reflector.store import PostgresReflectionStore
from services.reflector.workers.base import Worker, WorkerContext, failure_kind

__all__ = ["Harness"]

_log = logging.getLogger(__name__)
_tracer = telemetry.tracer("agentlearn.reflector")


class Harness:
    def __init__(
        self,
        settings: Settings,
        queue: JobQueue,
        store: PostgresReflectionStore,
        workers: Sequence[Worker],
        ctx: WorkerContext,
        budget: BudgetLedger,
        events: EventSink,
        worker_id: str,
    ):
        self._settings = settings
        self._config = settings.learning.reflection
        self._queue = queue
        self._store = store
        self._workers = list(workers)
        self._ctx = ctx
        self._budget = budget
        self._events = events
        self._worker_id = worker_id
        self._clock = ctx.clock
        self._wake = asyncio.Event()

    @property
    def workers(self) -> list[str]:
        return [w.name for w in self._workers]

    # ------------------------------------------------------------------ gates

    def _static_gate(self, turn: Turn) -> Gate | None:
        if not self._workers:
            return Gate.NO_WORKERS
        company = self._settings.company(turn.company)
        role = company.roles.get(turn.role)
        if role is None and not (turn.role and company.accept_unknown_roles):
            return Gate.NO_ROLE
        # The opt-out decision rides on the event when the engine made it (spec: "everything the
        # gates read rides on the turn_completed payload"); else the role's setting, which inherits.
        enabled = turn.learning_enabled
        if enabled is None and role is not None:
            enabled = role.learning_enabled
        if enabled is None:
            enabled = self._settings.learning.enabled
        if not enabled:
            return Gate.OPTED_OUT
        return None

    async def _budget_gate(self, turn: Turn, now: datetime) -> datetime | None:
        """When the turn should be looked at again if the budget is spent; None to go ahead."""
        config = self._settings.company(turn.company).token_budget
        if config.seat_ceiling_tokens is None and config.company_ceiling_tokens is None:
            return None
        try:
            room = await self._budget.room(turn.company, turn.seat, now, config)
        except Exception as exc:  # unknown is not "no": a coordination blip must not stop learning
            _log.warning("budget counter unreadable for %s/%s (%s); reflecting anyway", turn.company, turn.seat, exc)
            return None
        if not room.exhausted:
            return None
        next_window = window_start(now, config.window_hours) + timedelta(hours=config.window_hours)
        return min(next_window, now + timedelta(seconds=self._config.budget_recheck_seconds))

    # ------------------------------------------------------------------ one job

    async def process(self, job: Job) -> str:
        """Reflect one claimed turn; returns the record's state after this attempt."""
        token = otel_context.attach(telemetry.restore_context(job.trace_carrier))
        try:
            try:
                turn = turn_from_pb(pb.TurnCompleted.FromString(job.payload))
            except Exception as exc:
                # Nothing to retry: the same bytes will never read better.
                _log.error("job %s holds no readable turn (%s); dead-lettering it", job.id, exc)
                async with self._store.pool.acquire() as conn, conn.transaction():
                    await self._queue.dead_letter(conn, job, self._worker_id, self._clock.now(), f"unreadable: {exc}")
                return "dead_lettered"
            with _tracer.start_as_current_span(
                "reflect",
                attributes={
                    "company": turn.company,
                    "seat": turn.seat,
                    "turn_id": turn.turn_id,
                    "attempt": job.attempts,
                },
            ):
                try:
                    return await self._process(job, turn)
                except Exception as exc:
                    # Not a worker's failure (those are recorded): the store or the queue. Put the
                    # turn back with backoff if the database answers; else its claim lapses and it
                    # is taken again. Nothing it wrote is written twice.
                    _log.exception("reflection of %s failed (attempt %s)", turn.turn_id, job.attempts)
                    with contextlib.suppress(Exception):
                        record = await self._store.get(turn.company, turn.seat, turn.turn_id)
                        workers = record.workers if record else []
                        return await self._retry_or_dead_letter(job, turn, workers, f"{failure_kind(exc)}: {exc}")
                    raise
        finally:
            otel_context.detach(token)

    async def _process(self, job: Job, turn: Turn) -> str:
        now = self._clock.now()
        record = await self._store.get(turn.company, turn.seat, turn.turn_id)
        if record is not None and record.state in ("completed", "gated"):
            # Gate 5: reflected already (a redelivery): never a second pass.
            async with self._store.pool.acquire() as conn, conn.transaction():
                await self._queue.finish(conn, job, self._worker_id, now)
            return record.state
        gate = self._static_gate(turn)
        if gate is None:
            later = await self._budget_gate(turn, now)
            if later is not None:
                async with self._store.pool.acquire() as conn, conn.transaction():
                    if await self._queue.defer(conn, job, self._worker_id, later):
                        await self._store.defer(conn, turn.company, turn.seat, turn.turn_id, Gate.NO_BUDGET, later)
                return "deferred"
        if gate is None and not turn.engaged:
            gate = Gate.NO_ENGAGEMENT
        if gate is not None:
            await self._finish(job, turn, "gated", gate, [])
            return "gated"
        await self._store.start(turn.company, turn.seat, turn.turn_id)
        known = {w.worker: w for w in (record.workers if record else [])}
        outcomes: list[WorkerOutcome] = []
        for worker in self._workers:
            prior = known.get(worker.name)
            if prior is not None and not prior.retryable:  # finished before: its write is in
                outcomes.append(prior)
                continue
            started = time.perf_counter()
            outcome = await self._run_worker(worker, turn)
            outcome.duration_ms = int((time.perf_counter() - started) * 1000)
            # Recorded the moment it is known: a pass resumed after a crash skips this worker
            # (unless it failed for a passing reason: then it runs again).
            await self._store.put_worker(turn.company, turn.seat, turn.turn_id, outcome)
            outcomes.append(outcome)
        unfinished = [o for o in outcomes if o.retryable]
        if unfinished:
            reason = "; ".join(f"{o.worker}: {o.failure}" for o in unfinished)
            return await self._retry_or_dead_letter(job, turn, outcomes, reason)
        await self._finish(job, turn, "completed", None, outcomes)
        return "completed"

    def backoff(self, attempts: int) -> timedelta:
        """The wait before attempt ``attempts + 1``: doubling from ``retry_backoff_seconds``."""
        seconds = self._config.retry_backoff_seconds * 2 ** max(0, attempts - 1)
        return timedelta(seconds=min(seconds, self._config.retry_backoff_max_seconds))

    async def _retry_or_dead_letter(self, job: Job, turn: Turn, outcomes: list[WorkerOutcome], reason: str) -> str:
        """Back on the queue after a passing fault, or dead-lettered once ``max_attempts`` are spent."""
        now = self._clock.now()
        reason = reason[:1000]
        if job.attempts >= self._config.max_attempts:
            reason = f"gave up after {job.attempts} attempts: {reason}"[:1000]
            # Given up: what was still to be retried is now the worker's final outcome.
            final = [dataclasses.replace(o, status=WorkerStatus.FAILED) if o.retryable else o for o in outcomes]
            async with self._store.pool.acquire() as conn, conn.transaction():
                if not await self._queue.dead_letter(conn, job, self._worker_id, now, reason):
                    _log.warning("lost the claim on %s before dead-lettering it", turn.turn_id)
                    return "running"
                await self._store.dead_letter(conn, turn.company, turn.seat, turn.turn_id, reason, final, now)
            _log.error("reflection of %s/%s dead-lettered: %s", turn.seat, turn.turn_id, reason)
            await self._events.emit(
                "reflection_dead_lettered",
                company=turn.company,
                seat=turn.seat,
                turn_id=turn.turn_id,
                attempts=job.attempts,
                reason=reason,
            )
            return "dead_lettered"
        until = now + self.backoff(job.attempts)
        async with self._store.pool.acquire() as conn, conn.transaction():
            if not await self._queue.retry(conn, job, self._worker_id, until, reason):
                _log.warning("lost the claim on %s before re-queueing it", turn.turn_id)
                return "running"
            await self._store.retrying(conn, turn.company, turn.seat, turn.turn_id, reason, until)
        _log.warning("reflection of %s/%s retries at %s: %s", turn.seat, turn.turn_id, until.isoformat(), reason)
        await self._events.emit(
            "reflection_retrying",
            company=turn.company,
            seat=turn.seat,
            turn_id=turn.turn_id,
            attempts=job.attempts,
            next_attempt_time=until.isoformat(),
            reason=reason,
        )
        return "retrying"

    async def _run_worker(self, worker: Worker, turn: Turn) -> WorkerOutcome:
        try:
            gate = worker.gate(turn)
        except Exception as exc:
            _log.exception("worker %s gate raised for %s", worker.name, turn.turn_id)
            return WorkerOutcome(worker.name, WorkerStatus.FAILED, failure=f"{failure_kind(exc)}: {exc}"[:500])
        if gate is not None:
            return WorkerOutcome(worker.name, WorkerStatus.SKIPPED, gate=gate)
        with _tracer.start_as_current_span(
            f"worker {worker.name}",
            attributes={"company": turn.company, "seat": turn.seat, "turn_id": turn.turn_id, "worker": worker.name},
        ) as span:
            try:
                outcome = await worker.run(turn, self._ctx)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # One worker's failure costs neither the others nor the record; a passing one is
                # not its final outcome.
                kind = failure_kind(exc)
                status = WorkerStatus.RETRYING if kind in RETRYABLE_FAILURES else WorkerStatus.FAILED
                _log.warning("worker %s %s on %s: %s: %s", worker.name, status, turn.turn_id, kind, exc)
                span.set_status(trace.Status(trace.StatusCode.ERROR, kind))
                return WorkerOutcome(worker.name, status, failure=f"{kind}: {exc}"[:500])
            span.set_attribute("status", str(outcome.status))
            return outcome

    async def _finish(self, job: Job, turn: Turn, state: str, gate: Gate | None, outcomes: list[WorkerOutcome]) -> None:
        now = self._clock.now()
        async with self._store.pool.acquire() as conn, conn.transaction():
            if not await self._queue.finish(conn, job, self._worker_id, now):
                # Our claim lapsed and another worker took the turn; it completes the record.
                _log.warning("lost the claim on %s before finishing; leaving it to its new holder", turn.turn_id)
                return
            await self._store.close(conn, turn.company, turn.seat, turn.turn_id, state, gate, now)
        await self._events.emit(
            "reflection_completed",
            company=turn.company,
            seat=turn.seat,
            turn_id=turn.turn_id,
            state=state,
            gate=str(gate) if gate else None,
            workers={o.worker: str(o.status) for o in outcomes},
            failures={o.worker: o.failure for o in outcomes if o.failure},
        )

    # ------------------------------------------------------------------ the loop

    async def drain(self) -> int:
        """Reflect every turn that is claimable now; returns how many were taken."""
        taken = 0
        while True:
            job = await self._queue.claim(
                JOB_KIND, self._worker_id, self._clock.now(), self._config.claim_lease_seconds
            )
            if job is None:
                return taken
            taken += 1
            await self._run_claimed(job)

    async def _run_claimed(self, job: Job) -> None:
        work = asyncio.create_task(self.process(job))
        renew = asyncio.create_task(self._keep_claim(job, work))
        try:
            await work
        except asyncio.CancelledError:
            if not (renew.done() and renew.result() is False):
                # We are stopping (shutdown): hand the turn back now rather than make the next
                # process wait out the lease. The attempt is given back; what finished is kept.
                work.cancel()
                await asyncio.wait([work])
                await self._release(job)
                raise
            # The claim went to another worker (ours lapsed): it runs the turn; we stop here
            # rather than spend a second round of model calls on it.
            _log.warning("lost the claim on job %s; its new holder reflects it", job.id)
        except Exception:
            # The database did not answer even to put the turn back: its claim lapses and the
            # turn is taken again.
            _log.exception("reflection of job %s failed; it will be taken again", job.id)
        finally:
            renew.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renew

    async def _release(self, job: Job) -> None:
        try:
            async with asyncio.timeout(2):
                async with self._store.pool.acquire() as conn, conn.transaction():
                    if await self._queue.defer(conn, job, self._worker_id, self._clock.now()):
                        await self._store.requeued(conn, job.company, job.seat, turn_id_of(job.key))
        except Exception as exc:  # best effort: the lease lapses otherwise
            _log.warning("could not hand back job %s on stopping (%s); its claim will lapse", job.id, exc)

    async def _keep_claim(self, job: Job, work: asyncio.Task) -> bool:
        lease = self._config.claim_lease_seconds
        while True:
            await asyncio.sleep(lease / 3)
            try:
                held = await self._queue.renew(job, self._worker_id, self._clock.now(), lease)
            except Exception as exc:
                _log.warning("could not renew the claim on job %s: %s", job.id, exc)
                continue
            if not held:
                work.cancel()
                return False

    def wake(self) -> None:
        self._wake.set()

    async def run_forever(self, dsn: str) -> None:
        """The worker loop: woken by NOTIFY (``libs.common.jobs.listen``), polling as the backstop,
        ``concurrency`` turns at a time."""
        async with asyncio.TaskGroup() as group:
            group.create_task(listen(dsn, [JOB_KIND], self._wake.set))
            for _ in range(max(1, self._config.concurrency)):
                group.create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            # Cleared before looking, so a wake that arrives while draining is not lost.
            self._wake.clear()
            try:
                taken = await self.drain()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                _log.warning("reflection queue unreadable (%s); retrying", exc)
                taken = 0
            if taken == 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self._config.poll_interval_seconds)
