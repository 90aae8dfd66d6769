"""A dataclass read from a database row whose columns are named as its fields: the stores list only
what is not a plain copy (an enum, an array kept as a tuple, a field made of several columns), not
every field again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import fields
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = ["RowReader"]

D = TypeVar("D", bound="DataclassInstance")


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
        self._cls = cls
        # Worked out once: a read does one pass per kind of field.
        self._plain = tuple(n for n in names if n not in convert and n not in computed)
        self._convert = tuple(convert.items())
        self._computed = tuple(computed.items())

    def __call__(self, row: Mapping[str, Any]) -> D:
        values = {n: row[n] for n in self._plain}
        for name, fn in self._convert:
            values[name] = fn(row[name])
        for name, make in self._computed:
            values[name] = make(row)
        return self._cls(**values)
