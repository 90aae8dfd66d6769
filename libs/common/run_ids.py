"""A run id in a label, by one rule for the episodist that cleans a label and the episodes service
that refuses one: the id counts only as a token of its own, never inside a longer word ("POC-512"
names run 512; "PR #5120" does not)."""

from __future__ import annotations

import re

__all__ = ["label_names_run_id", "label_without_run_id"]


def _as_word(turn_id: str) -> re.Pattern[str]:
    return re.compile(r"(?<![A-Za-z0-9])" + re.escape(turn_id) + r"(?![A-Za-z0-9])")


def label_names_run_id(label: str, turn_id: str) -> bool:
    """True when ``label`` carries ``turn_id`` as a token of its own (not inside a longer word).

    A scheduled turn's label names its schedule and never the fire's run id, which differs on
    every fire: led by the id, two fires of one schedule are unalike to every similarity search.
    """
    if not turn_id or turn_id not in label:
        # No occurrence at all (nearly every label): no pattern to build and run.
        return False
    return _as_word(turn_id).search(label) is not None


def label_without_run_id(label: str, turn_id: str) -> str:
    """``label`` with every token-of-its-own ``turn_id`` taken out (spaces folded, stray ``:``/``-``
    at the ends trimmed); unchanged when it names none."""
    if not label_names_run_id(label, turn_id):
        return label
    return " ".join(_as_word(turn_id).sub(" ", label).split()).strip(" :-")
