"""Refusals of a request field past a bound, shared by the use cases that check a bound after
normalising (``libs.common.contract`` checks the protos' own limits at the edge): too many items in
a list, too many characters in a text that may be empty.

Each raises :class:`~libs.common.errors.InvalidArgument` naming the field, with the bound and what
was sent as metadata (``limit`` and ``count``, or ``limit`` and ``length``), so a caller can branch
on the reason and read the numbers without parsing the message.
"""

from __future__ import annotations

from collections.abc import Sized

from libs.common.errors import InvalidArgument

__all__ = ["at_most_chars", "at_most_items"]


def at_most_items(
    values: Sized, limit: int, field: str, message: str, *, domain: str, reason: str = "TOO_MANY_ITEMS"
) -> None:
    """Refuse more than ``limit`` values in ``field``. ``message`` is a template that may name
    ``{field}``, ``{limit}`` and ``{count}`` (each use case words what the bound is of)."""
    count = len(values)
    if count > limit:
        raise InvalidArgument(
            message.format(field=field, limit=limit, count=count),
            reason=reason,
            domain=domain,
            field=field,
            metadata={"limit": limit, "count": count},
        )


def at_most_chars(value: str, field: str, limit: int, *, domain: str) -> str:
    """Refuse ``value`` past ``limit`` characters (``FIELD_TOO_LONG``, worded as
    ``validation.require_text`` words it); unlike that check, an empty value passes."""
    if len(value) > limit:
        raise InvalidArgument(
            f"{field} is {len(value)} characters; the limit is {limit}",
            reason="FIELD_TOO_LONG",
            domain=domain,
            field=field,
            metadata={"limit": limit, "length": len(value)},
        )
    return value
