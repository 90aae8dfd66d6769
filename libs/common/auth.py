"""Who is calling: the principal every request runs as, for gRPC and HTTP alike.

A caller is one of three kinds:

- ``token``: an engine, a person or a tool holding a bearer token issued by ``./run token issue``.
  The token is bound to one company and optionally to one seat and/or one user, and carries
  scopes. A request that names another company, seat or user is refused with PERMISSION_DENIED
  before anything is read, so the refusal never says whether a row exists.
- ``service``: another agentlearn service calling on behalf of its own caller (the reflector's
  workers, the prefetch's reads). Its identity cannot be forged from outside: an in-process secret
  in the all-in-one and split mode, a client certificate on the mutual-TLS internal listener on
  Kubernetes.
- ``local``: the all-in-one on loopback with no authentication configured (local mode). Trusted
  for everything; the ready line says so.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass, field

from libs.common.errors import PermissionDenied

__all__ = [
    "ANONYMOUS",
    "LOCAL",
    "SCOPES",
    "Principal",
    "current_principal",
    "use_principal",
]

SCOPES: dict[str, str] = {
    "memory:read": "read a seat's notes, episodes, skills, profiles, reflections and turn-start context",
    "memory:write": "write, use, refine or delete a seat's notes, episodes, skills and profiles",
    "reflect": "submit finished turns for reflection",
    "chat": "record session work and queue learning checks (the session-learning API)",
    "knowledge:write": "write knowledge pages",
    "inspect": "read everything of the company in the inspector",
    "admin": "everything in its company, including approving skill proposals",
}
"""Every scope a token may carry, with what it allows."""


@dataclass(frozen=True)
class Principal:
    """The caller of one request."""

    kind: str
    """``token``, ``service``, ``local`` or ``anonymous``."""
    company: str | None = None
    """The company a token is bound to; None for ``service`` and ``local`` (any company)."""
    seat: str | None = None
    """The seat a token is bound to; None: any seat of its company."""
    user: str | None = None
    """The user a token is bound to; None: any user of its company."""
    scopes: frozenset[str] = field(default_factory=frozenset)
    """What a token may do (``admin`` implies every scope)."""
    token_id: str | None = None
    """The token's public id (never its secret)."""
    service: str | None = None
    """The calling service, for ``service`` principals."""

    @property
    def trusted(self) -> bool:
        """Local mode and other services act for any company."""
        return self.kind in ("local", "service")

    def allows(self, scope: str) -> bool:
        return self.trusted or "admin" in self.scopes or scope in self.scopes

    def check(self, company: str | None, seat: str | None = None, user: str | None = None) -> None:
        """Refuse a request naming another company, seat or user than the token is bound to."""
        if self.trusted:
            return
        mismatch = (
            (company is not None and company != self.company)
            or (seat is not None and self.seat is not None and seat != self.seat)
            or (user is not None and self.user is not None and user != self.user)
        )
        if mismatch:
            raise PermissionDenied(
                "the credential does not grant access to this company, seat or user",
                reason="CREDENTIAL_SCOPE_MISMATCH",
            )


LOCAL = Principal(kind="local")
"""The principal of every call in local mode."""

ANONYMOUS = Principal(kind="anonymous")
"""No credential: allowed nothing. What code sees outside a request that set a principal, so a
path that forgot to authenticate fails closed."""

_current: contextvars.ContextVar[Principal] = contextvars.ContextVar("agentlearn_principal", default=ANONYMOUS)


def current_principal() -> Principal:
    """The principal of the request being served (ANONYMOUS where none was set)."""
    return _current.get()


def use_principal(principal: Principal) -> contextvars.Token[Principal]:
    """Make ``principal`` current for this task; reset with ``_current.reset(token)``."""
    return _current.set(principal)
