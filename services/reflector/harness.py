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
from collections import ChainMap
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace

from agentlearn.reflector.v1 import reflector_service_pb2 as pb
from libs.common import telemetry
from libs.common.budgets import window_start
from libs.common.config import Settings
from libs.common.events import EventSink, bookkeeping, current_bookkeeping
from libs.common.jobs import HeldClaim, HeldClaims, Job, keep_claim, listen
from libs.common.metrics import QUEUE_DEPTH, QUEUE_LAG, WORKER_OUTCOMES
from services.reflector.convert import turn_from_pb
from services.reflector.domain import (
    JOB_KIND,
    ORDERED_WORKERS,
    RETRYABLE_FAILURES,
    Gate,
    ReflectionState,
    Turn,
    TurnKey,
    WorkerOutcome,
    WorkerStatus,
    failure_kind_of,
    turn_fields,
    turn_id_of,
)
from services.reflector.ports import Budget, ReflectionQueue, ReflectionStore
from services.reflector.store import merge_outcomes
from services.reflector.workers.base import Worker, WorkerContext, failure_kind, failure_text

__all__ = ["Harness"]

_log = logging.getLogger(__name__)
_tracer = telemetry.tracer("agentlearn.reflector")

_CHECKPOINTS_PER_LEASE = 6
"""A pass still running records the outcomes that finished meanwhile every ``claim_lease_seconds``
divided by this (5 s with the default lease; otherwise they are recorded once, when the pass ends):
a slow worker (a model call of seconds) does not leave the others' finished work to be redone after
a crash, and a pass of ordinary length pays no extra transaction."""


class Harness:
    def __init__(
        self,
        settings: Settings,
        queue: ReflectionQueue,
        store: ReflectionStore,
        workers: Sequence[Worker],
        ctx: WorkerContext,
        budget: Budget,
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
        self._claims = HeldClaims()
        """The turns this process is reflecting, re-checked at once when an erasure takes some
        (``run_forever`` watches them): a pass whose turn an erasure took stops writing there and
        then, not at its next renewal. Each settle of a pass is marked in it (``settling``) so that
        a notice about someone else's turn never stops what follows that settle."""

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
        # At least an hour wide, as the prefetch reads it: a window of 0 would end before now, and a
        # deferred turn would be claimed again at once, without pause.
        next_window = window_start(now, config.window_hours) + timedelta(hours=max(1, config.window_hours))
        return min(next_window, now + timedelta(seconds=self._config.budget_recheck_seconds))

    # ------------------------------------------------------------------ one job

    async def process(self, job: Job) -> str:
        """Reflect one claimed turn; returns the record's state after this attempt.

        The bookkeeping rows of the pass — its own events and those of the services it calls in
        this process, and the auxiliary model's token charges — are held and written together in one
        statement when the pass ends (``libs.common.events.bookkeeping``): one commit a turn instead
        of one per row (a dozen a turn). Best-effort, as each row alone was: a pass that dies with
        its process loses them, never a lesson."""
        token = otel_context.attach(telemetry.restore_context(job.trace_carrier))
        try:
            return await self._process_job(job)
        finally:
            otel_context.detach(token)

    async def _process_job(self, job: Job) -> str:
        try:
            turn = turn_from_pb(pb.TurnCompleted.FromString(job.payload))
        except Exception as exc:
            # Nothing to retry: the same bytes will never read better.
            _log.error("job %s holds no readable turn (%s); dead-lettering it", job.id, exc)
            with self._claims.settling(job):
                async with self._store.transaction() as conn:
                    reason = f"unreadable: {exc}"[:1000]
                    if await self._queue.dead_letter(conn, job, self._worker_id, self._clock.now(), reason):
                        key = TurnKey(job.company, job.seat, turn_id_of(job.key))
                        await self._store.dead_letter(conn, key, reason, None, self._clock.now())
            return ReflectionState.DEAD_LETTERED
        with (
            _tracer.start_as_current_span(
                "reflect",
                attributes={
                    "agentlearn.company": turn.company,
                    "agentlearn.seat": turn.seat,
                    "agentlearn.turn_id": turn.turn_id,
                    "agentlearn.attempt": job.attempts,
                },
            ),
            bookkeeping() as batch,
        ):
            try:
                return await self._process(job, turn)
            except Exception as exc:
                # Not a worker's failure (those are recorded): the store or the queue. Put the
                # turn back with backoff if the database answers; else its claim lapses and it
                # is taken again. Nothing it wrote is written twice.
                _log.exception("reflection of %s failed (attempt %s)", turn.turn_id, job.attempts)
                with contextlib.suppress(Exception):
                    record = await self._store.get(*turn.key)
                    workers = record.workers if record else []
                    return await self._retry_or_dead_letter(job, turn, workers, failure_text(exc))
                raise
            finally:
                await self._store.write_bookkeeping(batch)

    async def _process(self, job: Job, turn: Turn) -> str:
        now = self._clock.now()
        # The take: RUNNING and one more attempt, in one statement that also reads the record as it
        # was (its outcomes so far, its attempts). A finished record is not taken.
        record, taken = await self._store.take(*turn.key)
        if record is None:
            # No record: an erasure took the turn (it deletes the record and closes the job, taking
            # this claim) after this worker claimed it. Nothing runs: a pass now would write her
            # note, episode and profile back after the erasure succeeded. (Every queued turn has
            # its record, inserted with the job in one statement.) The finish is a no-op when the
            # claim is gone, as the erasure leaves it.
            with self._claims.settling(job):
                async with self._store.transaction() as conn:
                    await self._queue.finish(conn, job, self._worker_id, now)
            _log.info("turn %s was erased before its pass; nothing reflected", turn.turn_id)
            return ReflectionState.ERASED
        if not taken:
            # Gate 5: reflected already (a redelivery): never a second pass; the queue row follows
            # the record's final state.
            with self._claims.settling(job):
                async with self._store.transaction() as conn:
                    await self._queue.finish(conn, job, self._worker_id, now)
            return record.state
        gate = self._static_gate(turn)
        if gate is None:
            later = await self._budget_gate(turn, now)
            if later is not None:
                with self._claims.settling(job):
                    async with self._store.transaction() as conn:
                        if await self._queue.defer(conn, job, self._worker_id, later):
                            await self._store.defer(conn, turn.key, Gate.NO_BUDGET, later)
                return ReflectionState.DEFERRED
        if gate is None and not turn.engaged:
            gate = Gate.NO_ENGAGEMENT
        if gate is not None:
            await self._finish(job, turn, ReflectionState.GATED, gate, [])
            return ReflectionState.GATED
        recorded = list(record.workers)
        known = {w.worker: w for w in recorded}
        # A worker with a final outcome recorded is not run again (its write is in); the others run,
        # side by side.
        to_run = [w for w in self._workers if w.name not in known or known[w.name].retryable]
        first_pass = record.attempts == 0  # no pass of this turn started before
        fresh = await self._run_workers(turn, to_run, first_pass, known)
        outcomes = [fresh.get(w.name) or known[w.name] for w in self._workers]
        # The record's whole list: what it held, each worker's new outcome in its place.
        workers = merge_outcomes(recorded, [fresh[w.name] for w in to_run])
        unfinished = [o for o in outcomes if o.retryable]
        if unfinished:
            reason = "; ".join(f"{o.worker}: {o.failure}" for o in unfinished)
            return await self._retry_or_dead_letter(job, turn, workers, reason)
        await self._finish(job, turn, ReflectionState.COMPLETED, None, outcomes, workers)
        return ReflectionState.COMPLETED

    async def _run_workers(
        self,
        turn: Turn,
        workers: list[Worker],
        first_pass: bool,
        known: Mapping[str, WorkerOutcome] | None = None,
    ) -> dict[str, WorkerOutcome]:
        """Run ``workers`` side by side, each under its own failure isolation; their outcomes by
        name. The outcomes are recorded by the caller in the transaction that ends the pass; a pass
        still running records what has finished meanwhile (``_CHECKPOINTS_PER_LEASE``), so a crash
        redoes little (and nothing twice: the receivers are idempotent). Each worker reads the
        outcomes known so far (``known``, recorded by earlier passes, under this pass's own)."""
        done: dict[str, WorkerOutcome] = {}
        ctx = dataclasses.replace(self._ctx, first_pass=first_pass, outcomes=ChainMap(done, dict(known or {})))
        finished = {w.name: asyncio.Event() for w in workers}
        order = [w.name for w in self._workers]

        async def one(worker: Worker) -> None:
            # A worker that depends on another (``ORDERED_WORKERS``) keeps the configured order with
            # it: it starts once the one wired before it (if that runs in this pass) has finished.
            for other, event in finished.items():
                if frozenset({other, worker.name}) in ORDERED_WORKERS and order.index(other) < order.index(worker.name):
                    await event.wait()
            started = time.perf_counter()
            try:
                outcome = await self._run_worker(worker, turn, ctx)
            finally:
                finished[worker.name].set()  # a worker waiting on this one goes on, whatever happened
            outcome.duration_ms = int((time.perf_counter() - started) * 1000)
            WORKER_OUTCOMES.add(1, {"agentlearn.worker": worker.name, "agentlearn.worker.status": str(outcome.status)})
            done[worker.name] = outcome

        tasks = [asyncio.create_task(one(w)) for w in workers]
        saved: set[str] = set()
        every = self._config.claim_lease_seconds / _CHECKPOINTS_PER_LEASE
        try:
            pending: set[asyncio.Task[None]] = set(tasks)
            while pending:
                _, pending = await asyncio.wait(pending, timeout=every)
                new = [o for name, o in done.items() if name not in saved]
                if pending and new:
                    try:
                        await self._store.put_workers(*turn.key, new)
                        saved.update(o.worker for o in new)
                    except Exception as exc:  # the pass's own record at its end is what counts
                        _log.warning("could not checkpoint the workers of %s (%s)", turn.turn_id, exc)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        for task in tasks:
            task.result()  # what no worker's isolation catches (a cancellation) is not swallowed
        return done

    def backoff(self, attempts: int) -> timedelta:
        """The wait before attempt ``attempts + 1``: doubling from ``retry_backoff_seconds``."""
        seconds = self._config.retry_backoff_seconds * 2 ** max(0, attempts - 1)
        return timedelta(seconds=min(seconds, self._config.retry_backoff_max_seconds))

    async def _retry_or_dead_letter(self, job: Job, turn: Turn, workers: list[WorkerOutcome], reason: str) -> str:
        """Back on the queue after a passing fault, or dead-lettered once ``max_attempts`` are spent;
        ``workers`` (the record's whole list of outcomes) is recorded in the same transaction."""
        now = self._clock.now()
        reason = reason[:1000]
        if job.attempts >= self._config.max_attempts:
            reason = f"gave up after {job.attempts} attempts: {reason}"[:1000]
            # Given up: what was still to be retried is now the worker's final outcome.
            final = [dataclasses.replace(o, status=WorkerStatus.FAILED) if o.retryable else o for o in workers]
            with self._claims.settling(job):
                async with self._store.transaction() as conn:
                    if not await self._queue.dead_letter(conn, job, self._worker_id, now, reason):
                        _log.warning("lost the claim on %s before dead-lettering it", turn.turn_id)
                        return ReflectionState.RUNNING
                    await self._store.dead_letter(conn, turn.key, reason, final, now)
            _log.error("reflection of %s/%s dead-lettered: %s", turn.seat, turn.turn_id, _said(workers, reason))
            await self._events.emit(
                "reflection_dead_lettered",
                **turn_fields(turn),
                attempts=job.attempts,
                reason=reason,
            )
            return ReflectionState.DEAD_LETTERED
        until = now + self.backoff(job.attempts)
        # Settled by us from here (as every settle of the pass): a revocation notice of someone
        # else's turn must not stop the pass's bookkeeping after this commit (its token charges).
        with self._claims.settling(job):
            async with self._store.transaction() as conn:
                if not await self._queue.retry(conn, job, self._worker_id, until, reason):
                    _log.warning("lost the claim on %s before re-queueing it", turn.turn_id)
                    return ReflectionState.RUNNING
                await self._store.retrying(conn, turn.key, reason, until, workers)
        _log.warning(
            "reflection of %s/%s retries at %s: %s", turn.seat, turn.turn_id, until.isoformat(), _said(workers, reason)
        )
        await self._events.emit(
            "reflection_retrying",
            **turn_fields(turn),
            attempts=job.attempts,
            next_attempt_time=until.isoformat(),
            reason=reason,
        )
        return ReflectionState.RETRYING

    async def _run_worker(self, worker: Worker, turn: Turn, ctx: WorkerContext) -> WorkerOutcome:
        try:
            gate = worker.gate(turn)
        except Exception as exc:
            _log.exception("worker %s gate raised for %s", worker.name, turn.turn_id)
            return WorkerOutcome(worker.name, WorkerStatus.FAILED, failure=failure_text(exc)[:500])
        if gate is not None:
            return WorkerOutcome(worker.name, WorkerStatus.SKIPPED, gate=gate)
        with _tracer.start_as_current_span(
            f"worker {worker.name}",
            attributes={
                "agentlearn.company": turn.company,
                "agentlearn.seat": turn.seat,
                "agentlearn.turn_id": turn.turn_id,
                "agentlearn.worker": worker.name,
            },
        ) as span:
            try:
                outcome = await worker.run(turn, ctx)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # One worker's failure costs neither the others nor the record; a passing one is
                # not its final outcome.
                kind = failure_kind(exc)
                status = WorkerStatus.RETRYING if kind in RETRYABLE_FAILURES else WorkerStatus.FAILED
                # The kind and the exception's type, not its text: an owner's refusal quotes the
                # value it refused (a person's handle, a note's words), and a log is where no
                # erasure reaches; the text is in the record's failure, which one does.
                _log.warning("worker %s %s on %s: %s (%s)", worker.name, status, turn.turn_id, kind, type(exc).__name__)
                span.set_status(trace.Status(trace.StatusCode.ERROR, kind))
                return WorkerOutcome(worker.name, status, failure=failure_text(exc)[:500])
            span.set_attribute("agentlearn.worker.status", str(outcome.status))
            return outcome

    async def _finish(
        self,
        job: Job,
        turn: Turn,
        state: ReflectionState,
        gate: Gate | None,
        outcomes: list[WorkerOutcome],
        workers: list[WorkerOutcome] | None = None,
    ) -> None:
        """Close the record (with ``workers``, its whole list of outcomes, when the pass ran any) and
        finish the job, together and fenced by the claim (one statement: ``finish_and_close``).

        ``reflection_completed`` is announced to the pass's bookkeeping batch first: the Postgres
        store writes it, with the pass's other held rows, in that same statement and only if the job
        finished (no statement of its own; a stale claim writes none). A store that did not carry
        it (an in-memory one, a combined statement refused) leaves it to be emitted here, as before."""
        now = self._clock.now()
        completed: dict[str, Any] = {
            **turn_fields(turn),
            "state": state,
            "gate": str(gate) if gate else None,
            "workers": {o.worker: str(o.status) for o in outcomes},
            "failures": {o.worker: o.failure for o in outcomes if o.failure},
        }
        batch = current_bookkeeping()
        if batch is not None:
            batch.announce("reflection_completed", now, **completed)
        try:
            with self._claims.settling(job):
                finished = await self._store.finish_and_close(job, self._worker_id, turn.key, state, gate, now, workers)
        finally:
            unwritten = batch.withdraw() if batch is not None else True
        if not finished:
            # Our claim lapsed and another worker took the turn; it completes the record.
            _log.warning("lost the claim on %s before finishing; leaving it to its new holder", turn.turn_id)
            return
        if unwritten:
            await self._events.emit("reflection_completed", **completed)

    # ------------------------------------------------------------------ the loop

    async def drain(self) -> int:
        """Reflect every turn that is claimable now, ``concurrency`` at once; returns how many
        were taken."""
        return await self._dispatch(forever=False)

    async def _dispatch(self, *, forever: bool) -> int:
        """Claim turns in batches and reflect them side by side, at most ``concurrency`` at once.

        While the queue has a backlog, a claim waits until a quarter of the slots are free and
        takes that many in one statement; once a claim comes back short (the queue is empty) the
        next waits for a wake (a submit's NOTIFY), the poll interval or, draining, for the last
        turn to finish. ``forever`` is the worker loop: it never returns."""
        limit = max(1, self._config.concurrency)
        batch = max(1, limit // 4)
        running: set[asyncio.Task[None]] = set()
        taken = 0
        backlog = True  # the last claim came back full: there may be more
        waker: asyncio.Task[bool] | None = None
        try:
            while True:
                room = limit - len(running)
                if room and (not running or (backlog and room >= batch) or self._wake.is_set()):
                    self._wake.clear()  # cleared before looking: a wake that arrives meanwhile is kept
                    try:
                        jobs = await self._queue.claim_many(
                            JOB_KIND, self._worker_id, self._clock.now(), self._config.claim_lease_seconds, room
                        )
                    except Exception as exc:
                        if not forever:
                            raise
                        _log.warning("reflection queue unreadable (%s); retrying", exc)
                        jobs = []
                    backlog = len(jobs) == room
                    taken += len(jobs)
                    for job in jobs:
                        if job.attempts == 1:  # enqueue to first claim; a retry's wait is its backoff
                            lag = (self._clock.now() - job.create_time).total_seconds()
                            QUEUE_LAG.record(max(0.0, lag), {"agentlearn.job.kind": JOB_KIND})
                        running.add(asyncio.create_task(self._run_claimed(job)))
                    if not running and not forever:
                        return taken
                waiting: set[asyncio.Task[object]] = set(running)
                if len(running) < limit:  # a wake matters only with a free slot
                    if waker is None or waker.done():
                        waker = asyncio.create_task(self._wake.wait())
                    waiting.add(waker)
                done, _ = await asyncio.wait(
                    waiting,
                    timeout=None if running or not forever else self._config.poll_interval_seconds,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                running -= done
                if not done and forever:  # the poll backstop
                    self._wake.set()
        finally:
            if waker is not None:
                waker.cancel()
            for task in running:
                task.cancel()  # stopping: each hands its turn back (``_run_claimed``)
            if running:
                await asyncio.gather(*running, return_exceptions=True)

    async def _run_claimed(self, job: Job) -> None:
        with self._claims.holding(job) as claim:
            work = asyncio.create_task(self.process(job))
            renew = asyncio.create_task(self._keep_claim(job, work, claim))
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
                if claim.lost.is_set():
                    # An erasure took the turn (its record deleted, its job emptied): the pass stops
                    # where it was, and nothing more derived from the person is written.
                    _log.warning("job %s was erased while it was reflected; its pass stopped", job.id)
                else:
                    # The claim went to another worker (ours lapsed): it runs the turn; we stop
                    # here rather than spend a second round of model calls on it.
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
                with self._claims.settling(job):
                    async with self._store.transaction() as conn:
                        if await self._queue.defer(conn, job, self._worker_id, self._clock.now()):
                            await self._store.requeued(conn, TurnKey(job.company, job.seat, turn_id_of(job.key)))
        except Exception as exc:  # best effort: the lease lapses otherwise
            _log.warning("could not hand back job %s on stopping (%s); its claim will lapse", job.id, exc)

    async def _keep_claim(self, job: Job, work: asyncio.Task[str], claim: HeldClaim) -> bool:
        return await keep_claim(
            self._queue,
            job,
            self._worker_id,
            self._clock,
            self._config.claim_lease_seconds,
            work,
            claim,
        )

    def wake(self) -> None:
        self._wake.set()

    async def run_forever(self, dsn: str) -> None:
        """The worker loop: woken by NOTIFY (``libs.common.jobs.listen``), polling as the backstop,
        ``concurrency`` turns at a time; the claims it holds re-checked whenever an erasure revokes
        some (``libs.common.jobs.HeldClaims``)."""
        async with asyncio.TaskGroup() as group:
            group.create_task(listen(dsn, [JOB_KIND], self._wake.set, on_revoke=self._claims.revoked))
            group.create_task(self._claims.watch(self._queue, self._worker_id))
            group.create_task(self._sample_depth())
            group.create_task(self._dispatch(forever=True))

    async def _sample_depth(self, every: float = 15.0) -> None:
        """``agentlearn.queue.depth`` (what the reflector's autoscaler scales on), sampled."""
        while True:
            try:
                QUEUE_DEPTH.set(await self._queue.pending(JOB_KIND), {"agentlearn.job.kind": JOB_KIND})
            except Exception as exc:
                _log.debug("queue depth unreadable: %s", exc)
            await asyncio.sleep(every)


def _said(workers: list[WorkerOutcome], reason: str) -> str:
    """What a log line says of a pass's failures: each unfinished worker's failure kind (or the
    pass's own, when no worker's is left), never the failure's text — the record and the event
    keep that, and an erasure reaches them; a log it does not."""
    kinds = [f"{o.worker}: {failure_kind_of(o.failure)}" for o in workers if o.failure and o.retryable]
    return "; ".join(kinds) or failure_kind_of(reason)
