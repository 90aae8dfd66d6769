"""The services this build implements, in start order. Each module is a service's bootstrap with
``NAME``, ``MIGRATIONS`` and ``component(infra) -> Component``."""

from __future__ import annotations

from types import ModuleType

from services.diary import bootstrap as diary

SERVICES: dict[str, ModuleType] = {
    diary.NAME: diary,
}


def migrations_of(names: list[str]) -> list:
    """The migrations of the services a process serves: each service owns its tables."""
    return [SERVICES[n].MIGRATIONS for n in names]
