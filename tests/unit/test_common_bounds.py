"""libs.common.bounds: a field past its bound is refused with the field named, the bound and what
was sent in metadata, and the use case's own wording; at the bound it passes."""

from __future__ import annotations

import pytest

from libs.common.bounds import at_most_chars, at_most_items
from libs.common.errors import FieldViolation, InvalidArgument


def test_at_most_items_refuses_past_the_limit_in_the_callers_words() -> None:
    at_most_items(["a", "b"], 2, "topics", "{field}: {count} of {limit}", domain="d.test")
    with pytest.raises(InvalidArgument) as err:
        at_most_items(["a", "b", "c"], 2, "topics", "{field}: {count} of {limit}", domain="d.test")
    e = err.value
    assert (e.reason, e.domain, e.message) == ("TOO_MANY_ITEMS", "d.test", "topics: 3 of 2")
    assert e.metadata == {"limit": "2", "count": "3", "field": "topics"}
    assert e.violations == [FieldViolation("topics", "topics: 3 of 2")]


def test_at_most_items_carries_the_reason_it_is_given() -> None:
    with pytest.raises(InvalidArgument) as err:
        at_most_items(range(4), 3, "subjects", "at most {limit}", domain="d.test", reason="TOO_MANY_SUBJECTS")
    assert (err.value.reason, err.value.message) == ("TOO_MANY_SUBJECTS", "at most 3")


def test_at_most_chars_passes_an_empty_value_and_refuses_one_past_the_limit() -> None:
    assert at_most_chars("", "style", 3, domain="d.test") == ""
    assert at_most_chars("abc", "style", 3, domain="d.test") == "abc"
    with pytest.raises(InvalidArgument) as err:
        at_most_chars("abcd", "style", 3, domain="d.test")
    e = err.value
    assert (e.reason, e.message) == ("FIELD_TOO_LONG", "style is 4 characters; the limit is 3")
    assert e.metadata == {"limit": "3", "length": "4", "field": "style"}
