"""Text as compared for sameness (issue 13): case and spacing do not make a text new. One fold
serves the skills' duplicate checks (a skill's name and body), prefetch's refresh-hint ledger and
the profiles' merge (an entry's key)."""

from __future__ import annotations

__all__ = ["fold"]


def fold(text: str) -> str:
    """Case-folded, every run of whitespace one space, no leading or trailing space."""
    return " ".join(text.casefold().split())
