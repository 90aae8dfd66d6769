"""Who may see and change what in the inspector, checked before any page calls a service.

The services are called with the inspector's service identity, which may act for any company, so
these checks are the inspector's own and come first on every request:

- the principal is the one ``HttpAuthMiddleware`` authenticated (a bearer token, from the
  ``agentlearn_token`` cookie a browser got at sign-in, or local mode on loopback);
- reading needs ``inspect`` (``admin`` implies it) and a company (and a seat, for a token bound to
  one) the token is bound to: another company's page is 403 before anything of it is read;
- a read of every seat's or user's rows of the company (the knowledge drafts, the company's seats)
  needs a token bound to the company alone, the rule the services apply
  (``Principal.require_company_wide``): a token bound to a seat or a user is refused such a page,
  or gets the list narrowed to its own seat's or user's rows;
- a change needs its write scope: ``memory:write`` for notes and skills, ``admin`` for approving or
  rejecting skill proposals (the scopes those RPCs declare);
- every form carries a per-session token (an HMAC keyed by the sign-in token itself, or by a random
  HttpOnly cookie where there is none, as in local mode), checked on every POST, and a POST whose
  ``Origin`` is another site is refused; the cookies are SameSite=Strict and HttpOnly.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from starlette.requests import Request
from starlette.responses import Response

from libs.common.auth import ANONYMOUS, TOKEN_COOKIE, Principal, current_principal, same_origin
from libs.common.config import InspectorConfig
from libs.common.errors import PermissionDenied

__all__ = [
    "COOKIE_PATH",
    "CSRF_COOKIE",
    "Denied",
    "SignInRequired",
    "check_csrf",
    "clear_token_cookie",
    "company_wide",
    "csrf_token",
    "ensure_csrf_cookie",
    "principal_of",
    "require_company_wide",
    "require_reader",
    "require_scope",
    "set_token_cookie",
]

CSRF_COOKIE = "agentlearn_csrf"
"""A random per-browser secret that keys the form tokens where no sign-in token does (local mode,
the sign-in form itself)."""
COOKIE_PATH = "/inspector"
"""The inspector's cookies go to its own pages only (the sessions API takes a bearer header)."""
READ_SCOPE = "inspect"
_LABEL = b"agentlearn-inspector-form"


class SignInRequired(Exception):
    """No valid credential: a page sends the browser to sign in (a POST is refused)."""

    def __init__(self, reason: str = ""):
        super().__init__(reason)
        self.reason = reason


class Denied(Exception):
    """A request the principal may not make: rendered as a page saying why, nothing else."""

    def __init__(self, status: int, title: str, message: str):
        super().__init__(message)
        self.status = status
        self.title = title
        self.message = message


def principal_of(request: Request) -> Principal:
    principal = getattr(request.state, "principal", None)
    return principal if isinstance(principal, Principal) else current_principal()


def require_reader(request: Request, company: str, seat: str | None = None) -> Principal:
    """The principal, when it may read ``company`` (and ``seat``); else SignInRequired or Denied."""
    principal = principal_of(request)
    if principal is ANONYMOUS or principal.kind == "anonymous":
        raise SignInRequired(getattr(request.state, "auth_error", ""))
    if not principal.allows(READ_SCOPE):
        raise Denied(
            403,
            "This token cannot open the inspector",
            "The inspector needs a token with the inspect or admin scope.",
        )
    try:
        principal.check(company or None, seat)
    except PermissionDenied:
        # The same words whether the company or seat exists or not.
        raise Denied(403, "Not yours to see", "This token is bound to another company or seat.") from None
    return principal


def require_company_wide(principal: Principal, what: str) -> None:
    """Refuse, as a service would refuse the token itself (``Principal.require_company_wide``), a
    read of every seat's or user's rows of the company to a token bound to one seat or user: the
    pages call the services as the inspector, so the services never see the token. ``what`` names
    the read ("Listing the knowledge drafts")."""
    try:
        principal.require_company_wide(what)
    except PermissionDenied:
        bound = f"seat {principal.seat}" if principal.seat is not None else f"user {principal.user}"
        raise Denied(
            403,
            "Not yours to see",
            f"This token is bound to {bound}: {what} needs a token bound to the company alone.",
        ) from None


def company_wide(principal: Principal) -> bool:
    """Whether ``principal`` may read every seat's and user's rows of its company (by the same rule
    as :func:`require_company_wide`); a list a page would otherwise show whole is narrowed when not."""
    try:
        principal.require_company_wide("")
    except PermissionDenied:
        return False
    return True


def require_scope(principal: Principal, scope: str, what: str) -> None:
    if not principal.allows(scope):
        raise Denied(403, "Not allowed", f"{what} needs a token with the {scope} scope; this one lacks it.")


# ------------------------------------------------------------------------------ form tokens


def _secret(request: Request) -> str | None:
    return request.cookies.get(TOKEN_COOKIE) or request.cookies.get(CSRF_COOKIE)


def csrf_token(request: Request) -> str:
    """The token every form of this browser session carries (empty until a secret exists: the page
    that renders the first form sets the cookie, see :func:`ensure_csrf_cookie`)."""
    secret = _secret(request) or getattr(request.state, "new_csrf_secret", None)
    if not secret:
        return ""
    return hmac.new(secret.encode(), _LABEL, hashlib.sha256).hexdigest()


def ensure_csrf_cookie(request: Request) -> str | None:
    """A fresh browser secret when the request has none (set on the response by the page)."""
    if _secret(request):
        return None
    new = secrets.token_urlsafe(32)
    request.state.new_csrf_secret = new
    return new


def _same_origin(request: Request) -> bool:
    """No ``Origin`` (not a browser's cross-site request), or this host's. The rule is the one local
    mode's middleware applies to every POST before this runs; here it holds in tokens mode too, where
    the scheme is left out: behind a TLS proxy uvicorn does not trust, the request says http while
    the browser's page is https."""
    origin = request.headers.get("origin")
    return origin is None or same_origin(origin, request.headers.get("host", ""))


def check_csrf(request: Request, submitted: str) -> None:
    """Refuse a POST whose form token is missing or wrong, or that another site sent."""
    expected = csrf_token(request)
    if not _same_origin(request) or not expected or not hmac.compare_digest(submitted or "", expected):
        raise Denied(
            403,
            "The form could not be accepted",
            "The form's security token is missing or does not match this browser session "
            "(it may have come from another site, or the session changed). Reload the page and try again.",
        )


# ------------------------------------------------------------------------------ cookies


def _secure(request: Request, config: InspectorConfig) -> bool:
    if config.cookie_secure == "always":
        return True
    if config.cookie_secure == "never":
        return False
    return request.url.scheme == "https"


def set_token_cookie(response: Response, request: Request, token: str, config: InspectorConfig) -> None:
    response.set_cookie(
        TOKEN_COOKIE,
        token,
        max_age=int(config.session_hours * 3600),
        path=COOKIE_PATH,
        secure=_secure(request, config),
        httponly=True,
        samesite="strict",
    )


def clear_token_cookie(response: Response, request: Request, config: InspectorConfig) -> None:
    response.delete_cookie(
        TOKEN_COOKIE, path=COOKIE_PATH, secure=_secure(request, config), httponly=True, samesite="strict"
    )


def set_csrf_cookie(response: Response, request: Request, secret: str, config: InspectorConfig) -> None:
    response.set_cookie(
        CSRF_COOKIE,
        secret,
        path=COOKIE_PATH,
        secure=_secure(request, config),
        httponly=True,
        samesite="strict",
    )
