"""A line diff of two skill bodies, as rows a template renders: each row says what it is in words
(``+`` / ``-`` and a label), never by colour alone."""

from __future__ import annotations

import difflib
from dataclasses import dataclass

__all__ = ["DiffRow", "diff_rows"]

CONTEXT = 3
"""Unchanged lines kept around each change; longer unchanged runs fold into one gap row."""


@dataclass(frozen=True)
class DiffRow:
    kind: str
    """``same``, ``added``, ``removed`` or ``gap`` (unchanged lines left out)."""
    old_no: int | None
    new_no: int | None
    text: str


def diff_rows(old: str, new: str) -> list[DiffRow]:
    a, b = old.splitlines(), new.splitlines()
    rows: list[DiffRow] = []
    for group in difflib.SequenceMatcher(None, a, b, autojunk=False).get_grouped_opcodes(CONTEXT):
        first = group[0]
        if rows or first[1] > 0 or first[3] > 0:
            rows.append(DiffRow("gap", None, None, f"@@ -{first[1] + 1} +{first[3] + 1} @@"))
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                rows += [DiffRow("same", i1 + k + 1, j1 + k + 1, a[i1 + k]) for k in range(i2 - i1)]
                continue
            if tag in ("replace", "delete"):
                rows += [DiffRow("removed", i + 1, None, a[i]) for i in range(i1, i2)]
            if tag in ("replace", "insert"):
                rows += [DiffRow("added", None, j + 1, b[j]) for j in range(j1, j2)]
    return rows
