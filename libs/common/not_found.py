"""The one refusal for an item its owner does not have: ``<kind> <id> not found for seat <seat>``.

Every read by id within a seat (a note, an episode, a skill; a provenance of one), an observer or a
company said it the same way, reason ``<KIND>_NOT_FOUND`` and metadata naming the id and the owner,
so a program branches on the reason and a person reads which item of whose. Here once. A use case
whose message words the item its own way (``no reflection of turn ...``) passes that message; one
whose item is named by another id (a page id, a turn id) passes that id's key; one whose items have
no owner to name (an erasure, a session: the owner check is elsewhere) passes no seat.
"""

from __future__ import annotations

from typing import TypeVar

from libs.common.errors import NotFound

__all__ = ["not_found_error", "require_found"]

T = TypeVar("T")


def not_found_error(
    kind: str,
    item_id: str,
    *,
    domain: str,
    seat: str | None = None,
    scope: str = "seat",
    id_key: str | None = None,
    message: str | None = None,
) -> NotFound:
    """NotFound for the ``kind`` ``item_id`` of ``seat`` (``scope`` names what the owner ``seat`` is
    to the item, e.g. ``observer`` or ``company``): reason ``<KIND>_NOT_FOUND``, metadata
    ``<id_key>`` (by default ``<kind>_id``) and, with a seat, ``<scope>``; ``message`` when given,
    else ``<kind> <item_id> not found`` and, with a seat, `` for <scope> <seat>``."""
    metadata: dict[str, object] = {id_key or f"{kind}_id": item_id}
    owner = ""
    if seat is not None:
        metadata[scope] = seat
        owner = f" for {scope} {seat}"
    return NotFound(
        message or f"{kind} {item_id} not found{owner}",
        reason=f"{kind.upper()}_NOT_FOUND",
        domain=domain,
        metadata=metadata,
    )


def require_found(
    found: T | None,
    kind: str,
    item_id: str,
    *,
    domain: str,
    seat: str | None = None,
    scope: str = "seat",
    id_key: str | None = None,
    message: str | None = None,
) -> T:
    """``found``, or :func:`not_found_error` (which words the arguments) when it is None."""
    if found is None:
        raise not_found_error(kind, item_id, domain=domain, seat=seat, scope=scope, id_key=id_key, message=message)
    return found
