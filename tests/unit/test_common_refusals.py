"""The shared refusals and page of libs.common: a bad field under any status (``of_field``), an
item its owner does not have (``not_found``), a page read one row past its size (``key_page``)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from libs.common.errors import AlreadyExists, FailedPrecondition, FieldViolation, InvalidArgument, NotFound, field_error
from libs.common.not_found import not_found_error, require_found
from libs.common.request_rules import key_page, time_page
from libs.common.validation import (
    decode_page_token,
    decode_time_cursor,
    encode_page_token,
    encode_time_cursor,
    require_page_id,
)


def test_of_field_names_the_field_under_the_status_it_is_called_on() -> None:
    stale = FailedPrecondition.of_field("revision", "STALE", "revision 2 is stale", domain="d.test", current_revision=3)
    assert type(stale) is FailedPrecondition
    assert (stale.reason, stale.domain, stale.message) == ("STALE", "d.test", "revision 2 is stale")
    assert stale.metadata == {"current_revision": "3", "field": "revision"}
    assert stale.violations == [FieldViolation("revision", "revision 2 is stale")]
    taken = AlreadyExists.of_field("name", "TAKEN", "taken", domain="d.test", name="x")
    assert type(taken) is AlreadyExists and taken.metadata == {"name": "x", "field": "name"}
    bad = field_error("tier", "FIELD_INVALID", "tier is not one", domain="d.test", value="x")
    assert type(bad) is InvalidArgument and bad.metadata == {"value": "x", "field": "tier"}


def test_not_found_words_the_owner_the_id_key_and_the_message_it_is_given() -> None:
    plain = not_found_error("session", "s1", domain="d.test")
    assert (str(plain), plain.metadata) == ("NOT_FOUND SESSION_NOT_FOUND: session s1 not found", {"session_id": "s1"})
    owned = not_found_error("note", "n1", domain="d.test", seat="ana")
    assert (owned.message, owned.metadata) == ("note n1 not found for seat ana", {"note_id": "n1", "seat": "ana"})
    own_words = not_found_error(
        "lesson", "p1", domain="d.test", seat="acme", scope="company", id_key="page_id", message="no lesson is p1"
    )
    assert (own_words.reason, own_words.message) == ("LESSON_NOT_FOUND", "no lesson is p1")
    assert own_words.metadata == {"page_id": "p1", "company": "acme"}


def test_require_found_passes_what_is_found_and_raises_what_not_found_error_words() -> None:
    assert require_found("", "draft", "p1", domain="d.test", seat="acme", scope="company") == ""
    with pytest.raises(NotFound) as err:
        require_found(None, "reflection", "t1", domain="d.test", seat="ana", id_key="turn_id")
    expected = not_found_error("reflection", "t1", domain="d.test", seat="ana", id_key="turn_id")
    assert (str(err.value), err.value.metadata) == (str(expected), expected.metadata)


def test_key_page_keeps_size_rows_and_resumes_after_the_last_only_when_one_is_left() -> None:
    scope = {"seat": "ana"}
    token = lambda name: encode_page_token({"name": name}, scope)  # noqa: E731
    assert key_page(["a", "b"], 2, token) == (["a", "b"], "")
    page, next_token = key_page(["a", "b", "c"], 2, token)
    assert page == ["a", "b"]
    assert decode_page_token(next_token, scope, domain="d.test") == {"name": "b"}


def test_time_page_resumes_after_the_last_rows_time_and_id() -> None:
    rows = [(datetime(2026, 1, day, tzinfo=UTC), f"r{day}") for day in (3, 2, 1)]
    page, token = time_page(rows, 2, {"s": 1}, lambda r: r[0], lambda r: r[1])
    assert page == rows[:2]
    assert decode_time_cursor(token, {"s": 1}, domain="d.test") == rows[1]
    assert time_page(rows, 3, {"s": 1}, lambda r: r[0], lambda r: r[1]) == (rows, "")


def test_a_time_cursor_comes_back_for_every_instant_a_timestamp_may_hold() -> None:
    scope = {"s": 1}
    first, last = datetime.min.replace(tzinfo=UTC), datetime.max.replace(tzinfo=UTC)
    for time in (first, datetime(1, 1, 1, 0, 0, 1, tzinfo=UTC), datetime(9999, 12, 31, tzinfo=UTC), last):
        assert decode_time_cursor(encode_time_cursor(time, "r", scope), scope, domain="d.test") == (time, "r")
    # asyncpg reads those two instants back naive: their cursors are UTC too.
    for naive, aware in ((datetime.min, first), (datetime.max, last)):
        assert decode_time_cursor(encode_time_cursor(naive, "r", scope), scope, domain="d.test") == (aware, "r")


def test_require_page_id_strips_and_refuses_white_space_inside() -> None:
    assert require_page_id("  123  ", domain="d.test") == "123"
    with pytest.raises(InvalidArgument) as err:
        require_page_id("12 3", domain="d.test")
    assert (err.value.reason, err.value.message) == ("FIELD_INVALID", "page_id '12 3' is not a page id")
    assert err.value.metadata == {"field": "page_id"}
