"""What a drafting pass's offline rule writes from a cluster's data alone, written once.

A page or a SKILL.md drafted with no model says when to use it (the kinds of work its members were
woken by, and up to three of their asks quoted whole) and its steps (the representative run's tools
in order). The knowledge promotion (``services.knowledge.promotion``) and the skills' clustered
synthesis (``services.skills.drafting``) read the same cluster data for it: ``labels`` and each
member's ``asked``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["ClusterUsage"]


@dataclass(frozen=True)
class ClusterUsage:
    """When a cluster's procedure is used, as its members say it."""

    labels: list[str]
    """The (at most three) labels the members were most often woken by, most common first."""
    asks: list[str]
    """The members' asks short enough to quote whole, each once, in member order."""

    @classmethod
    def of(cls, data: Mapping[str, Any], quote_chars: int) -> ClusterUsage:
        labels = [label for label, _ in Counter(data.get("labels") or []).most_common(3)]
        asks: list[str] = []
        for m in data["members"]:
            # Quoted whole or not at all: a quote cut mid-sentence reads as the whole ask.
            ask = m.get("asked") or ""
            if ask and len(ask) <= quote_chars and ask not in asks:
                asks.append(ask)
        return cls(labels, asks)

    @property
    def kind(self) -> str:
        """What the work is called: its most common label, else "recurring work"."""
        return self.labels[0] if self.labels else "recurring work"

    def sections(self, tools: Sequence[str], members: str) -> list[str]:
        """The lines of the "When to use" and "Steps" sections; ``members`` names what the draft
        was drafted from ("runs", "turns") when nothing says when to use it."""
        when = [f"- Work woken by: {label}" for label in self.labels] + [f"- Asked like: {a}" for a in self.asks[:3]]
        return [
            "## When to use",
            "",
            *(when or [f"- Work like the {members} this was drafted from."]),
            "",
            "## Steps",
            "",
            *[f"{i}. Call `{tool}`." for i, tool in enumerate(tools, 1)],
        ]
