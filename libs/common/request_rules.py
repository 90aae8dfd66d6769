"""Request rules two or more services apply the same way, beside ``libs.common.validation``: a
bounded list of ids, and a page (by a key, or newest first) with the token that resumes it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, TypeVar

from libs.common.bounds import at_most_items
from libs.common.validation import encode_time_cursor

__all__ = ["at_most", "key_page", "time_page"]

R = TypeVar("R")


def at_most(values: Sequence[object], limit: int, field: str, *, domain: str, reason: str = "TOO_MANY_IDS") -> None:
    """Refuse a list longer than one call takes (``reason``, by default ``TOO_MANY_IDS``, on
    ``field``), worded ``at most <limit> <field> per call``."""
    at_most_items(values, limit, field, "at most {limit} {field} per call, got {count}", domain=domain, reason=reason)


def key_page(rows: Sequence[R], size: int, token: Callable[[R], str]) -> tuple[list[R], str]:
    """A page from up to ``size + 1`` rows read after the cursor (one more than the page, so a
    listing knows whether another page follows without counting): the first ``size``, and
    ``token`` of the last of them, the page token resuming after it ("" when no row is left)."""
    page = list(rows[:size])
    if len(rows) <= size:
        return page, ""
    return page, token(page[-1])


def time_page(
    rows: Sequence[R], size: int, scope: dict[str, Any], time: Callable[[R], datetime], ident: Callable[[R], object]
) -> tuple[list[R], str]:
    """A newest-first :func:`key_page`, resumed after the last row's (time, id)."""
    return key_page(rows, size, lambda last: encode_time_cursor(time(last), ident(last), scope))
