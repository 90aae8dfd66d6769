"""The services this build implements, in start order. A service is its bootstrap module
``services.<name>.bootstrap`` with ``NAME``, ``MIGRATIONS`` and ``component(infra) -> Component``;
a name whose package does not exist yet is simply not part of this build.

A bootstrap is imported when its service is first asked for, not when the registry is: a process
imports only what it serves (a pass's process, its own service: docs/perf/analysis.md §2.5).
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only for the annotation: the registry imports no service code up front
    from libs.common.db import Migrations

ORDER = [
    "diary",
    "episodes",
    "skills",
    "profiles",
    "reflector",
    "knowledge",
    "prefetch",
    "sessions",
    "telemetry",
    "privacy",
    "inspector",
]


class _Services(Mapping[str, ModuleType]):
    """Name → bootstrap module; the names are found without importing, a module on first use."""

    def __init__(self, order: list[str]):
        self._names = [n for n in order if _exists(n)]
        self._modules: dict[str, ModuleType] = {}

    def __getitem__(self, name: str) -> ModuleType:
        if name not in self._names:
            raise KeyError(name)
        if name not in self._modules:
            self._modules[name] = importlib.import_module(f"services.{name}.bootstrap")
        return self._modules[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self._names


def _exists(name: str) -> bool:
    return (
        importlib.util.find_spec(f"services.{name}") is not None
        and importlib.util.find_spec(f"services.{name}.bootstrap") is not None
    )


SERVICES: Mapping[str, ModuleType] = _Services(ORDER)


@dataclass(frozen=True)
class PassHome:
    """Where a pass lives: the service whose component builds it, and the sibling services it
    calls over gRPC (served from the pass's own process outside a cluster)."""

    service: str
    calls: tuple[str, ...] = ()


PASSES: dict[str, PassHome] = {
    "diary-sweep": PassHome("diary"),
    "diary-fill": PassHome("diary"),
    "episode-lifecycle": PassHome("episodes"),
    "episode-fill": PassHome("episodes"),
    "skill-curator": PassHome("skills"),
    "skill-synthesis": PassHome("skills", calls=("episodes",)),
    "knowledge-fill": PassHome("knowledge"),
    "skill-promotion": PassHome("knowledge", calls=("episodes",)),
    "diary-orphans": PassHome("diary"),
    "episode-orphans": PassHome("episodes"),
    "knowledge-orphans": PassHome("knowledge"),
    "reflection-prune": PassHome("reflector"),
}
"""Every pass of this build by name (a pass process opens its home alone, plus what it calls);
``tests/test_lean_processes.py`` checks it against the passes the components build."""


def migrations_of(names: list[str]) -> list[Migrations]:
    """The migrations of the services a process serves: each service owns its tables."""
    return [SERVICES[n].MIGRATIONS for n in names]


EMBEDDERS: dict[str, str] = {
    "diary": "warm",
    "episodes": "warm",
    "knowledge": "warm",
    "prefetch": "warm",
    "skills": "lazy",
    "profiles": "none",
    "reflector": "none",
    "sessions": "none",
    "telemetry": "none",
    "inspector": "none",
    "privacy": "none",
}
"""What each service does with the embedding model. ``warm``: its requests embed inline (WriteNote,
RecallNotes, RecordEpisode, a page write, the turn's ask), so a server of it loads the model at
start and the first request does not pay for it. ``lazy``: it may embed (the skills' proposal
duplicate checks): the model loads on the first embed. ``none``: it never reads ``infra.embedder``,
so a process of only such services builds no embedder at all. A service not listed is ``lazy``."""


def embedder_mode(names: list[str]) -> str:
    """What a process serving ``names`` does with the embedding model: ``warm`` when any of them
    embeds inline, else ``lazy`` when any may embed, else ``none``."""
    modes = {EMBEDDERS.get(n, "lazy") for n in names}
    for mode in ("warm", "lazy"):
        if mode in modes:
            return mode
    return "none"
