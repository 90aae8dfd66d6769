"""Background passes as one-shot, lease-claimed commands, and the all-in-one's clock for them.

A pass claims the lease named after it, runs once, and releases it. It never fires on start: every
replica of a fleet starts within seconds of a rolling restart, and a crash-looping process would
spend the company's tokens on every restart.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from libs.common.leases import LeaseClaimer

__all__ = ["LEASE_LOST", "PassSpec", "holder_identity", "log_failure", "run_pass", "tick_forever"]

LEASE_LOST = "lease_lost"
"""``run_pass``'s result when the pass started and stopped partway: its lease could not be renewed."""

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PassSpec:
    name: str
    """Also the lease's name (e.g. ``diary-fill``)."""
    run: Callable[[], Coroutine[Any, Any, Any]]
    interval_seconds: float
    """The all-in-one's cadence; a CronJob schedule in Kubernetes."""
    enabled: bool = True


def log_failure(task: asyncio.Task[Any]) -> None:
    """A done-callback for a long-lived task: an exception that ended it is logged when it ends,
    not when (or if) someone gathers it at shutdown with ``return_exceptions=True``."""
    if not task.cancelled() and (exc := task.exception()) is not None:
        _log.error("background task %s stopped", task.get_name(), exc_info=exc)


def holder_identity() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


async def run_pass(spec: PassSpec, leases: LeaseClaimer, holder: str, ttl_seconds: int) -> tuple[bool, Any]:
    """Claim, run once, release. Returns (ran, result); ``ran`` is False when the claim failed
    (result None) or the lease was lost partway (result :data:`LEASE_LOST`).

    The lease is renewed every third of its time to live while the pass runs, so a long pass
    (hundreds of condensations) never outlives its claim; a renewal that is refused or cannot be
    read stops the pass, because a peer may hold the duty by then (fail closed)."""
    lease = await leases.claim(spec.name, holder, ttl_seconds)
    if lease is None:
        _log.info("pass %s: lease held elsewhere or unknown; skipped", spec.name)
        return False, None
    work = asyncio.create_task(spec.run(), name=f"pass {spec.name}")
    keeper = asyncio.create_task(_keep_lease(spec.name, leases, holder, ttl_seconds, work))
    keeper.add_done_callback(log_failure)  # a renewal that raised is logged, not lost
    try:
        result = await work
    except asyncio.CancelledError:
        if keeper.done() and keeper.result() is False:
            _log.warning("pass %s stopped: its lease could not be renewed", spec.name)
            return False, LEASE_LOST
        raise
    finally:
        keeper.cancel()
        await leases.release(lease)
    _log.info("pass %s: %s", spec.name, result)
    return True, result


async def _keep_lease(name: str, leases: LeaseClaimer, holder: str, ttl_seconds: int, work: asyncio.Task[Any]) -> bool:
    while True:
        await asyncio.sleep(ttl_seconds / 3)
        if await leases.claim(name, holder, ttl_seconds) is None:
            work.cancel()
            return False


async def tick_forever(spec: PassSpec, leases: LeaseClaimer, holder: str, ttl_seconds: int) -> None:
    """The all-in-one's loop for one pass: wait a full interval first, then run, forever."""
    while True:
        await asyncio.sleep(spec.interval_seconds)
        try:
            await run_pass(spec, leases, holder, ttl_seconds)
        except asyncio.CancelledError:
            raise
        except Exception:
            _log.exception("pass %s failed; next tick in %ss", spec.name, spec.interval_seconds)
