"""The seam of cross-agent promotion (spec: "Cross-agent promotion is the third path").

When at least ``learning.promotion.min_sibling_count`` distinct seats of one unit converge on a
similar tool run, a daily pass distils the cluster into a DRAFT page of the team knowledge base
under the unit's "Auto-Drafted Skills" parent, for a lead to review. Its output is deliberately not
a skill row. The pass and its writers (native pages, Confluence) come with the knowledge issue;
this module only fixes the port they will implement, so the skills service has one place to call.

Rules the writer owns (kept here so the port's contract is read with it):

- Cross-tick dedup is the writer's: the pass re-clusters the same rows every tick, and one
  converging cluster must yield one page (Confluence keys on the title, unique in a space). A tick
  that finds the existing draft stays quiet (``created`` False) rather than re-announcing it.
- The draft lives under the auto-drafted parent, created when missing; a writer that cannot create
  the parent refuses the draft rather than filing it at the space root, where every agent reads.
- The container is the unit's wiki space, never its tracker project.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

__all__ = ["PromotionDraft", "PromotionResult", "PromotionWriter"]


@dataclass(frozen=True)
class PromotionDraft:
    company: str
    unit: str
    container_key: str
    """The unit's wiki space."""
    title: str
    body: str
    tool_sequence: tuple[str, ...]
    """The cluster's representative run."""
    sibling_count: int
    """Skills in the converging cluster."""
    distinct_agents: int
    """Distinct seats behind them (what makes it a team's practice, not one seat's habit)."""


@dataclass(frozen=True)
class PromotionResult:
    page_id: str
    page_title: str
    created: bool
    """False when the draft already existed (the tick stays quiet)."""


class PromotionWriter(Protocol):
    async def write_draft(self, draft: PromotionDraft) -> PromotionResult:
        """File the draft under the unit's auto-drafted parent, or find the one already there.
        Raises on a write failure (nothing is announced; the next tick retries)."""
        ...
