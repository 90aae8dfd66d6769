"""An ``EventSink`` that keeps what was emitted, in order, for the unit tier (the one event fake:
``fakes.reflector`` and ``fakes.skills`` name it ``FakeEvents``)."""

from __future__ import annotations

from typing import Any

__all__ = ["RecordedEvents"]


class RecordedEvents:
    def __init__(self) -> None:
        self.emitted: list[tuple[str, dict[str, Any]]] = []
        """``(kind, fields)`` per emit; the fields are company, seat, turn_id and the payload."""

    async def emit(
        self,
        kind: str,
        *,
        company: str | None = None,
        seat: str | None = None,
        turn_id: str | None = None,
        **payload: Any,
    ) -> None:
        self.emitted.append((kind, {"company": company, "seat": seat, "turn_id": turn_id, **payload}))

    @property
    def events(self) -> list[dict[str, Any]]:
        """Every event as one dict, its kind under ``"kind"``."""
        return [{"kind": kind, **fields} for kind, fields in self.emitted]

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["kind"] == kind]

    def kinds(self) -> list[str]:
        return [k for k, _ in self.emitted]
