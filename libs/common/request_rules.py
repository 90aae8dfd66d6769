"""Request rules two or more services apply the same way, beside ``libs.common.validation``: a
bounded list of ids, and a newest-first page with the token that resumes it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, TypeVar

from libs.common.bounds import at_most_items
from libs.common.validation import encode_time_cursor

__all__ = ["at_most", "time_page"]

R = TypeVar("R")


def at_most(values: Sequence[object], limit: int, field: str, *, domain: str, reason: str = "TOO_MANY_IDS") -> None:
    """Refuse a list longer than one call takes (``reason``, by default ``TOO_MANY_IDS``, on
    ``field``), worded ``at most <limit> <field> per call``."""
    at_most_items(values, limit, field, "at most {limit} {field} per call, got {count}", domain=domain, reason=reason)


def time_page(
    rows: Sequence[R], size: int, scope: dict[str, Any], time: Callable[[R], datetime], ident: Callable[[R], object]
) -> tuple[list[R], str]:
    """A newest-first page from up to ``size + 1`` rows read after the cursor: the first ``size``,
    and the token resuming after the last of them ("" when no row is left)."""
    page = list(rows[:size])
    if len(rows) <= size:
        return page, ""
    last = page[-1]
    return page, encode_time_cursor(time(last), ident(last), scope)
