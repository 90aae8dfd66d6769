"""libs.common.bounds: a field past its bound is refused with the field named, the bound and what
was sent in metadata, and the use case's own wording; at the bound it passes."""

from __future__ import annotations

import pytest

from libs.common.bounds import at_most_chars, at_most_items
from libs.common.errors import FieldViolation, InvalidArgument
from libs.common.request_rules import at_most
from libs.common.validation import require_text


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


def test_at_most_chars_words_the_bound_in_the_use_cases_reason_and_template() -> None:
    template = "{field} is {length} characters; a note holds at most {limit}"
    assert at_most_chars("abc", "content", 3, domain="d.test", reason="NOTE_TOO_LONG", message=template) == "abc"
    with pytest.raises(InvalidArgument) as err:
        at_most_chars("abcd", "content", 3, domain="d.test", reason="NOTE_TOO_LONG", message=template)
    e = err.value
    assert (e.reason, e.message) == ("NOTE_TOO_LONG", "content is 4 characters; a note holds at most 3")
    assert e.metadata == {"limit": "3", "length": "4", "field": "content"}


def test_require_text_words_its_limit_as_at_most_chars_does() -> None:
    with pytest.raises(InvalidArgument) as by_text:
        require_text("abcd", "title", domain="d.test", max_chars=3)
    with pytest.raises(InvalidArgument) as by_bound:
        at_most_chars("abcd", "title", 3, domain="d.test")
    assert (
        str(by_text.value)
        == str(by_bound.value)
        == "INVALID_ARGUMENT FIELD_TOO_LONG: title is 4 characters; the limit is 3"
    )
    assert by_text.value.metadata == by_bound.value.metadata


def test_at_most_refuses_ids_past_the_limit_with_the_reason_it_is_given() -> None:
    at_most(["a", "b"], 2, "note_ids", domain="d.test")
    with pytest.raises(InvalidArgument) as ids:
        at_most(["a", "b", "c"], 2, "note_ids", domain="d.test")
    assert (ids.value.reason, ids.value.message) == ("TOO_MANY_IDS", "at most 2 note_ids per call, got 3")
    with pytest.raises(InvalidArgument) as subjects:
        at_most(range(5), 4, "subjects", domain="d.test", reason="TOO_MANY_SUBJECTS")
    assert (subjects.value.reason, subjects.value.message) == (
        "TOO_MANY_SUBJECTS",
        "at most 4 subjects per call, got 5",
    )
    assert subjects.value.metadata == {"limit": "4", "count": "5", "field": "subjects"}
