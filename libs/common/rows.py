"""A dataclass read from a database row whose columns are named as its fields: the stores list only
what is not a plain copy (an enum, an array kept as a tuple, a field made of several columns), not
every field again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import fields
from operator import itemgetter
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = ["Conversions", "RowReader"]

D = TypeVar("D", bound="DataclassInstance")

Conversions = Mapping[str, Callable[[Any], Any]]
"""Column name → what turns the database's value into the field's."""


class RowReader(Generic[D]):
    """Reads a ``D`` from a row: each field from the column of its name, through its converter in
    ``convert`` when it has one, or from the whole row by ``computed`` (a field no one column holds).
    A column missing from the row is a ``KeyError``, as a hand-written reader's would be."""

    def __init__(
        self,
        cls: type[D],
        convert: Mapping[str, Callable[[Any], Any]] | None = None,
        computed: Mapping[str, Callable[[Mapping[str, Any]], Any]] | None = None,
    ):
        convert, computed = convert or {}, computed or {}
        names = {f.name for f in fields(cls)}
        unknown = (set(convert) | set(computed)) - names
        if unknown:
            raise ValueError(f"{cls.__name__} has no fields {sorted(unknown)}")
        if any(f.kw_only for f in fields(cls)):
            raise ValueError(f"{cls.__name__} has keyword-only fields; a row is read positionally")
        self._cls = cls
        # Worked out once: a read is one getter per field, in the fields' order, passed positionally
        # (``itemgetter`` for a plain copy).
        self._getters = tuple(_getter(f.name, convert.get(f.name), computed.get(f.name)) for f in fields(cls) if f.init)

    def __call__(self, row: Mapping[str, Any]) -> D:
        return self._cls(*[get(row) for get in self._getters])


def _getter(
    name: str, convert: Callable[[Any], Any] | None, computed: Callable[[Mapping[str, Any]], Any] | None
) -> Callable[[Mapping[str, Any]], Any]:
    if computed is not None:
        return computed
    if convert is not None:
        return lambda row: convert(row[name])
    return itemgetter(name)
