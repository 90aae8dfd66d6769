"""The one refusal for a seat's item it does not have: ``<kind> <id> not found for seat <seat>``.

Every read by id within a seat (a note, an episode, a skill; a provenance of one) said it the same
way, reason ``<KIND>_NOT_FOUND`` and metadata naming the id and the seat, so a program branches on
the reason and a person reads which item of which seat. Here once.
"""

from __future__ import annotations

from typing import TypeVar

from libs.common.errors import NotFound

__all__ = ["require_found"]

T = TypeVar("T")


def require_found(found: T | None, kind: str, item_id: str, *, seat: str, domain: str, scope: str = "seat") -> T:
    """``found``, or NotFound for the ``kind`` ``item_id`` of ``seat`` (``scope`` names what the
    seat is to the item, e.g. ``observer``): reason ``<KIND>_NOT_FOUND``, metadata
    ``<kind>_id`` and ``<scope>``."""
    if found is None:
        raise NotFound(
            f"{kind} {item_id} not found for {scope} {seat}",
            reason=f"{kind.upper()}_NOT_FOUND",
            domain=domain,
            metadata={f"{kind}_id": item_id, scope: seat},
        )
    return found
