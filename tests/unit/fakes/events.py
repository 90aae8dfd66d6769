"""An ``EventSink`` that keeps what was emitted, for the unit tier."""

from __future__ import annotations

from typing import Any

__all__ = ["RecordedEvents"]


class RecordedEvents:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    async def emit(
        self,
        kind: str,
        *,
        company: str | None = None,
        seat: str | None = None,
        turn_id: str | None = None,
        **payload: Any,
    ) -> None:
        self.events.append({"kind": kind, "company": company, "seat": seat, "turn_id": turn_id, **payload})

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["kind"] == kind]
