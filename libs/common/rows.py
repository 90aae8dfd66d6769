"""A database row as a domain dataclass, driven by a table of column conversions.

A store's row readers all said the same thing field by field (``x=row["x"]``, or
``x=Kind(row["x"])``): each field is the column of its name, through a conversion where the
database's value is not yet the domain's (an enum, a tuple, a parsed document). Here that is said
once; a reader names only its conversions and the fields that do not come from the row.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = ["Conversions", "from_row"]

D = TypeVar("D", bound="DataclassInstance")

Conversions = Mapping[str, Callable[[Any], object]]
"""Column name → what turns the database's value into the field's."""


@functools.cache
def _field_names(cls: type[DataclassInstance]) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls) if f.init)


def from_row(cls: type[D], row: Mapping[str, Any], convert: Conversions | None = None, **given: object) -> D:
    """``cls`` with each field from ``given`` if named there, else from the column of its name
    (through ``convert``'s function for that column, if any). A field neither given nor a column of
    the row is a KeyError: a reader that forgot a column fails loudly instead of defaulting it."""
    convert = convert or {}
    values: dict[str, object] = {}
    for name in _field_names(cls):
        if name in given:
            values[name] = given[name]
            continue
        raw = row[name]
        fn = convert.get(name)
        values[name] = raw if fn is None else fn(raw)
    return cls(**values)
