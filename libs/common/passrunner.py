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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from libs.common.leases import LeaseClaimer

__all__ = ["PassSpec", "holder_identity", "run_pass", "tick_forever"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PassSpec:
    name: str
    """Also the lease's name (e.g. ``diary-fill``)."""
    run: Callable[[], Awaitable[Any]]
    interval_seconds: float
    """The all-in-one's cadence; a CronJob schedule in Kubernetes."""
    enabled: bool = True


def holder_identity() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


async def run_pass(spec: PassSpec, leases: LeaseClaimer, holder: str, ttl_seconds: int) -> tuple[bool, Any]:
    """Claim, run once, release. Returns (ran, result); ``ran`` is False when the claim failed."""
    lease = await leases.claim(spec.name, holder, ttl_seconds)
    if lease is None:
        _log.info("pass %s: lease held elsewhere or unknown; skipped", spec.name)
        return False, None
    try:
        result = await spec.run()
        _log.info("pass %s: %s", spec.name, result)
        return True, result
    finally:
        await leases.release(lease)


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
