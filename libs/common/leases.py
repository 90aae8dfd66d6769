"""Lease claims for fleet singletons (the background passes).

A pass claims the lease named after it before working and releases it at the end; a claim whose
outcome cannot be known fails closed (no work), because not knowing whether a peer holds the duty
is exactly when running anyway produces the double write. Leases give no fencing to the guarded
writes, so every pass is idempotent. The Postgres backend serves outside Kubernetes; the
Kubernetes ``coordination.k8s.io`` Lease backend implements the same port.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

import asyncpg

from libs.common.clock import Clock

__all__ = ["Lease", "LeaseClaimer", "PostgresLeaseClaimer"]

_log = logging.getLogger(__name__)


SQL = {
    # Taken when free or lapsed, renewed by its holder; the fence moves only when the holder changes.
    "claim": """
        INSERT INTO leases (name, holder, expire_time, fence) VALUES ($1, $2, $3, 1)
        ON CONFLICT (name) DO UPDATE
          SET holder = EXCLUDED.holder,
              expire_time = EXCLUDED.expire_time,
              fence = leases.fence + CASE WHEN leases.holder = EXCLUDED.holder THEN 0 ELSE 1 END
        WHERE leases.holder = EXCLUDED.holder OR leases.expire_time <= $4
        RETURNING name, holder, expire_time, fence""",
    "release": "UPDATE leases SET expire_time = $3 WHERE name = $1 AND holder = $2 AND fence = $4",
}


@dataclass(frozen=True)
class Lease:
    name: str
    holder: str
    expire_time: datetime
    fence: int


class LeaseClaimer(Protocol):
    async def claim(self, name: str, holder: str, ttl_seconds: int) -> Lease | None:
        """The lease, or ``None`` when another holder has it or its state cannot be read."""
        ...

    async def release(self, lease: Lease) -> None: ...


class PostgresLeaseClaimer:
    def __init__(self, pool: asyncpg.Pool, clock: Clock):
        self._pool = pool
        self._clock = clock

    async def claim(self, name: str, holder: str, ttl_seconds: int) -> Lease | None:
        now = self._clock.now()
        try:
            row = await self._pool.fetchrow(
                SQL["claim"],
                name,
                holder,
                now + timedelta(seconds=ttl_seconds),
                now,
            )
        except Exception as exc:  # unknown is not "yes": fail closed
            _log.warning("lease %s: claim state unknown (%s); not running", name, exc)
            return None
        if row is None:
            return None
        return Lease(row["name"], row["holder"], row["expire_time"], int(row["fence"]))

    async def release(self, lease: Lease) -> None:
        try:
            await self._pool.execute(
                SQL["release"],
                lease.name,
                lease.holder,
                self._clock.now(),
                lease.fence,
            )
        except Exception as exc:
            _log.warning("lease %s: release failed (%s); it expires on its own", lease.name, exc)
