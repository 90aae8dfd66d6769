"""The background worker of the learning checks: jobs of kind ``learning`` in the shared
``background_jobs`` queue (``libs.common.jobs``).

Spec: "The worker polls every 15 seconds, claims jobs atomically and resumes queued work after
restart. In-flight checks interrupted by restart are reported as interrupted, not silently
declared successful or automatically replayed."

- Polling every ``sessions.poll_interval_seconds``; LISTEN/NOTIFY wakes it sooner when a check is
  queued.
- Claims with ``reclaim_lapsed=False``: a check whose process died (its lease lapsed) is never
  taken again. Each sweep turns such jobs INTERRUPTED (``interrupt_lapsed``) and their receipts
  ``interrupted``, with the reason; CheckRecentWork reviews the session again when a person wants.
- Queued checks survive a restart in the table and are claimed by the next worker.
- A check's end and its job's end commit in one transaction. A worker that lost its claim (its
  lease lapsed while it was still running) records nothing over the interrupted receipt but what
  it wrote, so the receipt stays true.
- An erasure that deletes a running check's job (its session's person is forgotten) revokes the
  claim with a NOTIFY; the worker re-checks its claims at once and stops that check before it
  writes anything more of hers (``libs.common.jobs.HeldClaims``). A check this worker settles
  itself is marked so first (``HeldClaims.settling``): a notice about someone else's jobs never
  stops its closing event.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from dataclasses import dataclass, field

from opentelemetry import context as otel_context

from libs.common import telemetry
from libs.common.attributes import agentlearn_attributes
from libs.common.clock import Clock
from libs.common.config import SessionsConfig
from libs.common.events import EventSink
from libs.common.jobs import ClaimingWorker, HeldClaims, Job, JobQueue, JobState, listen, serve
from libs.common.metrics import LEARNING_CHECKS, record_queue_depth, record_queue_lag
from services.sessions.checks import CheckRunner
from services.sessions.domain import JOB_KIND, CheckOutcome, CheckState, LearningCheck
from services.sessions.store import PostgresSessionStore

__all__ = ["INTERRUPTED_REASON", "LearningWorker"]

_log = logging.getLogger(__name__)
_tracer = telemetry.tracer("agentlearn.sessions")

INTERRUPTED_REASON = (
    "the process running this check stopped before it finished (a restart or a crash); it is not replayed on "
    "its own: use Check recent work to review the session again"
)
RECONCILE_LIMIT = 500


def _count_check(check: LearningCheck) -> None:
    """One finished check in ``LEARNING_CHECKS``, by its trigger and outcome."""
    LEARNING_CHECKS.add(1, agentlearn_attributes(trigger=str(check.trigger), outcome=str(check.outcome)))


@dataclass(eq=False)
class LearningWorker(ClaimingWorker):
    """Runs the claimed learning checks; ``drain`` runs every check claimable now, and a lapsed
    claim is never taken again (it is reported interrupted)."""

    kind = JOB_KIND
    reclaim_lapsed = False
    when_lost = "it is reported interrupted"
    store: PostgresSessionStore
    queue: JobQueue
    runner: CheckRunner
    config: SessionsConfig
    clock: Clock
    events: EventSink
    worker_id: str
    _wake: asyncio.Event = field(default_factory=asyncio.Event, init=False)
    _claims: HeldClaims = field(default_factory=HeldClaims, init=False, repr=False)
    """The checks this process runs, re-checked at once when an erasure deletes jobs of theirs: a
    check of an erased person's session stops before it writes her lessons and facts."""

    # ------------------------------------------------------------------ interrupted checks

    async def sweep(self) -> int:
        """Report every check whose process died: its job INTERRUPTED, its receipt ``interrupted``."""
        now = self.clock.now()
        reported = 0
        for job in await self.queue.interrupt_lapsed(JOB_KIND, now):
            if check := await self.store.interrupt_check(job.company, job.key, INTERRUPTED_REASON, now):
                reported += 1
                await self._interrupted(check, INTERRUPTED_REASON)
        return reported

    async def _interrupted(self, check: LearningCheck, reason: str) -> None:
        """The closing event of a check that ended interrupted, naming it as its queued event did, so
        the event log matches every queued check to how it ended."""
        await self.events.emit("learning_check_interrupted", **check.event_fields(), reason=reason)

    async def reconcile(self) -> int:
        """At start: a receipt still queued or running whose job was interrupted meanwhile (the
        process that interrupted it died before reporting it) is reported now."""
        fixed = 0
        now = self.clock.now()
        for check in await self.store.unfinished(RECONCILE_LIMIT):
            found = await self.queue.get(JOB_KIND, check.company, check.job_key)
            if found is None:
                continue
            _, state, _ = found
            if state is JobState.INTERRUPTED and (
                reported := await self.store.interrupt_check(check.company, check.job_key, INTERRUPTED_REASON, now)
            ):
                fixed += 1
                await self._interrupted(reported, INTERRUPTED_REASON)
        return fixed

    # ------------------------------------------------------------------ one job

    async def process(self, job: Job) -> CheckState | None:
        """Run one claimed check; returns the state recorded (None when nothing was)."""
        record_queue_lag(JOB_KIND, job, self.clock.now())
        token = otel_context.attach(telemetry.restore_context(job.trace_carrier))
        try:
            with _tracer.start_as_current_span(
                "learning check",
                attributes=agentlearn_attributes(company=job.company, seat=job.seat, job_key=job.key),
            ):
                return await self._process(job)
        finally:
            otel_context.detach(token)

    async def _process(self, job: Job) -> CheckState | None:
        try:
            check_id = uuid.UUID(json.loads(job.payload)["check_id"])
        except (ValueError, KeyError, TypeError) as err:
            await self._dead(job, f"unreadable payload: {err}")
            return None
        check = await self.store.get_check(check_id)
        if check is None:
            await self._dead(job, f"no receipt for check {check_id}")
            return None
        if not check.state.active:  # already reported (e.g. interrupted): never run again
            with self._claims.settling(job):
                async with self.store.pool.acquire() as conn, conn.transaction():
                    await self.queue.finish(conn, job, self.worker_id, self.clock.now())
            return check.state
        await self.store.start_check(check.id, self.clock.now())
        try:
            check = await self.runner.run(check)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # Not an outcome a receipt names (those are all handled): the store or a bug. The
            # check is reported interrupted with the cause, and not replayed.
            _log.exception("learning check %s failed", check.id)
            await self._dead(job, f"worker error: {type(exc).__name__}: {exc}"[:500], check)
            return CheckState.INTERRUPTED
        return await self._finish(job, check)

    async def _finish(self, job: Job, check: LearningCheck) -> CheckState | None:
        now = self.clock.now()
        # Settled by us from here: a revocation notice (someone else's erasure) must not stop the
        # closing event below, or the event log would lose how this check ended.
        with self._claims.settling(job):
            async with self.store.pool.acquire() as conn, conn.transaction():
                if not await self.queue.finish(conn, job, self.worker_id, now):
                    held = False
                else:
                    held = True
                    await self.store.finish_check(conn, check, now)
        if not held:
            # The claim lapsed while we worked and the check was reported interrupted: keep that,
            # and add what this run wrote so the receipt does not hide a write.
            _log.warning("lost the claim on learning check %s before finishing; it stays interrupted", check.id)
            await self.store.annotate_interrupted(check)
            return CheckState.INTERRUPTED
        assert check.outcome is not None
        _count_check(check)
        await self.events.emit(
            "learning_check_completed",
            **check.event_fields(),
            outcome=str(check.outcome),
            counts=check.counts(),
            partial_failures=len(check.partial_failures),
        )
        return check.outcome.state

    async def _dead(self, job: Job, reason: str, check: LearningCheck | None = None) -> None:
        now = self.clock.now()
        with self._claims.settling(job):
            async with self.store.pool.acquire() as conn, conn.transaction():
                held = await self.queue.dead_letter(conn, job, self.worker_id, now, reason)
                if held and check is not None:
                    check.outcome = CheckOutcome.INTERRUPTED
                    check.reason = f"{reason}; not replayed: use Check recent work to review the session again"
                    await self.store.finish_check(conn, check, now)
        if held and check is not None:
            _count_check(check)
            await self._interrupted(check, check.reason)

    # ------------------------------------------------------------------ the loop

    async def run_forever(self, dsn: str) -> None:
        """Woken by NOTIFY, polling as the backstop, ``concurrency`` checks at a time; sweeps for
        interrupted checks on the same clock."""
        try:
            await self.reconcile()
        except Exception:
            _log.exception("could not reconcile unfinished learning checks at start")
        async with asyncio.TaskGroup() as group:
            group.create_task(listen(dsn, [JOB_KIND], self.wake, on_revoke=self._claims.revoked))
            group.create_task(self._claims.watch(self.queue, self.worker_id))
            group.create_task(self._sweeper())
            for _ in range(max(1, self.config.concurrency)):
                group.create_task(serve(self.drain, self._wake, self.config.poll_interval_seconds, "learning"))

    async def _sweeper(self) -> None:
        while True:
            await record_queue_depth(JOB_KIND, self.queue.pending)
            try:
                await self.sweep()
            except asyncio.CancelledError:
                raise
            except Exception:
                _log.exception("could not sweep interrupted learning checks")
            await asyncio.sleep(min(self.config.poll_interval_seconds, self.config.claim_lease_seconds))
