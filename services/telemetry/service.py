"""Telemetry use cases: the windows a question is asked over, the page tokens, and the totals
derived from the per-day rows. The store answers; this decides what is asked."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import fields, replace
from datetime import datetime, timedelta
from typing import Any, TypeVar

from libs.common.auth import current_principal
from libs.common.clock import Clock
from libs.common.errors import field_error
from libs.common.request_rules import key_page, time_page
from libs.common.validation import (
    decode_cursor,
    decode_time_cursor,
    encode_page_token,
    page_size,
    require_ident,
)
from services.telemetry.domain import (
    DEFAULT_DAYS,
    DOMAIN,
    EVENTS_PAGE_DEFAULT,
    EVENTS_PAGE_MAX,
    MAX_RANGE,
    SEATS_PAGE_DEFAULT,
    SEATS_PAGE_MAX,
    BlockTotal,
    Day,
    Event,
    PurposeTotal,
    SeatActivity,
    Window,
    day_start,
)
from services.telemetry.store import PostgresEventReader

__all__ = ["BlockTotal", "PurposeTotal", "TelemetryService"]  # the totals' types, kept importable here


C = TypeVar("C", BlockTotal, PurposeTotal)


def _sum(a: C, b: C, key: str) -> C:
    """``a`` with each count (every field but the ``key``) added to ``b``'s."""
    return replace(a, **{f.name: getattr(a, f.name) + getattr(b, f.name) for f in fields(a) if f.name != key})


def _add_up(days: Sequence[Day[C]], key: str) -> dict[str, C]:
    """The window's totals by ``key`` (block or purpose): each count summed over the days (an event
    lies in one day, so the days' counts add up to the window's)."""
    totals: dict[str, C] = {}
    for d in days:
        name = getattr(d.counts, key)
        seen = totals.get(name)
        totals[name] = d.counts if seen is None else _sum(seen, d.counts, key)
    return totals


class TelemetryService:
    def __init__(self, store: PostgresEventReader, clock: Clock) -> None:
        self.store = store
        self.clock = clock

    # ---------------------------------------------------------------- checks

    def window(self, start: datetime | None, end: datetime | None) -> Window:
        """[start, end): unset end is now, unset start the start of the UTC day 29 days before end
        (30 days, today included). Refused: an end not after the start, a window past 400 days."""
        end = end or self.clock.now()
        if start is None:
            try:
                start = day_start(end) - timedelta(days=DEFAULT_DAYS - 1)
            except OverflowError:  # an end in the first days of year 1: nothing lies before it
                start = datetime.min.replace(tzinfo=end.tzinfo)
        if end <= start:
            raise field_error(
                "end_time",
                "RANGE_INVALID",
                "end_time must be after start_time",
                domain=DOMAIN,
                start_time=start.isoformat(),
                end_time=end.isoformat(),
            )
        if end - start > MAX_RANGE:
            raise field_error(
                "start_time",
                "RANGE_TOO_LONG",
                f"the window is {(end - start).days} days; at most {MAX_RANGE.days}",
                domain=DOMAIN,
                limit_days=MAX_RANGE.days,
                days=(end - start).days,
            )
        return Window(start, end)

    @staticmethod
    def _company(company: str) -> str:
        return require_ident(company, "company", domain=DOMAIN)

    @staticmethod
    def _seat(seat: str) -> str | None:
        """The seat asked for, or None for the whole company. A credential bound to one seat reads
        that seat only: asking for no seat is asking for its own (the edge has refused any other)."""
        if not seat:
            return current_principal().seat or None
        return require_ident(seat, "seat", domain=DOMAIN)

    # ---------------------------------------------------------------- aggregations

    async def hit_rates(
        self, company: str, seat: str, start: datetime | None, end: datetime | None
    ) -> tuple[list[Day[BlockTotal]], list[BlockTotal], Window]:
        days, window = await self._days(self.store.hit_rates, company, seat, start, end)
        return days, [t for _, t in sorted(_add_up(days, "block").items())], window

    async def spend(
        self, company: str, seat: str, start: datetime | None, end: datetime | None
    ) -> tuple[list[Day[PurposeTotal]], list[PurposeTotal], Window]:
        days, window = await self._days(self.store.spend, company, seat, start, end)
        ordered = sorted(
            _add_up(days, "purpose").values(), key=lambda t: (-(t.prompt_tokens + t.completion_tokens), t.purpose)
        )
        return days, ordered, window

    async def _days(
        self,
        read: Callable[[str, str | None, datetime, datetime], Awaitable[list[Day[C]]]],
        company: str,
        seat: str,
        start: datetime | None,
        end: datetime | None,
    ) -> tuple[list[Day[C]], Window]:
        """The per-day rows ``read`` answers for the company (or seat) over the asked window."""
        company, seat_or_none = self._company(company), self._seat(seat)
        window = self.window(start, end)
        return await read(company, seat_or_none, window.start, window.end), window

    # ---------------------------------------------------------------- listings

    async def seats(
        self, company: str, query: str, start: datetime | None, end: datetime | None, size: int, token: str
    ) -> tuple[list[SeatActivity], str, int]:
        company = self._company(company)
        principal = current_principal()
        only = principal.seat or None  # a seat-bound credential lists its own seat only
        if only is None:
            # Every seat of the company is a company-wide read: a user-bound credential has no seat
            # to narrow it to, and is refused as ListEpisodeSeats refuses it.
            principal.require_company_wide("listing the company's seats")
        window = self.window(start, end)
        size = page_size(size, default=SEATS_PAGE_DEFAULT, maximum=SEATS_PAGE_MAX, domain=DOMAIN)
        scope = {"company": company, "query": query, "only": only, "start": window.start.isoformat() if start else None}

        def read(c: dict[str, Any]) -> str:
            if not isinstance(c["seat"], str):
                raise TypeError("seat")
            return c["seat"]

        after = decode_cursor(token, scope, read, domain=DOMAIN)
        rows = await self.store.seats(company, query, only, window.start, window.end, after, size + 1)
        total = await self.store.seat_count(company, query, only)
        seats, next_token = key_page(rows, size, lambda last: encode_page_token({"seat": last.seat}, scope))
        return seats, next_token, total

    async def events(
        self,
        company: str,
        seat: str,
        kinds: Sequence[str],
        turn_id: str,
        start: datetime | None,
        end: datetime | None,
        size: int,
        token: str,
    ) -> tuple[list[Event], str]:
        company, seat_or_none = self._company(company), self._seat(seat)
        if start is not None and end is not None and end <= start:
            raise field_error("end_time", "RANGE_INVALID", "end_time must be after start_time", domain=DOMAIN)
        size = page_size(size, default=EVENTS_PAGE_DEFAULT, maximum=EVENTS_PAGE_MAX, domain=DOMAIN)
        kinds = sorted(set(kinds))
        scope = {
            "company": company,
            "seat": seat_or_none,
            "kinds": kinds,
            "turn_id": turn_id or None,
            "start": start.isoformat() if start else None,
            "end": end.isoformat() if end else None,
        }
        after = decode_time_cursor(token, scope, domain=DOMAIN, id_type=int)
        rows = await self.store.events(company, seat_or_none, kinds, turn_id or None, start, end, after, size + 1)
        return time_page(rows, size, scope, lambda e: e.time, lambda e: e.id)
