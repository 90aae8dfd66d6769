"""Token budgets: auxiliary tokens charged per seat and per company in fixed windows.

The auxiliary seam charges every call after it answers (its size is only known then, so a call
may pass the ceiling); the reflector's budget gate reads the room before a pass starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import asyncpg

from libs.common.config import BudgetConfig
from libs.common.events import current_bookkeeping

__all__ = ["BudgetLedger", "BudgetRoom", "window_start"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def window_start(at: datetime, hours: int) -> datetime:
    span = timedelta(hours=max(1, hours))
    return _EPOCH + ((at - _EPOCH) // span) * span


@dataclass(frozen=True)
class BudgetRoom:
    seat_spent: int
    company_spent: int
    seat_ceiling: int | None
    company_ceiling: int | None

    @property
    def exhausted(self) -> bool:
        return (self.seat_ceiling is not None and self.seat_spent >= self.seat_ceiling) or (
            self.company_ceiling is not None and self.company_spent >= self.company_ceiling
        )

    @property
    def which(self) -> str | None:
        """``seat`` or ``company``: the ceiling that is reached, if any."""
        if self.seat_ceiling is not None and self.seat_spent >= self.seat_ceiling:
            return "seat"
        if self.company_ceiling is not None and self.company_spent >= self.company_ceiling:
            return "company"
        return None


SQL = {
    # A charge adds to the seat's counter and the company's ('' seat) of the window at once.
    "charge": """
        INSERT INTO token_spend (company, seat, window_start, tokens)
        VALUES ($1, $2, $3, $4), ($1, '', $3, $4)
        ON CONFLICT (company, seat, window_start) DO UPDATE
        SET tokens = token_spend.tokens + EXCLUDED.tokens""",
    "room": "SELECT seat, tokens FROM token_spend WHERE company = $1 AND seat IN ($2, '') AND window_start = $3",
}


class BudgetLedger:
    def __init__(self, pool: asyncpg.Pool):
        self._pool = pool

    async def charge(self, company: str, seat: str, tokens: int, at: datetime, config: BudgetConfig) -> None:
        """Add ``tokens`` to the seat's and the company's counters of the window current at ``at``."""
        start = window_start(at, config.window_hours)
        batch = current_bookkeeping()
        if batch is not None:  # written with the request's other bookkeeping, in one transaction
            batch.charge(company, seat, start, tokens)
            return
        await self._pool.execute(
            SQL["charge"],
            company,
            seat,
            start,
            tokens,
        )

    async def room(self, company: str, seat: str, at: datetime, config: BudgetConfig) -> BudgetRoom:
        start = window_start(at, config.window_hours)
        rows = await self._pool.fetch(
            SQL["room"],
            company,
            seat,
            start,
        )
        spent = {r["seat"]: int(r["tokens"]) for r in rows}
        return BudgetRoom(
            seat_spent=spent.get(seat, 0),
            company_spent=spent.get("", 0),
            seat_ceiling=config.seat_ceiling_tokens,
            company_ceiling=config.company_ceiling_tokens,
        )
