"""libs.common.rows.from_row: a row as a dataclass through a table of column conversions."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import pytest

from libs.common.rows import from_row


class Color(StrEnum):
    RED = "red"
    BLUE = "blue"


@dataclass(frozen=True)
class Thing:
    name: str
    color: Color
    tags: tuple[str, ...]
    origin: str = "db"


def test_each_field_is_its_column_through_its_conversion() -> None:
    thing = from_row(
        Thing, {"name": "a", "color": "blue", "tags": ["x", "y"], "origin": "row"}, {"color": Color, "tags": tuple}
    )
    assert thing == Thing("a", Color.BLUE, ("x", "y"), "row")
    assert isinstance(thing.color, Color)


def test_a_given_field_wins_over_the_row_and_needs_no_column() -> None:
    thing = from_row(Thing, {"name": "a", "color": "red", "tags": []}, {"color": Color, "tags": tuple}, origin="given")
    assert thing == Thing("a", Color.RED, (), "given")


def test_a_field_neither_given_nor_a_column_fails_instead_of_defaulting() -> None:
    with pytest.raises(KeyError, match="origin"):
        from_row(Thing, {"name": "a", "color": "red", "tags": []})
