"""Runs grouped by the tools they used: the similarity, the greedy pass and the medoid.

Skill synthesis (one seat's turns) and cross-agent promotion (a unit's runs over many seats) find
a procedure the same way: a procedure's identity is the SET of its tools, runs whose sets are
similar enough form a cluster around the first one (its seed), and the cluster is shown by its
medoid — a run that happened, never a union nobody performed. Both callers order their input and
their clusters by their own rules; the grouping itself is this one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

__all__ = ["ToolCluster", "greedy_groups", "jaccard", "medoid", "tool_set"]

T = TypeVar("T")


def tool_set(tools: Iterable[str]) -> frozenset[str]:
    """The identity of a procedure: the SET of its tools (order and repeats are not identity)."""
    return frozenset(t for t in tools if t)


def jaccard(a: Iterable[str], b: Iterable[str]) -> float:
    sa, sb = tool_set(a), tool_set(b)
    if not sa and not sb:
        return 0.0
    return len(sa & sb) / len(sa | sb)


def greedy_groups(items: Iterable[T], tools: Callable[[T], Iterable[str]], threshold: float) -> list[list[T]]:
    """Greedy single pass in the given order: each item joins the first group whose seed (first
    member) has a tool set at least ``threshold`` similar, else seeds a new group. Groups in the
    order they were seeded, members in the order they came."""
    groups: list[list[T]] = []
    for item in items:
        for group in groups:
            if jaccard(tools(item), tools(group[0])) >= threshold:
                group.append(item)
                break
        else:
            groups.append([item])
    return groups


def medoid(members: Sequence[T], tools: Callable[[T], Iterable[str]]) -> T:
    """The member most similar to all the others. Ties go to the earlier member."""
    best, best_score = members[0], -1.0
    for m in members:
        score = sum(jaccard(tools(m), tools(o)) for o in members if o is not m)
        if score > best_score:
            best, best_score = m, score
    return best


@dataclass
class ToolCluster(Generic[T]):
    """A group of runs, its first member the seed. A subclass says which tools a member ran."""

    members: list[T] = field(default_factory=list)

    @property
    def seed(self) -> T:
        return self.members[0]

    @property
    def size(self) -> int:
        return len(self.members)

    @staticmethod
    def tools_of(member: T) -> Iterable[str]:
        raise NotImplementedError

    def representative(self) -> T:
        """The medoid (a run that happened, never a union nobody performed); ties go to the
        earlier member, i.e. the newer run."""
        return medoid(self.members, self.tools_of)
