"""A dataclass read from a database row whose columns are named as its fields: the stores list only
what is not a plain copy (an enum, an array kept as a tuple, a field made of several columns), not
every field again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import fields
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

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
        # Worked out once: a read is one generated function, ``cls(row['a'], convert_b(row['b']),
        # computed_c(row), ...)``, in the fields' order and positional (~200 rows a turn start; a
        # getter called per field, and the list of their results, were most of a row's cost).
        self._read = _compile(cls, [(f.name, convert.get(f.name), computed.get(f.name)) for f in fields(cls) if f.init])

    def __call__(self, row: Mapping[str, Any]) -> D:
        return self._read(row)


def _compile(
    cls: type[D],
    shape: list[tuple[str, Callable[[Any], Any] | None, Callable[[Mapping[str, Any]], Any] | None]],
) -> Callable[[Mapping[str, Any]], D]:
    scope: dict[str, Any] = {"cls": cls}
    args = []
    for i, (name, convert, computed) in enumerate(shape):
        if computed is not None:
            scope[f"f{i}"] = computed
            args.append(f"f{i}(row)")
        elif convert is not None:
            scope[f"f{i}"] = convert
            args.append(f"f{i}(row[{name!r}])")
        else:
            args.append(f"row[{name!r}]")
    # The code is made of the fields' names, as string literals (repr), and numbered names.
    exec(compile(f"def read(row):\n    return cls({', '.join(args)})\n", f"<RowReader {cls.__name__}>", "exec"), scope)
    return cast("Callable[[Mapping[str, Any]], D]", scope["read"])
