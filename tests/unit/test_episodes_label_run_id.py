"""``label_names_run_id``: a label naming the turn's run id as a token of its own is refused by
RecordEpisode. Its substring test before the pattern is a shortcut only: the answers are the
pattern's, edge cases included."""

from __future__ import annotations

import itertools
import re

import pytest

from services.episodes.domain import label_names_run_id


def _by_pattern(label: str, turn_id: str) -> bool:
    """The rule as the pattern alone states it (no shortcut)."""
    if not turn_id:
        return False
    return re.search(r"(?<![A-Za-z0-9])" + re.escape(turn_id) + r"(?![A-Za-z0-9])", label) is not None


@pytest.mark.parametrize(
    ("label", "turn_id", "named"),
    [
        ("nightly digest", "run-42", False),  # absent
        ("run-42", "run-42", True),  # the whole label
        ("run-42 nightly", "run-42", True),  # leading
        ("nightly run-42", "run-42", True),  # trailing
        ("nightly/run-42:retry", "run-42", True),  # between separators
        ("nightly_run-42", "run-42", True),  # an underscore is a separator
        ("xrun-42", "run-42", False),  # inside a longer word, on the left
        ("run-421", "run-42", False),  # inside a longer word, on the right
        ("run-421 run-42", "run-42", True),  # a later occurrence stands alone
        ("RUN-42", "run-42", False),  # case matters
        ("érun-42é", "run-42", True),  # only ASCII letters and digits join a word
        ("a.b*c", "a.b*c", True),  # the id is literal, not a pattern
        ("aXb*c", "a.b*c", False),
        ("nightly", "", False),  # no run id names nothing
        ("", "run-42", False),
    ],
)
def test_label_names_run_id(label: str, turn_id: str, named: bool) -> None:
    assert label_names_run_id(label, turn_id) is named
    assert _by_pattern(label, turn_id) is named


def test_label_names_run_id_agrees_with_the_pattern_everywhere() -> None:
    pieces = ["", "r1", "x", "-", " ", "1", "é", "."]
    for parts in itertools.product(pieces, repeat=3):
        label = "".join(parts)
        for turn_id in ("r1", "1", "x", ".", "r1-"):
            assert label_names_run_id(label, turn_id) == _by_pattern(label, turn_id), (label, turn_id)
