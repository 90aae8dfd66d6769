"""The services this build implements, in start order. A service is its bootstrap module
``services.<name>.bootstrap`` with ``NAME``, ``MIGRATIONS`` and ``component(infra) -> Component``;
a name whose package does not exist yet is simply not part of this build."""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

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


def _discover() -> dict[str, ModuleType]:
    found: dict[str, ModuleType] = {}
    for name in ORDER:
        if importlib.util.find_spec(f"services.{name}") is None:
            continue
        if importlib.util.find_spec(f"services.{name}.bootstrap") is None:
            continue
        found[name] = importlib.import_module(f"services.{name}.bootstrap")
    return found


SERVICES: dict[str, ModuleType] = _discover()


def migrations_of(names: list[str]) -> list:
    """The migrations of the services a process serves: each service owns its tables."""
    return [SERVICES[n].MIGRATIONS for n in names]
