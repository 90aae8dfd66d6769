"""The one refusal for an item its owner does not have: ``<kind> <id> not found for seat <seat>``.

Every read by id within a seat (a note, an episode, a skill; a provenance of one), an observer or a
company said it the same way, reason ``<KIND>_NOT_FOUND`` and metadata naming the id and the owner,
so a program branches on the reason and a person reads which item of whose. Here once. A use case
whose message words the item its own way (``no reflection of turn ...``) passes that message; one
whose item is named by another id (a page id, a turn id) passes that id's key; one whose items have
no owner to name (an erasure, a session: the owner check is elsewhere) passes no seat.
"""

from __future__ import annotations

from typing import TypedDict, TypeVar, Unpack

from libs.common.errors import NotFound

__all__ = ["Owner", "not_found_error", "require_found"]

T = TypeVar("T")


class Owner(TypedDict, total=False):
    """Whose the item is and how the refusal words it (every key optional)."""

    seat: str | None
    """The owner's handle (a seat, an observer, a company); None: the refusal names no owner."""
    scope: str
    """What the owner is to the item, the metadata key naming it (default ``seat``)."""
    id_key: str | None
    """The metadata key of the id (default ``<kind>_id``)."""
    message: str | None
    """The use case's own message (default ``<kind> <id> not found[ for <scope> <seat>]``)."""


def not_found_error(kind: str, item_id: str, *, domain: str, **owner: Unpack[Owner]) -> NotFound:
    """NotFound for the ``kind`` ``item_id`` of ``owner``: reason ``<KIND>_NOT_FOUND``, metadata
    the id and, with a seat, the owner under ``scope``."""
    seat, scope = owner.get("seat"), owner.get("scope", "seat")
    metadata: dict[str, object] = {owner.get("id_key") or f"{kind}_id": item_id}
    whose = ""
    if seat is not None:
        metadata[scope] = seat
        whose = f" for {scope} {seat}"
    return NotFound(
        owner.get("message") or f"{kind} {item_id} not found{whose}",
        reason=f"{kind.upper()}_NOT_FOUND",
        domain=domain,
        metadata=metadata,
    )


def require_found(found: T | None, kind: str, item_id: str, *, domain: str, **owner: Unpack[Owner]) -> T:
    """``found``, or :func:`not_found_error` (which words the arguments) when it is None."""
    if found is None:
        raise not_found_error(kind, item_id, domain=domain, **owner)
    return found
