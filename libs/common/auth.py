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

import contextlib
import contextvars
import functools
import hashlib
import hmac
import ipaddress
import secrets
import time
import uuid
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import urlsplit

from google.protobuf import descriptor_pool

if TYPE_CHECKING:
    from google.protobuf.descriptor_pb2 import MethodOptions
    from google.protobuf.internal.extension_dict import _ExtensionFieldDescriptor

from libs.common.errors import InvalidArgument, PermissionDenied, Unauthenticated
from libs.common.rows import RowReader

__all__ = [
    "ANONYMOUS",
    "LOCAL",
    "SCOPES",
    "Principal",
    "current_principal",
    "is_loopback",
    "same_origin",
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

    def require_company_wide(self, what: str) -> None:
        """Refuse a read of every seat's or user's rows of the company (an operator's knowledge read,
        a draft's or a lesson's provenance, the company's seats) to a token bound to one seat or
        user: such a token sees its own seat's or user's rows only. ``what`` names the read."""
        if self.trusted or (self.seat is None and self.user is None):
            return
        bound = f"seat {self.seat}" if self.seat is not None else f"user {self.user}"
        raise PermissionDenied(
            f"the credential is bound to {bound}: {what} needs a credential bound to the company alone",
            reason="COMPANY_WIDE_CREDENTIAL_REQUIRED",
            metadata={k: v for k, v in (("bound_seat", self.seat), ("bound_user", self.user)) if v is not None},
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
    """Make ``principal`` current for this task; undo with :func:`reset_principal`."""
    return _current.set(principal)


def reset_principal(token: contextvars.Token[Principal]) -> None:
    """Restore the principal that was current before :func:`use_principal` returned ``token``."""
    _current.reset(token)


# --------------------------------------------------------------------------------------------
# Tokens: issued, listed and revoked by ``./run token``; only a digest is stored.
# --------------------------------------------------------------------------------------------

TOKEN_PREFIX = "agl_"


def digest_of(token: str) -> str:
    """What the store keeps of a token. Tokens are 256 random bits, so a plain SHA-256 is enough:
    there is nothing to brute-force that a slow hash would protect."""
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class TokenRecord:
    """A token as an operator sees it: never its secret."""

    id: str
    company: str
    seat: str | None
    user: str | None
    scopes: tuple[str, ...]
    name: str
    create_time: datetime
    expire_time: datetime | None
    revoke_time: datetime | None
    last_used_time: datetime | None

    def principal(self) -> Principal:
        return Principal(
            kind="token",
            company=self.company,
            seat=self.seat,
            user=self.user,
            scopes=frozenset(self.scopes),
            token_id=self.id,
        )

    def live(self, now: datetime) -> bool:
        return self.revoke_time is None and (self.expire_time is None or self.expire_time > now)


_TOKEN_COLUMNS = "id, company, seat, user_handle, scopes, name, create_time, expire_time, revoke_time, last_used_time"
TOKEN_SQL = {
    "insert": """INSERT INTO api_tokens (id, digest, company, seat, user_handle, scopes, name, create_time,
                     expire_time) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)""",
    "by_digest": f"SELECT {_TOKEN_COLUMNS} FROM api_tokens WHERE digest = $1",
    "touch": "UPDATE api_tokens SET last_used_time = $2 WHERE id = $1",
    "revoke": "UPDATE api_tokens SET revoke_time = $2 WHERE id = $1 AND revoke_time IS NULL",
    "get": f"SELECT {_TOKEN_COLUMNS} FROM api_tokens WHERE id = $1",
    "list": f"""SELECT {_TOKEN_COLUMNS} FROM api_tokens WHERE ($1::text IS NULL OR company = $1)
                ORDER BY company, create_time DESC""",
}


# ``user`` is the column ``user_handle`` (``user`` is reserved in SQL).
_token_record = RowReader(TokenRecord, {"id": str, "scopes": tuple}, computed={"user": lambda row: row["user_handle"]})


MAX_TOKEN_TTL = timedelta(days=36_500)
"""The longest lifetime a token is issued with (a century: past it, the expiry date overflows long
before it matters; unset is "never")."""


def check_issue(
    company: str,
    scopes: Sequence[str],
    *,
    seat: str | None = None,
    user: str | None = None,
    ttl: timedelta | None = None,
) -> None:
    """Refuse a token no request could use: the company, seat and user by the identifier rule every
    service applies to a request's own (a token for "ac me" would match only requests that are
    refused), and a lifetime that is over at issue (``ttl`` None is the one way to say "never")."""
    from libs.common.validation import require_ident

    unknown = sorted(set(scopes) - set(SCOPES))
    if not scopes or unknown:
        raise InvalidArgument(
            f"scopes must be some of {', '.join(SCOPES)}; unknown: {', '.join(unknown) or '(none given)'}",
            reason="SCOPE_UNKNOWN",
            field="scopes",
        )
    if not company:
        raise InvalidArgument("a token is bound to a company", reason="FIELD_REQUIRED", field="company")
    require_ident(company, "company", domain="agentlearn.dev")
    for value, name in ((seat, "seat"), (user, "user")):
        if value:
            require_ident(value, name, domain="agentlearn.dev")
    if ttl is not None and not timedelta(0) < ttl <= MAX_TOKEN_TTL:
        raise InvalidArgument(
            f"a token's lifetime must be more than 0 and at most {MAX_TOKEN_TTL.days} days "
            "(leave it unset for a token that never expires)",
            reason="FIELD_INVALID",
            field="ttl",
        )


class TokenStore:
    """The ``api_tokens`` table (common migration 0002)."""

    def __init__(self, pool: Any, clock: Any):
        self._pool = pool
        self._clock = clock

    async def issue(
        self,
        company: str,
        scopes: Sequence[str],
        *,
        seat: str | None = None,
        user: str | None = None,
        name: str = "",
        ttl: timedelta | None = None,
    ) -> tuple[str, TokenRecord]:
        """A new token (returned once, never stored) and its record."""
        check_issue(company, scopes, seat=seat, user=user, ttl=ttl)
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        now = self._clock.now()
        token_id = uuid.uuid4()
        await self._pool.execute(
            TOKEN_SQL["insert"],
            token_id,
            digest_of(token),
            company,
            seat or None,
            user or None,
            sorted(set(scopes)),
            name,
            now,
            now + ttl if ttl else None,
        )
        record = await self.get(str(token_id))
        assert record is not None
        return token, record

    async def get(self, token_id: str) -> TokenRecord | None:
        try:
            key = uuid.UUID(token_id)
        except ValueError:
            return None
        row = await self._pool.fetchrow(TOKEN_SQL["get"], key)
        return _token_record(row) if row else None

    async def by_token(self, token: str) -> TokenRecord | None:
        row = await self._pool.fetchrow(TOKEN_SQL["by_digest"], digest_of(token))
        return _token_record(row) if row else None

    async def touch(self, token_id: str) -> None:
        await self._pool.execute(TOKEN_SQL["touch"], uuid.UUID(token_id), self._clock.now())

    async def revoke(self, token_id: str) -> bool:
        """True when this call revoked it (False: unknown or already revoked)."""
        try:
            key = uuid.UUID(token_id)
        except ValueError:
            return False
        status: str = await self._pool.execute(TOKEN_SQL["revoke"], key, self._clock.now())
        return status.endswith("1")

    async def list(self, company: str | None = None) -> list[TokenRecord]:
        return [_token_record(r) for r in await self._pool.fetch(TOKEN_SQL["list"], company)]


# --------------------------------------------------------------------------------------------
# Authenticating a call: bearer tokens, the in-process service secret, mutual TLS.
# --------------------------------------------------------------------------------------------

INTERNAL_HEADER = "x-agentlearn-internal"
"""Metadata carrying the deployment's internal secret on calls between services (all-in-one,
split mode). Never logged; an outside caller cannot know it."""
SERVICE_HEADER = "x-agentlearn-service"
"""The calling service's name, beside the secret (for traces and logs)."""


_MAX_SERVICES = 256
"""Service principals an authenticator keeps (only a caller holding the secret or a verified
certificate names one, but a cache is bounded whoever fills it)."""


class Authenticator:
    """Turns a call's credentials into a :class:`Principal`.

    ``mode`` is ``local`` (every call is LOCAL: the all-in-one on loopback) or ``tokens``. Verified
    tokens are cached for ``cache_seconds`` so the hot path does not read Postgres per call; a
    revocation therefore takes effect within that many seconds on every replica.
    """

    def __init__(
        self,
        store: TokenStore | None,
        clock: Any,
        *,
        mode: str,
        cache_seconds: float = 10.0,
        internal_secret: str | None = None,
        cache_size: int = 10_000,
    ):
        if mode not in ("local", "tokens"):
            raise ValueError(f"unknown auth mode {mode!r}")
        self.mode = mode
        self._store = store
        self._clock = clock
        self._ttl = cache_seconds
        self._internal = internal_secret
        self._internal_bytes = internal_secret.encode() if internal_secret else b""
        self._services: dict[str, Principal] = {}
        """The principal of each calling service (immutable): one object per service, not per call."""
        self._cache: OrderedDict[str, tuple[TokenRecord | None, float]] = OrderedDict()
        self._cache_size = cache_size

    @property
    def local(self) -> bool:
        return self.mode == "local"

    @property
    def trusts_peers(self) -> bool:
        """Verified client-certificate names count as services (only the mutual-TLS internal
        listener requests client certificates at all)."""
        return not self.local

    def attach_store(self, store: TokenStore) -> None:
        """The token store, once Postgres is open (the server binds its ports before that)."""
        self._store = store

    def _service(self, metadata: Mapping[str, str], peer_names: Sequence[str]) -> Principal | None:
        if peer_names:
            # Only the internal listener asks for (and verifies) client certificates: a verified
            # peer name is another agentlearn service.
            return self._service_principal(peer_names[0])
        secret = metadata.get(INTERNAL_HEADER)
        if secret and self._internal and hmac.compare_digest(secret.encode(), self._internal_bytes):
            return self._service_principal(metadata.get(SERVICE_HEADER) or "internal")
        return None

    def _service_principal(self, service: str) -> Principal:
        principal = self._services.get(service)
        if principal is None:
            principal = Principal(kind="service", service=service)
            if len(self._services) < _MAX_SERVICES:  # the deployment's services: a handful
                self._services[service] = principal
        return principal

    async def authenticate(self, metadata: Mapping[str, str], peer_names: Sequence[str] = ()) -> Principal:
        """The principal of a call, or Unauthenticated."""
        service = self._service(metadata, peer_names if not self.local else ())
        if service is not None:
            return service  # in local mode too: load shedding tells a service's inner calls apart
        if self.local:
            return LOCAL
        header = metadata.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if not header:
            raise Unauthenticated(
                "this server requires a bearer token: send metadata 'authorization: Bearer <token>' "
                "(issued by ./run token issue)",
                reason="CREDENTIAL_MISSING",
            )
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthenticated("the authorization header must be 'Bearer <token>'", reason="CREDENTIAL_MALFORMED")
        record = await self._lookup(token.strip())
        if record is None or not record.live(self._clock.now()):
            raise Unauthenticated("the token is unknown, revoked or expired", reason="CREDENTIAL_INVALID")
        return record.principal()

    async def _lookup(self, token: str) -> TokenRecord | None:
        key = digest_of(token)
        now = time.monotonic()
        hit = self._cache.get(key)
        if hit is not None and hit[1] > now:
            self._cache.move_to_end(key)
            return hit[0]
        if self._store is None:
            raise Unauthenticated("the server is still starting", reason="CREDENTIAL_UNVERIFIABLE")
        record = await self._store.by_token(token)
        if record is not None and record.live(self._clock.now()):
            with contextlib.suppress(Exception):  # last-used is bookkeeping; never fail a call on it
                await self._store.touch(record.id)
        self._cache[key] = (record, now + self._ttl)
        self._cache.move_to_end(key)
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return record


# --------------------------------------------------------------------------------------------
# What a request names, and what its RPC needs.
# --------------------------------------------------------------------------------------------

_SEAT_FIELDS = ("seat", "observer")
_IDENTITY_FIELDS = ("company", "user", *_SEAT_FIELDS)


def named_identities(message: Any, depth: int = 0) -> list[tuple[str | None, str | None, str | None]]:
    """Every (company, seat, user) a request names: its own ``company`` / ``seat`` (or
    ``observer``) / ``user`` fields, and those of messages nested in it (a ``turn``, say).
    Empty strings name nothing."""
    if depth > 4 or not hasattr(message, "ListFields"):
        return []
    found: list[tuple[str | None, str | None, str | None]] = []
    own: dict[str, str] = {}
    for fd, value in message.ListFields():
        if fd.type == fd.TYPE_STRING and not fd.is_repeated and fd.name in _IDENTITY_FIELDS:
            own["seat" if fd.name in _SEAT_FIELDS else fd.name] = value
        elif fd.type == fd.TYPE_MESSAGE and not fd.message_type.GetOptions().map_entry:
            for item in value if fd.is_repeated else [value]:
                found += named_identities(item, depth + 1)
    if own:
        found.insert(0, (own.get("company") or None, own.get("seat") or None, own.get("user") or None))
    return found


@functools.lru_cache(maxsize=1024)
def required_scope(method: str) -> str:
    """The scope ``/pkg.Service/Method`` declares in its proto (``admin`` when it declares none)."""
    from agentlearn.common.v1 import auth_pb2

    name = method.strip("/").replace("/", ".")
    try:
        descriptor = descriptor_pool.Default().FindMethodByName(name)
    except KeyError:
        return "admin"
    # protoc's --pyi_out types an extension as a plain FieldDescriptor; this one extends
    # MethodOptions with a string.
    extension = cast("_ExtensionFieldDescriptor[MethodOptions, str]", auth_pb2.required_scope)
    scope = descriptor.GetOptions().Extensions[extension]
    return scope or "admin"


def authorize(principal: Principal, method: str, request: Any) -> None:
    """Refuse a call its principal may not make: the RPC's scope, then every identity the request
    names. Runs before the handler reads anything, so a refusal says nothing about rows."""
    if principal.trusted:
        return  # allows() every scope and check() passes every identity: nothing to walk
    scope = required_scope(method)
    if not principal.allows(scope):
        raise PermissionDenied(
            f"the credential lacks the scope {scope!r} this call needs",
            reason="SCOPE_MISSING",
            metadata={"scope": scope},
        )
    for company, seat, user in named_identities(request):
        principal.check(company, seat, user)


def scope_table() -> str:
    """Markdown: every RPC of every contract with the scope it declares (docs/security.md embeds
    it; a test keeps the page in step with the protos)."""
    import importlib
    import pkgutil

    import agentlearn
    from agentlearn.common.v1 import auth_pb2

    rows = []
    for info in sorted(pkgutil.walk_packages(agentlearn.__path__, "agentlearn."), key=lambda i: i.name):
        if not info.name.endswith("_pb2"):
            continue
        module = importlib.import_module(info.name)
        for service in module.DESCRIPTOR.services_by_name.values():
            for method in service.methods:
                scope = method.GetOptions().Extensions[auth_pb2.required_scope] or "admin"
                rows.append(f"| `{service.full_name}` | `{method.name}` | `{scope}` |")
    return "\n".join(["| service | RPC | scope |", "|---|---|---|", *rows])


if __name__ == "__main__":
    print(scope_table())


# --------------------------------------------------------------------------------------------
# HTTP: the same principal for the session-learning API, the inspector and /metrics.
# --------------------------------------------------------------------------------------------

TOKEN_COOKIE = "agentlearn_token"
"""A browser (the inspector) carries its token in this HttpOnly, SameSite=Strict cookie instead of
an Authorization header."""


def is_loopback(host: str) -> bool:
    """``localhost`` or a loopback address (``127.0.0.1``, ``::1``, bracketed or not): a name only
    this machine reaches, which a web page elsewhere cannot point at this server."""
    host = host.strip().lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _loopback_authority(authority: str) -> bool:
    """A ``Host`` header (``name[:port]``, ``[v6][:port]``) naming a loopback host, any port."""
    try:
        host = urlsplit(f"//{authority}").hostname
    except ValueError:
        return False
    return host is not None and is_loopback(host)


_DEFAULT_PORTS = {"http": 80, "https": 443}


def same_origin(origin: str, host: str, scheme: str | None = None) -> bool:
    """Whether a page of ``origin`` (an ``Origin`` header) is the site a request addressed to ``host``
    (its ``Host`` header) over ``scheme`` belongs to: the scheme, the host name (case aside) and the
    port (80 or 443 when unsaid) are all equal. Names count as spelled, as a browser counts them:
    ``localhost``, ``127.0.0.1`` and ``[::1]`` are three origins, and every port is another one (a
    notebook or a dev server on this machine is another site). The opaque ``null`` and anything
    unparsable are never the same. ``scheme`` None takes the page's own: for a server that may not
    know the scheme the browser used (a TLS proxy uvicorn does not trust)."""
    try:
        page = urlsplit(origin)
        here = urlsplit(f"//{host}")
        page_port, here_port = page.port, here.port
    except ValueError:
        return False
    scheme = page.scheme if scheme is None else scheme
    if page.scheme not in _DEFAULT_PORTS or scheme not in _DEFAULT_PORTS:
        return False
    if page.hostname is None or here.hostname is None or page.username is not None or here.username is not None:
        return False
    mine = (scheme, here.hostname, here_port or _DEFAULT_PORTS[scheme])
    return (page.scheme, page.hostname, page_port or _DEFAULT_PORTS[page.scheme]) == mine


_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class HttpAuthMiddleware:
    """ASGI middleware: authenticates every HTTP request as the gRPC interceptor does and puts the
    principal in ``scope["state"]["principal"]`` (Starlette's ``request.state.principal``) and in
    :func:`current_principal`. No or a bad credential is 401 with a JSON error body naming the
    reason; paths in ``public`` (health, metrics, the OpenAPI document) need none. What each route
    may do (its scope, the session's owner) is the route's to check against the principal.

    Paths in ``optional`` (exact, or a prefix when they end in ``*``) belong to routes that answer
    a request without a valid credential themselves (a browser is sent to a sign-in page, not
    shown a JSON 401): a missing or refused credential runs as ANONYMOUS, with the refusal's reason
    in ``scope["state"]["auth_error"]``; a valid one runs as its principal, as anywhere.

    Local mode trusts this machine, not every web page its browser opens: a page on another site
    can send the browser here (a form POST needs no preflight) or, by DNS rebinding, make its own
    name resolve to 127.0.0.1 and read the answers. So in local mode a request whose ``Host`` is
    not a loopback name (``localhost``, ``127.0.0.1``, ``[::1]``, any port) is 421 and a
    state-changing one (not GET, HEAD or OPTIONS) whose ``Origin`` is not this server's own origin
    (:func:`same_origin`) is 403, every path included, before anything runs: a page on another
    loopback port (a dev server, a notebook) is another site too. A client that sends no
    ``Origin`` (curl, a script, any program) is not a browser tab and is served."""

    def __init__(
        self,
        app: Any,
        authenticator: Authenticator,
        *,
        public: Sequence[str] = (),
        cookies: bool = False,
        optional: Sequence[str] = (),
    ):
        self.app = app
        self.authenticator = authenticator
        self.public = tuple(public)
        self.cookies = cookies
        self.optional = tuple(optional)

    def _optional(self, path: str) -> bool:
        return any(path.startswith(p[:-1]) if p.endswith("*") else path == p for p in self.optional)

    def _credentials(self, scope: Mapping[str, Any]) -> dict[str, str]:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}
        if "authorization" not in headers and self.cookies:
            for part in headers.get("cookie", "").split(";"):
                name, _, value = part.strip().partition("=")
                if name == TOKEN_COOKIE and value:
                    headers["authorization"] = f"Bearer {value}"
        return headers

    async def _refused_locally(self, scope: Mapping[str, Any], send: Any) -> bool:
        """Local mode: answer (and say True) a request from a browser tab another site drives."""
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}
        host = headers.get("host", "")
        if not _loopback_authority(host):
            await _json_error(
                send,
                421,
                "PERMISSION_DENIED",
                "HOST_NOT_LOOPBACK",
                f"local mode answers only requests addressed to localhost, 127.0.0.1 or [::1], not {host!r} "
                "(a web page of another site can point its own name at this machine); open "
                "http://127.0.0.1:<port>/ or run with --require-auth",
                {},
            )
            return True
        origin = headers.get("origin")
        scheme = str(scope.get("scheme", "http"))
        unsafe = scope.get("method", "GET") not in _SAFE_METHODS
        if unsafe and origin is not None and not same_origin(origin, host, scheme):
            await _json_error(
                send,
                403,
                "PERMISSION_DENIED",
                "ORIGIN_NOT_SAME",
                f"local mode takes changes only from its own pages ({scheme}://{host}), not from a page of "
                f"another site or of another port on this machine (Origin {origin!r})",
                {},
            )
            return True
        return False

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.authenticator.local and await self._refused_locally(scope, send):
            return
        path = scope.get("path", "")
        if any(path == p or (p.endswith("/") and path.startswith(p)) for p in self.public):
            scope.setdefault("state", {})["principal"] = ANONYMOUS
            await self.app(scope, receive, send)
            return
        try:
            principal = await self.authenticator.authenticate(self._credentials(scope))
        except Unauthenticated as err:
            if not self._optional(path):
                await _json_error(send, 401, "UNAUTHENTICATED", err.reason, err.message, {"www-authenticate": "Bearer"})
                return
            scope.setdefault("state", {})["auth_error"] = err.reason
            principal = ANONYMOUS
        scope.setdefault("state", {})["principal"] = principal
        token = use_principal(principal)
        try:
            await self.app(scope, receive, send)
        finally:
            _current.reset(token)


async def _json_error(send: Any, status: int, code: str, reason: str, message: str, headers: dict[str, str]) -> None:
    """An error body with the fields of the gRPC refusal (``status`` is the gRPC code name, ``reason``
    and ``domain`` the ErrorInfo's), the same shape the HTTP API's own refusals have."""
    import json

    body = json.dumps(
        {"error": {"code": status, "status": code, "reason": reason, "domain": "agentlearn.dev", "message": message}}
    ).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.encode(), v.encode()) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})
