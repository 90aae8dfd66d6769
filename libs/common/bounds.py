"""Refusals of a request field past a bound, shared by every use case that checks one after
normalising (``libs.common.contract`` checks the protos' own limits at the edge): too many items in
a list, too many characters in a text (``validation.require_text`` words its limit through here).

Each raises :class:`~libs.common.errors.InvalidArgument` naming the field, with the bound and what
was sent as metadata (``limit`` and ``count``, or ``limit`` and ``length``), so a caller can branch
on the reason and read the numbers without parsing the message. A use case words what the bound is
of with its own message template and, where a program must tell it apart, its own reason.
"""

from __future__ import annotations

from collections.abc import Sized

from libs.common.errors import field_error

__all__ = ["at_most_chars", "at_most_items"]

TOO_LONG = "{field} is {length} characters; the limit is {limit}"
"""The wording of a text past its limit where the use case has none of its own."""


def at_most_items(
    values: Sized, limit: int, field: str, message: str, *, domain: str, reason: str = "TOO_MANY_ITEMS"
) -> None:
    """Refuse more than ``limit`` values in ``field``. ``message`` is a template that may name
    ``{field}``, ``{limit}`` and ``{count}`` (each use case words what the bound is of)."""
    count = len(values)
    if count > limit:
        text = message.format(field=field, limit=limit, count=count)
        raise field_error(field, reason, text, domain=domain, limit=limit, count=count)


def at_most_chars(
    value: str, field: str, limit: int, *, domain: str, reason: str = "FIELD_TOO_LONG", message: str = TOO_LONG
) -> str:
    """Refuse ``value`` past ``limit`` characters (``reason``; ``message`` a template that may name
    ``{field}``, ``{limit}`` and ``{length}``); an empty value passes (where one is required, the
    caller says so)."""
    length = len(value)
    if length > limit:
        text = message.format(field=field, limit=limit, length=length)
        raise field_error(field, reason, text, domain=domain, limit=limit, length=length)
    return value
