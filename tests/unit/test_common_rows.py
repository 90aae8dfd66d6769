"""libs.common.rows.RowReader: a row as a dataclass through a table of column conversions — the one
row reader every store uses."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import pytest

from libs.common.rows import RowReader


class Color(StrEnum):
    RED = "red"
    BLUE = "blue"


@dataclass(frozen=True)
class Thing:
    name: str
    color: Color
    tags: tuple[str, ...]
    origin: str = "db"


READ = RowReader(Thing, {"color": Color, "tags": tuple})


def test_each_field_is_its_column_through_its_conversion() -> None:
    thing = READ({"name": "a", "color": "blue", "tags": ["x", "y"], "origin": "row"})
    assert thing == Thing("a", Color.BLUE, ("x", "y"), "row")
    assert isinstance(thing.color, Color)


def test_a_computed_field_is_made_from_the_whole_row_and_needs_no_column() -> None:
    read = RowReader(Thing, {"color": Color, "tags": tuple}, computed={"origin": lambda row: f"from {row['name']}"})
    assert read({"name": "a", "color": "red", "tags": []}) == Thing("a", Color.RED, (), "from a")


def test_a_field_that_is_not_a_column_fails_instead_of_defaulting() -> None:
    with pytest.raises(KeyError, match="origin"):
        READ({"name": "a", "color": "red", "tags": []})


def test_a_conversion_for_a_field_the_class_does_not_have_is_refused_when_the_reader_is_made() -> None:
    with pytest.raises(ValueError, match="colour"):
        RowReader(Thing, {"colour": Color})
