"""The tree's own Python, for the tests that scan its syntax or text (typing rules, background
tasks, dependencies)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["ROOT", "our_sources"]

ROOT = Path(__file__).resolve().parents[2]


def our_sources() -> list[Path]:
    """Every ``.py`` under libs/ and services/ but the generated stubs (libs/common/gen), sorted."""
    out = []
    for root in ("libs", "services"):
        for path in sorted((ROOT / root).rglob("*.py")):
            if "gen" not in path.relative_to(ROOT).parts:
                out.append(path)
    return out
