"""The erasure worker: jobs of kind ``erasure`` in the shared queue (``libs.common.jobs``).

Claims with ``reclaim_lapsed=True``: an erasure whose process died is taken again once its lease
lapses and resumes where it stopped (``PrivacyService.run``). An owner that fails (down, a
deadline) sends the job back to the queue with the reason; so does a vector index that could not
drop every point yet (the rows are gone from Postgres, and every hit is re-read from there, but
the erasure is not verified until the points are gone too). After ``max_attempts`` claims the
erasure is reported FAILED with the last reason.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from dataclasses import dataclass, field
from datetime import timedelta

import grpc

from libs.common.clock import Clock
from libs.common.config import PrivacyConfig
from libs.common.events import EventSink
from libs.common.jobs import ClaimingWorker, Job, listen, serve
from libs.common.metrics import record_queue_depth, record_queue_lag
from services.privacy.domain import JOB_KIND, ClaimLost, Erasure, ErasureState, Holder
from services.privacy.ports import ErasureQueue
from services.privacy.service import PrivacyService, emit_erasure_event

__all__ = ["ErasureWorker"]

_log = logging.getLogger(__name__)


@dataclass
class ErasureWorker(ClaimingWorker):
    """Runs the claimed erasure jobs through ``service`` (a dataclass: its parts are its fields).
    ``drain`` runs every erasure claimable now, one at a time: a lapsed claim is taken again and the
    erasure resumes."""

    kind = JOB_KIND
    reclaim_lapsed = True
    when_lost = "its new holder resumes it"

    service: PrivacyService
    queue: ErasureQueue
    config: PrivacyConfig
    clock: Clock
    events: EventSink
    worker_id: str
    _wake: asyncio.Event = field(default_factory=asyncio.Event, init=False, repr=False)

    async def drain(self) -> int:
        """Every erasure claimable now (``ClaimingWorker.drain``), the queue's depth sampled first:
        the loop drains on every wake and every poll, so the gauge is never older than a poll."""
        await record_queue_depth(JOB_KIND, self.queue.pending)
        return await super().drain()

    async def process(self, job: Job) -> ErasureState | None:
        """Run one claimed erasure; the state it was left in (None: it went back to the queue)."""
        record_queue_lag(JOB_KIND, job, self.clock.now())
        store = self.service.store
        try:
            erasure_id = uuid.UUID(json.loads(job.payload)["erasure_id"])
        except (ValueError, KeyError, TypeError) as err:
            async with store.transaction() as conn:
                await self.queue.dead_letter(conn, job, self.worker_id, self.clock.now(), f"unreadable payload: {err}")
            return None
        erasure = await store.get(erasure_id)
        if erasure is None or erasure.state.finished:
            async with store.transaction() as conn:
                await self.queue.finish(conn, job, self.worker_id, self.clock.now())
            return erasure.state if erasure else None
        try:
            erasure = await self.service.run(erasure, Holder(job.id, self.worker_id, job.attempts))
        except asyncio.CancelledError:
            raise
        except ClaimLost:
            # Its lease lapsed and another holder has it (or has finished it): nothing more is
            # written by this one, and that holder's outcome stands.
            _log.warning("erasure %s: claim lost to another holder; stopping", erasure.id)
            return None
        except grpc.aio.AioRpcError as err:
            return await self._again(job, erasure, f"an owner failed: {err.code().name}: {err.details()}"[:500])
        except Exception as exc:  # the store or a bug: retried, then reported
            _log.exception("erasure %s failed", erasure.id)
            return await self._again(job, erasure, f"{type(exc).__name__}: {exc}"[:500])
        if not erasure.verified and not erasure.residues and job.attempts < self.config.max_attempts:
            # Only the index is behind: try again (each owner drops its points again).
            return await self._again(job, erasure, erasure.reason)
        return await self._finish(job, erasure)

    async def _again(self, job: Job, erasure: Erasure, reason: str) -> ErasureState | None:
        store = self.service.store
        now = self.clock.now()
        if job.attempts >= self.config.max_attempts:
            erasure.state, erasure.reason = ErasureState.FAILED, f"gave up after {job.attempts} attempts: {reason}"
            return await self._finish(job, erasure)
        async with store.transaction() as conn:
            if await self.queue.retry(
                conn, job, self.worker_id, now + timedelta(seconds=self.config.retry_seconds), reason
            ):
                await store.set_reason(conn, erasure.id, reason)
        return None

    async def _finish(self, job: Job, erasure: Erasure) -> ErasureState | None:
        store = self.service.store
        now = self.clock.now()
        async with store.transaction() as conn:
            if not await self.queue.finish(conn, job, self.worker_id, now):
                return None  # another holder took it: its outcome stands
            await store.finish(conn, erasure, now)
        await emit_erasure_event(
            self.events,
            "erasure_finished",
            erasure,
            state=str(erasure.state),
            verified=erasure.verified,
            counts=self.service.counts(erasure),
        )
        return erasure.state

    # ------------------------------------------------------------------ the loop

    async def run_forever(self, dsn: str) -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(listen(dsn, [JOB_KIND], self.wake))
            group.create_task(serve(self.drain, self._wake, self.config.poll_interval_seconds, "erasure"))
