"""Who may read what, decided from the settings alone (no I/O): the spec's CanSearch.

A reader's containers are the union of

- the company's ``knowledge.scope`` (every seat reads them),
- its role's ``knowledge_containers`` and ``workspace:<name>`` for each of the role's
  ``workspaces`` (where session learning files a workspace's project lessons),
- the seat's own ``knowledge.seat_containers`` (per-seat read permission on the native backend).

An unknown role adds nothing, whatever ``accept_unknown_roles`` says: read scope is never implied.
On Confluence a seat with a credential of its own (``knowledge.seat_credentials``) reads as that
user, so Confluence's own page permissions apply on top; with no container at all such a seat
searches unscoped, everything its user can see. A seat without one falls back to the org token and
reads only its containers.
"""

from __future__ import annotations

from collections.abc import Sequence

from libs.common.config import Settings, workspace_container
from services.knowledge.domain import Access, Reader

__all__ = ["access_of", "clean", "credential_of", "unit_container"]


def clean(names: Sequence[str] | None) -> list[str]:
    """Names stripped, blanks dropped, first occurrence kept."""
    out: list[str] = []
    for name in names or ():
        name = (name or "").strip()
        if name and name not in out:
            out.append(name)
    return out


def credential_of(settings: Settings, reader: Reader) -> str | None:
    """The seat's own backend credential, if it has one."""
    if not reader.seat:
        return None
    secret = settings.company(reader.company).knowledge.seat_credentials.get(reader.seat)
    return secret.get_secret_value() if secret is not None else None


def access_of(settings: Settings, reader: Reader, *, confluence: bool = False) -> Access:
    """What ``reader`` may read. ``confluence`` says whether the backend can run as the seat's own
    user (only then does a seat credential widen anything)."""
    company = settings.company(reader.company)
    names: list[str] = list(company.knowledge.scope)
    role = company.roles.get(reader.role) if reader.role else None
    if role is not None:
        names += role.knowledge_containers
        names += [workspace_container(w) for w in clean(role.workspaces)]
    if reader.seat:
        names += company.knowledge.seat_containers.get(reader.seat, [])
    own = confluence and credential_of(settings, reader) is not None
    return Access(reader, tuple(clean(names)), own_credential=own)


def unit_container(settings: Settings, company: str, unit: str) -> str | None:
    """The unit's wiki space, where promotion files its drafts; None when not configured."""
    return settings.company(company).knowledge.unit_containers.get(unit) or None
