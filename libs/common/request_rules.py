"""Request rules two or more services apply the same way, beside ``libs.common.validation``: a
bounded list of ids, and a newest-first page with the token that resumes it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, TypeVar

from libs.common.validation import encode_time_cursor, field_error

__all__ = ["at_most", "time_page"]

R = TypeVar("R")


def at_most(values: Sequence[object], limit: int, field: str, *, domain: str) -> None:
    """Refuse a list of ids longer than one call takes (``TOO_MANY_IDS`` on ``field``)."""
    if len(values) > limit:
        raise field_error(
            field,
            "TOO_MANY_IDS",
            f"at most {limit} {field} per call, got {len(values)}",
            domain=domain,
            limit=limit,
            count=len(values),
        )


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
