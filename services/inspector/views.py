"""The inspector's pages: company → seat drill-down, session learning, and the actions, each an RPC
the CLI could also make.

Every handler first checks the signed-in principal (``security.require_reader``) for the company
and seat in its path, then calls the services through the :class:`~services.inspector.rpc.Gateway`.
Those calls run as the inspector, so a read of every seat's or user's rows of the company is checked
here by the services' own rule (``security.require_company_wide``, ``security.company_wide``): a
token bound to a seat or a user is refused it, or sees the list narrowed to its own rows.
A read a page merely decorates with (a count, a chart) degrades to "unavailable" when its service
does not answer; the page's own subject failing is the page's error, with the service's reason.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any, TypeAlias, TypeVar
from urllib.parse import quote

from google.protobuf.timestamp_pb2 import Timestamp
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from agentlearn.diary.v1 import diary_service_pb2 as diary
from agentlearn.episodes.v1 import episode_service_pb2 as episodes
from agentlearn.knowledge.v1 import knowledge_service_pb2 as knowledge
from agentlearn.profiles.v1 import profile_service_pb2 as profiles
from agentlearn.reflector.v1 import reflector_service_pb2 as reflector
from agentlearn.sessions.v1 import session_service_pb2 as sessions
from agentlearn.skills.v1 import skill_service_pb2 as skills
from agentlearn.telemetry.v1 import telemetry_service_pb2 as telemetry
from libs.common.auth import TOKEN_COOKIE, Principal
from libs.common.config import DiaryConfig, InspectorConfig, SessionsConfig
from services.inspector import charts, security
from services.inspector.diff import diff_rows
from services.inspector.paging import Page, offset_page, scan
from services.inspector.render import environment, seg, unseg
from services.inspector.rpc import Gateway, ServiceError
from services.inspector.security import (
    Denied,
    SignInRequired,
    company_wide,
    principal_of,
    require_company_wide,
    require_reader,
    require_scope,
)

__all__ = ["PREFIX", "Inspector"]

_log = logging.getLogger(__name__)
V = TypeVar("V")

PREFIX = "/inspector"
STATIC = Mount(f"{PREFIX}/static", app=StaticFiles(directory=__file__.rsplit("/", 1)[0] + "/static"), name="static")
MAX_QUERY = 200
SEARCH_POOL = 50
"""A search the service ranks (notes, episodes) asks for this many per half (the diary's at most its
``learning.diary.max_recall_limit``, past which RecallNotes refuses the search); the pool is paged
here."""
AUTO_DRAFTED = "Auto-Drafted Skills"
"""The knowledge page cross-agent promotion files its drafts under, one per space."""
DRAFTS_PAGE_MAX = 50
"""ListPages returns at most 50 pages with their bodies."""
THRESHOLD = 0.1
"""Berlot-Attwell: fewer average uses per skill than this and the library may not be doing what it
claims (GetLearningHealth answers with the same value)."""

FLASH = {
    "note_deleted": "The note was deleted.",
    "rolled_back": "The skill was rolled back: the chosen version's body is its new version.",
    "pinned": "The skill is pinned: no automatic transition will touch it.",
    "unpinned": "The skill is unpinned: it is back on the curator's clock.",
    "archived": "The skill is archived: hidden from menus, its use refused.",
    "restored": "The skill is active again with a fresh staleness clock.",
    "approved": "The proposal was approved: it is a live skill now.",
    "rejected": "The proposal was rejected: matching candidates will not be proposed again.",
    "signed_out": "You are signed out.",
}
SIGN_IN_ERRORS = {
    "CREDENTIAL_INVALID": "That token is unknown, revoked or expired.",
    "CREDENTIAL_MALFORMED": "That is not a token.",
    "CREDENTIAL_UNVERIFIABLE": "The server is still starting; try again in a moment.",
    "missing": "Paste a token to sign in.",
}
_INT32_MAX = 2**31 - 1
SKILL_ACTIONS = {
    "rollback": ("RollbackSkill", skills.RollbackSkillRequest, "rolled_back"),
    "pin": ("PinSkill", skills.PinSkillRequest, "pinned"),
    "unpin": ("UnpinSkill", skills.UnpinSkillRequest, "unpinned"),
    "archive": ("ArchiveSkill", skills.ArchiveSkillRequest, "archived"),
    "restore": ("RestoreSkill", skills.RestoreSkillRequest, "restored"),
}
PROPOSAL_STATES = {
    "pending": skills.PROPOSAL_STATE_PENDING,
    "approved": skills.PROPOSAL_STATE_APPROVED,
    "rejected": skills.PROPOSAL_STATE_REJECTED,
    "all": skills.PROPOSAL_STATE_UNSPECIFIED,
}
NOTE_TIERS = {"long": diary.NOTE_TIER_LONG, "short": diary.NOTE_TIER_SHORT}
EPISODE_KINDS = {"raw": episodes.EPISODE_KIND_RAW, "compacted": episodes.EPISODE_KIND_COMPACTED}
_Tier: TypeAlias = diary.NoteTier
_Kind: TypeAlias = episodes.EpisodeKind
"""The enums' types by names a method's annotation can read (in the class, ``diary`` and ``episodes`` are pages)."""
SEAT_TABS = [
    ("overview", "Overview", ""),
    ("diary", "Diary", "diary"),
    ("episodes", "Episodes", "episodes"),
    ("skills", "Skills", "skills"),
    ("proposals", "Proposals", "proposals"),
    ("profiles", "Profiles", "profiles"),
    ("reflections", "Reflections", "reflections"),
    ("events", "Events", "events"),
]


class NotFoundPage(Exception):
    """A path that names nothing (a malformed handle, an unknown action)."""


@dataclass
class SeatRow:
    seat: str
    activity: telemetry.SeatActivity | None
    health: skills.GetLearningHealthResponse | None
    notes: int | None
    episodes: int | None


def _ts(value: datetime) -> Timestamp:
    out = Timestamp()
    out.FromDatetime(value)
    return out


def _contains(needle: str, *haystack: str) -> bool:
    folded = needle.casefold()
    return any(folded in (h or "").casefold() for h in haystack)


def _profile_texts(p: Any) -> Iterable[str]:
    """What a search of the profiles tab reads: the subject's names and what was learned of them."""
    return (
        p.subject.handle,
        p.subject.external_id,
        p.subject.platform,
        p.communication_style,
        *p.topics,
        *p.past_decisions,
        *p.sensitivities,
    )


def _reflection_texts(r: Any) -> Iterable[str]:
    """What a search of the reflections tab reads: the turn, its state, gate and reason, and each
    worker's name, failure and writes."""
    state = reflector.ReflectionState.Name(r.state).removeprefix("REFLECTION_STATE_").replace("_", " ")
    return (
        r.turn_id,
        state,
        r.gate,
        r.reason,
        *(w.worker for w in r.workers),
        *(w.failure for w in r.workers),
        *(x for w in r.workers for x in w.written),
    )


def _skills(count: int) -> str:
    return f"{count} skill" if count == 1 else f"{count} skills"


def _safe_next(target: str) -> str:
    """Only a path of the inspector itself (never another host, never a scheme)."""
    if target.startswith(PREFIX + "/") and "//" not in target and "\\" not in target:
        return target
    return PREFIX + "/"


class Inspector:
    def __init__(
        self,
        gateway: Gateway,
        config: InspectorConfig,
        clock: Any,
        *,
        sessions: SessionsConfig | None = None,
        diary: DiaryConfig | None = None,
    ):
        self.rpc = gateway
        self.config = config
        self.clock = clock
        # The settings of the services whose pages follow their own bounds (the sessions' page of
        # checks, the diary's largest recall), as the deployment configures them: the process reads
        # the same settings as theirs.
        self.sessions_config = sessions or SessionsConfig()
        self.diary_config = diary or DiaryConfig()
        self.env = environment()

    # ------------------------------------------------------------------------------ plumbing

    def routes(self) -> list[Any]:
        seat = PREFIX + "/c/{company}/s/{seat}"
        get, post = ["GET"], ["POST"]
        return [
            Route("/", self.root, methods=get),
            Route(PREFIX, self.root, methods=get),
            Route(PREFIX + "/", self._page(self.home), methods=get),
            Route(PREFIX + "/signin", self._page(self.signin), methods=["GET", "POST"]),
            Route(PREFIX + "/signout", self._page(self.signout), methods=post),
            STATIC,
            Route(PREFIX + "/c/{company}/", self._page(self.company), methods=get),
            Route(PREFIX + "/c/{company}/sessions", self._page(self.session_list), methods=get),
            Route(PREFIX + "/c/{company}/drafts", self._page(self.drafts), methods=get),
            Route(PREFIX + "/c/{company}/sessions/{session}", self._page(self.session), methods=get),
            Route(seat + "/", self._page(self.seat), methods=get),
            Route(seat + "/diary", self._page(self.diary), methods=get),
            Route(seat + "/diary/{note_id}/delete", self._page(self.delete_note), methods=post),
            Route(seat + "/episodes", self._page(self.episodes), methods=get),
            Route(seat + "/episodes/{episode_id}", self._page(self.episode), methods=get),
            Route(seat + "/skills", self._page(self.skills), methods=get),
            Route(seat + "/skills/{skill_id}", self._page(self.skill), methods=get),
            Route(seat + "/skills/{skill_id}/{action}", self._page(self.skill_action), methods=post),
            Route(seat + "/proposals", self._page(self.proposals), methods=get),
            Route(seat + "/proposals/{proposal_id}/{decision}", self._page(self.decide), methods=post),
            Route(seat + "/profiles", self._page(self.profiles), methods=get),
            Route(seat + "/reflections", self._page(self.reflections), methods=get),
            Route(seat + "/events", self._page(self.events), methods=get),
        ]

    OPEN_PATHS: tuple[str, ...] = ("/", PREFIX, PREFIX + "/*")
    """Paths that answer a request without a valid credential themselves: ``/`` and ``/inspector``
    redirect, the sign-in page signs in, the static files are public, and every other page sends
    the browser to sign in (never a JSON 401)."""

    def _page(self, handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        @functools.wraps(handler)
        async def endpoint(request: Request) -> Response:
            try:
                return await handler(request)
            except SignInRequired as err:
                if request.method != "GET":
                    return self.render(
                        request,
                        "error.html",
                        401,
                        title="Sign in first",
                        message="Your session has ended; sign in again.",
                    )
                target = f"{PREFIX}/signin?next={quote(request.url.path)}"
                if err.reason and err.reason in SIGN_IN_ERRORS:
                    target += f"&error={err.reason}"
                response: Response = RedirectResponse(target, 303)
                if err.reason and request.cookies.get(TOKEN_COOKIE):
                    security.clear_token_cookie(response, request, self.config)
                return response
            except Denied as err:
                return self.render(request, "error.html", err.status, title=err.title, message=err.message)
            except NotFoundPage:
                return self.render(request, "error.html", 404, title="Not found", message="Nothing here by that name.")
            except ServiceError as err:
                return self.render(
                    request,
                    "error.html",
                    err.http_status,
                    title=f"The {err.service} service refused",
                    message=err.message,
                    reason=err.reason,
                    field=err.field,
                )
            except Exception:
                _log.exception("inspector %s %s failed", request.method, request.url.path)
                return self.render(request, "error.html", 500, title="Something broke", message="See the server log.")

        return endpoint

    def render(self, request: Request, template: str, status: int = 200, **context: Any) -> HTMLResponse:
        secret = security.ensure_csrf_cookie(request)
        principal = principal_of(request)
        done = request.query_params.get("done", "")
        html = self.env.get_template(template).render(
            prefix=PREFIX,
            principal=principal,
            signed_in=principal.kind != "anonymous",
            company_wide=company_wide(principal),
            local=principal.kind in ("local", "service"),
            csrf=security.csrf_token(request),
            flash=FLASH.get(done, ""),
            path=request.url.path,
            at_first=not request.query_params.get("page"),
            **context,
        )
        response = HTMLResponse(html, status)
        if secret:
            security.set_csrf_cookie(response, request, secret, self.config)
        response.headers.update(
            {
                "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self'; "
                "script-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
                "X-Content-Type-Options": "nosniff",
                "Referrer-Policy": "same-origin",
                "X-Frame-Options": "DENY",
                "Cache-Control": "no-store",
            }
        )
        return response

    def _back(self, url: str, done: str) -> RedirectResponse:
        return RedirectResponse(f"{url}?done={done}", 303)

    @staticmethod
    def _handle(request: Request, name: str) -> str:
        handle = unseg(request.path_params[name])
        if handle is None:
            raise NotFoundPage()
        return handle

    @staticmethod
    def _uuid(request: Request, name: str) -> str:
        try:
            return str(uuid.UUID(request.path_params[name]))
        except ValueError:
            raise NotFoundPage() from None

    def _seat_scope(self, request: Request) -> tuple[Principal, str, str]:
        company, seat = self._handle(request, "company"), self._handle(request, "seat")
        return require_reader(request, company, seat), company, seat

    @staticmethod
    def _q(request: Request) -> str:
        return request.query_params.get("q", "").strip()[:MAX_QUERY]

    @staticmethod
    def _token(request: Request) -> str:
        return request.query_params.get("page", "")[:8192]

    async def _form(self, request: Request) -> dict[str, str]:
        form = await request.form()
        fields = {k: v for k, v in form.items() if isinstance(v, str)}
        security.check_csrf(request, fields.get("csrf", ""))
        return fields

    def _window(self) -> tuple[datetime, datetime]:
        end = self.clock.now()
        today = end.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        return today - timedelta(days=self.config.days - 1), end

    @staticmethod
    def _company_context(company: str) -> dict[str, Any]:
        return {"company": company, "company_url": f"{PREFIX}/c/{seg(company)}/"}

    def _seat_context(self, company: str, seat: str, tab: str, principal: Principal) -> dict[str, Any]:
        base = f"{PREFIX}/c/{seg(company)}/s/{seg(seat)}/"
        return {
            **self._company_context(company),
            "seat": seat,
            "seat_url": base,
            "tab": tab,
            "tabs": [(key, label, base + suffix) for key, label, suffix in SEAT_TABS],
            "can_write": principal.allows("memory:write"),
            "can_admin": principal.allows("admin"),
        }

    def _seat_page(
        self, request: Request, template: str, tab: str, scope: tuple[Principal, str, str], **context: Any
    ) -> HTMLResponse:
        """A page under a seat's tabs: ``scope`` is what :meth:`_seat_scope` returned."""
        principal, company, seat = scope
        return self.render(request, template, **self._seat_context(company, seat, tab, principal), **context)

    async def _listed(
        self,
        call: Callable[[str, Any], Awaitable[Any]],
        method: str,
        request_type: Callable[..., Any],
        items: str,
        token: str,
        match: Callable[[Any], bool] | None = None,
        size: int | None = None,
        search_page_size: int = 200,
        **fields: Any,
    ) -> Page[Any]:
        """One inspector page of a service's list (:func:`~services.inspector.paging.scan`):
        ``method`` called with ``fields`` and each service page token, its repeated field ``items``
        kept where ``match`` says. Without a match one service page of ``size`` serves one inspector
        page; a text search the service cannot run reads up to ``search_scan_pages`` service pages
        of ``search_page_size``."""
        size = size or self.config.page_size
        fields["page_size"] = search_page_size if match else size

        async def fetch(service_token: str) -> tuple[Sequence[Any], str]:
            r = await call(method, request_type(page_token=service_token, **fields))
            return getattr(r, items), r.next_page_token

        return await scan(fetch, match, token, size, self.config.search_scan_pages if match else 1)

    async def _searched_tab(
        self,
        request: Request,
        tab: str,
        choice: str,
        choices: Mapping[str, V],
        search: Callable[[str, str, str, V | None], Awaitable[Sequence[Any]]],
        listed: Callable[[str, str, str, V | None], Awaitable[Page[Any]]],
    ) -> Response:
        """A seat tab (template ``<tab>.html``) that lists a service's rows, or with a query pages
        the pool its search ranks, narrowed by the query parameter ``choice`` (one of ``choices``,
        names of a proto enum's values; another or none is None: the request field left unset)."""
        scope = self._seat_scope(request)
        _, company, seat = scope
        q, token = self._q(request), self._token(request)
        name = request.query_params.get(choice, "")
        value = choices.get(name)
        if q:
            page = offset_page(await search(company, seat, q, value), token, self.config.page_size)
        else:
            page = await listed(company, seat, token, value)
        return self._seat_page(
            request, f"{tab}.html", tab, scope, page=page, q=q, filters={"q": q, choice: name}, **{choice: name}
        )

    async def _matched_tab(
        self,
        request: Request,
        tab: str,
        call: Callable[[str, Any], Awaitable[Any]],
        method: str,
        request_type: Callable[..., Any],
        texts: Callable[[Any], Iterable[str]],
        *,
        owner: str = "seat",
        search_page_size: int = 200,
        fields: Mapping[str, Any] | None = None,
        filters: Mapping[str, str] | None = None,
        **context: Any,
    ) -> Response:
        """A seat tab (template ``<tab>.html``) listing the rows ``method`` answers in its repeated
        field ``tab`` for the seat (the request field ``owner``) and the request's other ``fields``;
        with a query, those one of whose ``texts`` contains it (a search the service cannot run:
        :meth:`_listed` scans). ``filters`` are the tab's other query parameters (the pager keeps
        them), ``context`` what else its template shows."""
        scope = self._seat_scope(request)
        _, company, seat = scope
        q = self._q(request)
        listed: dict[str, Any] = {"company": company, owner: seat, **(fields or {})}
        page = await self._listed(
            call,
            method,
            request_type,
            tab,
            self._token(request),
            (lambda row: _contains(q, *texts(row))) if q else None,
            search_page_size=search_page_size,
            **listed,
        )
        return self._seat_page(
            request, f"{tab}.html", tab, scope, page=page, q=q, filters={"q": q, **(filters or {})}, **context
        )

    @staticmethod
    async def _maybe(call: Awaitable[Any]) -> Any:
        """A decoration of a page: its value, or None when its service did not answer."""
        try:
            return await call
        except ServiceError as err:
            _log.info("inspector: %s %s unavailable for a page: %s", err.service, err.code.name, err.reason)
            return None

    # ------------------------------------------------------------------------------ entry

    async def root(self, request: Request) -> Response:
        return RedirectResponse(PREFIX + "/", 307 if request.method != "GET" else 302)

    async def home(self, request: Request) -> Response:
        principal = principal_of(request)
        if principal.kind == "anonymous":
            raise SignInRequired(getattr(request.state, "auth_error", ""))
        if not principal.allows("inspect"):
            raise Denied(403, "This token cannot open the inspector", "The inspector needs the inspect or admin scope.")
        if principal.company:
            target = f"{PREFIX}/c/{seg(principal.company)}/"
            if principal.seat:
                target += f"s/{seg(principal.seat)}/"
            return RedirectResponse(target, 303)
        wanted = request.query_params.get("company", "").strip()
        if wanted:
            if unseg(seg(wanted)) is None:
                return self.render(request, "home.html", 400, companies=[], error="That is not a company handle.")
            return RedirectResponse(f"{PREFIX}/c/{seg(wanted)}/", 303)
        known = await self._maybe(
            self.rpc.episodes("ListEpisodeSeats", episodes.ListEpisodeSeatsRequest(page_size=5000))
        )
        companies = sorted({s.company for s in known.seats}) if known is not None else []
        return self.render(request, "home.html", companies=companies, error="")

    async def signin(self, request: Request) -> Response:
        nxt = _safe_next(request.query_params.get("next", PREFIX + "/"))
        if request.method == "GET":
            error = SIGN_IN_ERRORS.get(request.query_params.get("error", ""), "")
            return self.render(request, "signin.html", next=nxt, error=error)
        form = await self._form(request)
        token = form.get("token", "").strip()
        nxt = _safe_next(form.get("next", nxt))
        if not token or len(token) > 512 or any(c.isspace() or not c.isprintable() for c in token):
            return self.render(
                request,
                "signin.html",
                400,
                next=nxt,
                error=SIGN_IN_ERRORS["missing" if not token else "CREDENTIAL_MALFORMED"],
            )
        # The token is verified by the authentication middleware on the very next request (the
        # redirect); a refused one comes back here with its reason and the cookie cleared.
        response = RedirectResponse(nxt, 303)
        security.set_token_cookie(response, request, token, self.config)
        return response

    async def signout(self, request: Request) -> Response:
        await self._form(request)
        response = RedirectResponse(f"{PREFIX}/signin?done=signed_out", 303)
        security.clear_token_cookie(response, request, self.config)
        return response

    # ------------------------------------------------------------------------------ company

    async def _seat_names(
        self, company: str, principal: Principal, q: str
    ) -> tuple[list[str], dict[str, Any], bool, bool]:
        """The seats the company page lists, those whose handle contains ``q`` (case ignored) when
        it is given: every seat of the company the event log or the episodes know, merged, with each
        one's activity; True when the list was cut (at ``seats_scan_limit``, or at the sessions a
        user's list reads); True when the event log could not be read (the episodes' seats are
        listed alone, without activity).

        The company's seats are every seat's rows, which the services list only to a token bound to
        the company alone; the inspector reads them as itself, so a token bound to a seat or a user
        gets :meth:`_own_seats` instead. The event log searches ``q`` itself
        (``ListSeatActivity.query``), so a seat with an event is found however many seats there are;
        the episodes' seats (which have no search) are matched among the first ``seats_scan_limit``."""
        if not company_wide(principal):
            own, cut = await self._own_seats(company, principal)
            return [n for n in own if _contains(q, n)], {}, cut, False
        start, end = self._window()
        activity: dict[str, Any] = {}
        names: set[str] = set()
        limit = self.config.seats_scan_limit
        token = ""
        unread = False
        while len(names) < limit:
            page = await self._maybe(
                self.rpc.telemetry(
                    "ListSeatActivity",
                    telemetry.ListSeatActivityRequest(
                        company=company,
                        query=q,
                        start_time=_ts(start),
                        end_time=_ts(end),
                        page_size=500,
                        page_token=token,
                    ),
                )
            )
            if page is None:
                unread, token = True, ""
                break
            for s in page.seats:
                activity[s.seat] = s
                names.add(s.seat)
            token = page.next_page_token
            if not token:
                break
        cut = bool(token)
        token = ""
        read = 0  # the episodes' seats read, matching or not: a search reads no more than a listing
        while len(names) < limit and read < limit:
            found = await self._maybe(
                self.rpc.episodes(
                    "ListEpisodeSeats",
                    episodes.ListEpisodeSeatsRequest(company=company, page_size=5000, page_token=token),
                )
            )
            if found is None:
                break
            read += len(found.seats)
            names.update(s.seat for s in found.seats if s.company == company and _contains(q, s.seat))
            token = found.next_page_token
            if not token:
                break
        cut = cut or bool(token) or len(names) > limit  # a page of the event log may overshoot the limit
        return sorted(names)[:limit], activity, cut, unread

    async def _own_seats(self, company: str, principal: Principal) -> tuple[list[str], bool]:
        """The seats a token bound to a seat or a user may list, and True when more may exist than
        were read: a seat-bound token's own seat; a user-bound token's, the seats of that user's
        sessions (what ``ListSessions`` shows the token itself), read up to ``search_scan_pages``
        pages."""
        if principal.seat:
            return [principal.seat], False
        if not principal.user:  # company_wide() said the token is bound to one or the other
            raise Denied(403, "Not yours to see", "This token is bound to neither a seat nor a user.")
        seats: set[str] = set()
        token = ""
        for _ in range(self.config.search_scan_pages):
            resp = await self.rpc.sessions(
                "ListSessions",
                sessions.ListSessionsRequest(
                    company=company, user=principal.user, page_size=self.sessions_config.list_max, page_token=token
                ),
            )
            seats.update(s.seat for s in resp.sessions if s.seat)
            token = resp.next_page_token
            if not token:
                break
        return sorted(seats), bool(token)

    async def _seat_row(self, company: str, seat: str, activity: Any) -> SeatRow:
        health, notes, eps = await asyncio.gather(
            self._maybe(
                self.rpc.skills("GetLearningHealth", skills.GetLearningHealthRequest(company=company, seat=seat))
            ),
            self._maybe(self.rpc.diary("ListNotes", diary.ListNotesRequest(company=company, seat=seat, page_size=1))),
            self._maybe(
                self.rpc.episodes("ListEpisodes", episodes.ListEpisodesRequest(company=company, seat=seat, page_size=1))
            ),
        )
        return SeatRow(
            seat,
            activity,
            health,
            notes.total_size if notes is not None else None,
            eps.total_size if eps is not None else None,
        )

    @staticmethod
    def _narrowed(principal: Principal) -> str:
        """What the company page says when it lists a bound token's own seats, not the company's."""
        if company_wide(principal):
            return ""
        if principal.seat:
            return f"This token is bound to seat {principal.seat}: it lists that seat only."
        return (
            f"This token is bound to user {principal.user}: it lists the seats of that user's sessions only "
            "(every seat of the company needs a token bound to the company alone)."
        )

    async def company(self, request: Request) -> Response:
        company = self._handle(request, "company")
        principal = require_reader(request, company)
        q = self._q(request)
        names, activity, cut, unread = await self._seat_names(company, principal, q)
        page = offset_page(names, self._token(request), self.config.page_size)
        rows = await asyncio.gather(*(self._seat_row(company, n, activity.get(n)) for n in page.items))
        with_health = [(r.seat, r.health) for r in rows if r.health is not None]
        uses_chart = charts.bar_chart(
            "uses",
            "Uses per skill by seat, against the 0.1 threshold",
            [
                charts.Bar(
                    seat,
                    health.health.avg_uses_per_skill,
                    flagged=health.below_berlot_attwell_threshold,
                    text=f"{health.health.avg_uses_per_skill:.2f} ({_skills(health.health.total_skills)})",
                )
                for seat, health in with_health
            ],
            threshold=THRESHOLD,
            threshold_label="0.1 threshold",
            flag_text="below threshold",
        )
        tokens_chart = charts.bar_chart(
            "tokens",
            f"Auxiliary tokens spent by seat, last {self.config.days} days",
            [
                charts.Bar(
                    r.seat,
                    r.activity.auxiliary_tokens if r.activity else 0,
                    text=f"{r.activity.auxiliary_tokens if r.activity else 0:,}",
                )
                for r in rows
            ],
        )
        return self.render(
            request,
            "company.html",
            **self._company_context(company),
            rows=rows,
            page=page,
            q=q,
            cut=cut,
            narrowed=self._narrowed(principal),
            telemetry_unread=unread,
            days=self.config.days,
            uses_chart=uses_chart,
            tokens_chart=tokens_chart,
            threshold=THRESHOLD,
        )

    # ------------------------------------------------------------------------------ seat overview

    async def seat(self, request: Request) -> Response:
        principal, company, seat = self._seat_scope(request)
        start, end = self._window()
        window_start, window_end = _ts(start), _ts(end)
        health, notes, raw, compacted, profs, pending, rates, spend = await asyncio.gather(
            self.rpc.skills("GetLearningHealth", skills.GetLearningHealthRequest(company=company, seat=seat)),
            self._maybe(self.rpc.diary("ListNotes", diary.ListNotesRequest(company=company, seat=seat, page_size=1))),
            self._maybe(self._episode_count(company, seat, episodes.EPISODE_KIND_RAW)),
            self._maybe(self._episode_count(company, seat, episodes.EPISODE_KIND_COMPACTED)),
            self._maybe(
                self.rpc.profiles(
                    "ListProfiles", profiles.ListProfilesRequest(company=company, observer=seat, page_size=1)
                )
            ),
            self._maybe(
                self.rpc.skills(
                    "ListSkillProposals",
                    skills.ListSkillProposalsRequest(
                        company=company, seat=seat, state=skills.PROPOSAL_STATE_PENDING, page_size=200
                    ),
                )
            ),
            self._maybe(
                self.rpc.telemetry(
                    "GetPrefetchHitRates",
                    telemetry.GetPrefetchHitRatesRequest(
                        company=company, seat=seat, start_time=window_start, end_time=window_end
                    ),
                )
            ),
            self._maybe(
                self.rpc.telemetry(
                    "GetAuxiliarySpend",
                    telemetry.GetAuxiliarySpendRequest(
                        company=company, seat=seat, start_time=window_start, end_time=window_end
                    ),
                )
            ),
        )
        days = [start.date() + timedelta(days=i) for i in range((end.date() - start.date()).days + 1)]
        rate_chart = spend_chart = None
        if rates is not None:
            series: dict[str, charts.Series] = {}
            for d in rates.days:
                day = d.day_start_time.ToDatetime(tzinfo=UTC).date()
                series.setdefault(d.block, charts.Series(d.block.replace("_", " "))).points[day] = d.hit_rate
            rate_chart = charts.line_chart(
                "hitrate", f"Prefetch hit rate per block, last {self.config.days} days", days, list(series.values())
            )
        if spend is not None:
            values: dict[tuple[date, str], int] = {}
            for d in spend.days:
                key = (d.day_start_time.ToDatetime(tzinfo=UTC).date(), d.purpose or "(none)")
                values[key] = values.get(key, 0) + d.prompt_tokens + d.completion_tokens
            purposes = [t.purpose or "(none)" for t in spend.totals]
            spend_chart = charts.stacked_columns(
                "spend", f"Auxiliary tokens per purpose per day, last {self.config.days} days", days, purposes, values
            )
        return self.render(
            request,
            "seat.html",
            **self._seat_context(company, seat, "overview", principal),
            health=health,
            notes=notes.total_size if notes is not None else None,
            raw=raw,
            compacted=compacted,
            profiles=profs.total_size if profs is not None else None,
            pending=len(pending.proposals) if pending is not None else None,
            pending_more=bool(pending.next_page_token) if pending is not None else False,
            rates=rates,
            spend=spend,
            rate_chart=rate_chart,
            spend_chart=spend_chart,
            days=self.config.days,
        )

    async def _episode_count(self, company: str, seat: str, kind: episodes.EpisodeKind) -> int:
        resp = await self.rpc.episodes(
            "ListEpisodes",
            episodes.ListEpisodesRequest(
                company=company, seat=seat, page_size=1, filter=episodes.EpisodeFilter(kind=kind)
            ),
        )
        return int(resp.total_size)

    # ------------------------------------------------------------------------------ diary

    async def diary(self, request: Request) -> Response:
        return await self._searched_tab(request, "diary", "tier", NOTE_TIERS, self._recall_notes, self._list_notes)

    async def _recall_notes(self, company: str, seat: str, q: str, tier: _Tier | None) -> list[Any]:
        resp = await self.rpc.diary(
            "RecallNotes",
            diary.RecallNotesRequest(
                company=company,
                seat=seat,
                query=q,
                vector_limit=min(SEARCH_POOL, self.diary_config.max_recall_limit),
                recency_limit=0,
                lexical_limit=min(SEARCH_POOL, self.diary_config.max_recall_limit),
                neighbour_limit=0,  # a search shows what matches, not the notes written beside it
            ),
        )
        return [c.note for c in resp.candidates if not tier or c.note.tier == tier]

    async def _list_notes(self, company: str, seat: str, token: str, tier: _Tier | None) -> Page[Any]:
        return await self._listed(
            self.rpc.diary, "ListNotes", diary.ListNotesRequest, "notes", token, company=company, seat=seat, tier=tier
        )

    async def delete_note(self, request: Request) -> Response:
        principal, company, seat = self._seat_scope(request)
        form = await self._form(request)
        require_scope(principal, "memory:write", "Deleting a note")
        note_id = request.path_params["note_id"]
        await self.rpc.diary("DeleteNote", diary.DeleteNoteRequest(company=company, seat=seat, note_id=note_id))
        back = (
            _safe_next(form.get("back", "")) if form.get("back") else f"{PREFIX}/c/{seg(company)}/s/{seg(seat)}/diary"
        )
        return self._back(back.split("?", 1)[0], "note_deleted")

    # ------------------------------------------------------------------------------ episodes

    async def episodes(self, request: Request) -> Response:
        return await self._searched_tab(
            request, "episodes", "kind", EPISODE_KINDS, self._search_episodes, self._list_episodes
        )

    async def _search_episodes(self, company: str, seat: str, q: str, kind: _Kind | None) -> list[Any]:
        """The raw turns a search ranks (it never returns compacted rows, so ``kind`` narrows nothing)."""
        resp = await self.rpc.episodes(
            "SearchEpisodes",
            episodes.SearchEpisodesRequest(
                company=company, seat=seat, query=q, limit=SEARCH_POOL, lexical_limit=SEARCH_POOL
            ),
        )
        return [h.episode for h in resp.hits]

    async def _list_episodes(self, company: str, seat: str, token: str, kind: _Kind | None) -> Page[Any]:
        return await self._listed(
            self.rpc.episodes,
            "ListEpisodes",
            episodes.ListEpisodesRequest,
            "episodes",
            token,
            company=company,
            seat=seat,
            filter=episodes.EpisodeFilter(kind=kind),
        )

    async def episode(self, request: Request) -> Response:
        principal, company, seat = self._seat_scope(request)
        episode_id = self._uuid(request, "episode_id")
        resp = await self.rpc.episodes(
            "GetEpisode", episodes.GetEpisodeRequest(company=company, seat=seat, episode_id=episode_id)
        )
        exemplars: list[tuple[str, Any]] = []
        if resp.episode.kind == episodes.EPISODE_KIND_COMPACTED:
            found = await asyncio.gather(
                *(
                    self._maybe(
                        self.rpc.episodes(
                            "GetEpisode", episodes.GetEpisodeRequest(company=company, seat=seat, turn_id=t)
                        )
                    )
                    for t in resp.episode.exemplar_turn_ids
                )
            )
            exemplars = [
                (t, f.episode if f is not None else None)
                for t, f in zip(resp.episode.exemplar_turn_ids, found, strict=True)
            ]
        return self.render(
            request,
            "episode.html",
            **self._seat_context(company, seat, "episodes", principal),
            episode=resp.episode,
            exemplars=exemplars,
        )

    # ------------------------------------------------------------------------------ skills

    async def skills(self, request: Request) -> Response:
        archived = request.query_params.get("archived") == "1"
        return await self._matched_tab(
            request,
            "skills",
            self.rpc.skills,
            "ListSkills",
            skills.ListSkillsRequest,
            lambda s: (s.name, s.summary),
            fields={"include_archived": archived},
            filters={"archived": "1" if archived else ""},
            archived=archived,
        )

    async def _versions(self, company: str, seat: str, skill_id: str) -> list[Any]:
        out: list[Any] = []
        token = ""
        for _ in range(20):  # the kept versions are few (max_versions_kept + the live one)
            resp = await self.rpc.skills(
                "ListSkillVersions",
                skills.ListSkillVersionsRequest(
                    company=company, seat=seat, skill_id=skill_id, page_size=100, page_token=token
                ),
            )
            out += list(resp.versions)
            token = resp.next_page_token
            if not token:
                break
        return out

    async def skill(self, request: Request) -> Response:
        principal, company, seat = self._seat_scope(request)
        skill_id = self._uuid(request, "skill_id")
        got, versions = await asyncio.gather(
            self.rpc.skills("GetSkill", skills.GetSkillRequest(company=company, seat=seat, skill_id=skill_id)),
            self._versions(company, seat, skill_id),
        )
        by_number = {v.version: v for v in versions}
        numbers = sorted(by_number)
        diff = None
        diff_error = ""

        def number(name: str, default: int | None) -> int | None:
            raw = request.query_params.get(name, "")
            try:
                return int(raw) if raw else default
            except ValueError:
                return None

        if len(numbers) >= 2 or request.query_params.get("a"):
            a = number("a", numbers[-2] if len(numbers) >= 2 else None)
            b = number("b", numbers[-1] if numbers else None)
            if a in by_number and b in by_number:
                diff = {"a": a, "b": b, "rows": diff_rows(by_number[a].body, by_number[b].body)}
            else:
                diff_error = "Choose two versions the skill keeps."
        return self.render(
            request,
            "skill.html",
            **self._seat_context(company, seat, "skills", principal),
            skill=got.skill,
            versions=versions,
            numbers=numbers,
            diff=diff,
            diff_error=diff_error,
            request_id=str(uuid.uuid4()),
        )

    async def skill_action(self, request: Request) -> Response:
        principal, company, seat = self._seat_scope(request)
        action = request.path_params["action"]
        if action not in SKILL_ACTIONS:
            raise NotFoundPage()
        skill_id = self._uuid(request, "skill_id")
        form = await self._form(request)
        require_scope(principal, "memory:write", "Changing a skill")
        method, message, done = SKILL_ACTIONS[action]
        fields: dict[str, Any] = {"company": company, "seat": seat, "skill_id": skill_id}
        if action == "rollback":
            try:
                version = int(form.get("version", ""))
            except ValueError:
                version = 0
            # Versions count from 1 in the proto's int32: anything else is no version a skill keeps
            # (past int32 the request message itself would refuse it, as a 500).
            if not 1 <= version <= _INT32_MAX:
                raise Denied(400, "Choose a version", "Rolling back needs the version to bring forward.")
            fields["version"] = version
            fields["request_id"] = form.get("request_id", "")[:200]
        await self.rpc.skills(method, message(**fields))
        return self._back(f"{PREFIX}/c/{seg(company)}/s/{seg(seat)}/skills/{skill_id}", done)

    # ------------------------------------------------------------------------------ proposals

    async def proposals(self, request: Request) -> Response:
        state_name = request.query_params.get("state", "pending")
        return await self._matched_tab(
            request,
            "proposals",
            self.rpc.skills,
            "ListSkillProposals",
            skills.ListSkillProposalsRequest,
            lambda p: (p.name, p.summary, p.body),
            fields={"state": PROPOSAL_STATES.get(state_name, skills.PROPOSAL_STATE_PENDING)},
            filters={"state": state_name},
            state=state_name if state_name in PROPOSAL_STATES else "pending",
            states=list(PROPOSAL_STATES),
        )

    async def decide(self, request: Request) -> Response:
        principal, company, seat = self._seat_scope(request)
        decision = request.path_params["decision"]
        if decision not in ("approve", "reject"):
            raise NotFoundPage()
        form = await self._form(request)
        require_scope(principal, "admin", "Approving or rejecting a skill proposal")
        reviewer = principal.user or (f"token:{principal.token_id}" if principal.token_id else principal.kind)
        fields = {
            "company": company,
            "seat": seat,
            "proposal_id": request.path_params["proposal_id"][:200],
            "reviewer": f"inspector ({reviewer})",
            "reason": form.get("reason", "")[:1000],
        }
        if decision == "approve":
            await self.rpc.skills("ApproveSkillProposal", skills.ApproveSkillProposalRequest(**fields))
        else:
            await self.rpc.skills("RejectSkillProposal", skills.RejectSkillProposalRequest(**fields))
        return self._back(
            f"{PREFIX}/c/{seg(company)}/s/{seg(seat)}/proposals", "approved" if decision == "approve" else "rejected"
        )

    # ------------------------------------------------------------------------------ profiles, reflections, events

    async def profiles(self, request: Request) -> Response:
        return await self._matched_tab(
            request,
            "profiles",
            self.rpc.profiles,
            "ListProfiles",
            profiles.ListProfilesRequest,
            _profile_texts,
            owner="observer",
            search_page_size=500,
        )

    async def reflections(self, request: Request) -> Response:
        return await self._matched_tab(
            request,
            "reflections",
            self.rpc.reflector,
            "ListReflections",
            reflector.ListReflectionsRequest,
            _reflection_texts,
        )

    async def events(self, request: Request) -> Response:
        scope = self._seat_scope(request)
        _, company, seat = scope
        kind = self._q(request)[:100]  # an event kind is at most 100 characters (ListEvents' contract)
        page = await self._listed(
            self.rpc.telemetry,
            "ListEvents",
            telemetry.ListEventsRequest,
            "events",
            self._token(request),
            company=company,
            seat=seat,
            kinds=[kind] if kind else [],
        )
        return self._seat_page(request, "events.html", "events", scope, page=page, q=kind, filters={"q": kind})

    # ------------------------------------------------------------------------------ session learning

    async def session_list(self, request: Request) -> Response:
        company = self._handle(request, "company")
        principal = require_reader(request, company)
        q, token = self._q(request), self._token(request)
        seat = principal.seat or (unseg(request.query_params.get("seat", "")) or "")
        page = await self._listed(
            self.rpc.sessions,
            "ListSessions",
            sessions.ListSessionsRequest,
            "sessions",
            token,
            company=company,
            seat=seat,
            user=principal.user or "",
            query=q,
        )
        return self.render(
            request,
            "sessions.html",
            **self._company_context(company),
            page=page,
            q=q,
            seat_filter=seat,
            filters={"q": q, "seat": seat},
        )

    async def _owner_of(self, company: str, session_id: str, principal: Principal) -> Any:
        token = ""
        for _ in range(self.config.search_scan_pages):
            resp = await self.rpc.sessions(
                "ListSessions",
                sessions.ListSessionsRequest(
                    company=company,
                    seat=principal.seat or "",
                    user=principal.user or "",
                    query=session_id,
                    page_size=self.sessions_config.list_max,
                    page_token=token,
                ),
            )
            for s in resp.sessions:
                if s.session_id == session_id:
                    return s
            token = resp.next_page_token
            if not token:
                break
        raise NotFoundPage()

    async def session(self, request: Request) -> Response:
        company = self._handle(request, "company")
        principal = require_reader(request, company)
        session_id = self._handle(request, "session")
        summary = await self._owner_of(company, session_id, principal)
        page = await self._listed(
            self.rpc.sessions,
            "ListLearningChecks",
            sessions.ListLearningChecksRequest,
            "checks",
            self._token(request),
            # Spec "Visibility": the latest 30 checks, the sessions' own default page as configured
            # (``sessions.list_default``; the inspector's page_size is for its other lists).
            size=self.sessions_config.list_default,
            company=company,
            session_id=session_id,
            user=summary.user,
        )
        return self.render(
            request,
            "session.html",
            **self._company_context(company),
            summary=summary,
            seat_url=f"{PREFIX}/c/{seg(company)}/s/{seg(summary.seat)}/",
            page=page,
            filters={},
        )

    # ------------------------------------------------------------------------------ knowledge drafts

    async def drafts(self, request: Request) -> Response:
        company = self._handle(request, "company")
        principal = require_reader(request, company)
        # An operator's knowledge read (no seat, no role): every unit's drafts, which the knowledge
        # service refuses a token bound to a seat or a user; it is called as the inspector here.
        require_company_wide(principal, "listing the company's knowledge drafts")
        q, token = self._q(request), self._token(request)
        container = request.query_params.get("container", "").strip()[:200]
        size = min(self.config.page_size, DRAFTS_PAGE_MAX)
        needs_container = False
        try:
            page = await self._listed(
                self.rpc.knowledge,
                "ListPages",
                knowledge.ListPagesRequest,
                "pages",
                token,
                (lambda p: _contains(q, p.title, p.body, p.container)) if q else None,
                size=size,
                search_page_size=size,
                reader=knowledge.Reader(company=company),  # no seat, no role: an operator's read
                container=container,
                parent_title=AUTO_DRAFTED,
                include_drafts=True,
                view=knowledge.PAGE_VIEW_FULL,
                context=knowledge.ReadContext(source=knowledge.READ_SOURCE_INSPECTOR),
            )
        except ServiceError as err:
            if err.field != "container":
                raise
            # A backend that lists one space at a time (Confluence) asks for the space first.
            page, needs_container = Page([]), True
        return self.render(
            request,
            "drafts.html",
            **self._company_context(company),
            page=page,
            q=q,
            container=container,
            needs_container=needs_container,
            filters={"q": q, "container": container},
        )
