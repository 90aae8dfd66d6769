"""The Confluence backend: CQL over the REST API (v1), as the seat's own user.

Spec: "The searcher runs the query as the agent's own backend user (the seat's own Confluence
credential ..., falling back to the org-level token) as a CQL ``text ~ "..."`` clause narrowed by
``space IN (...)``. The backend enforces page permissions natively, so restricted pages the agent
cannot see never appear; unreviewed auto-drafts are excluded by the query's default ancestor
exclusion."

- **Search**: the Auto-Drafted Skills pages of the scope are looked up first (their ids make the
  query's ``ancestor NOT IN (...)``), then ``GET /rest/api/search`` with
  ``type = page AND text ~ "<query>" AND space IN (...) AND ancestor NOT IN (...)``, following
  ``_links.next`` (start + limit) until enough pages are in hand. Every result is checked again on
  this side, fail closed: a page whose ancestors include the parent, the parent itself, an
  ``[Auto-draft]`` title, or a space outside the scope is dropped.
- **The query text** loses Lucene's operators and quotes (which would change what the search means
  or make CQL refuse it), and every value placed in a CQL string is escaped (``\\`` and ``"``).
- **Failures** are outcomes, never raised to a search's caller: 401/403 is "credential refused"
  (naming whose), 429 waits out ``Retry-After`` up to ``max_retry_after_seconds`` and
  ``max_retries`` times, then is "rate limited"; anything else is "unreachable".
- **Reads**: ``GET /rest/api/content/{id}`` (404 is "not there or not yours"), listings through
  ``/rest/api/content/search`` paged by start + limit, onboarding pages by the Onboarding pages'
  ancestry.
- **Drafts** (the ``PromotionWriter`` half, as the org token): dedup by title within the space
  (``GET /rest/api/content?spaceKey&title``); the Auto-Drafted Skills parent is created at the
  space root when missing, and a draft is refused rather than filed at the root when it cannot
  be; the body is posted as storage-format XHTML under the parent.
"""

from __future__ import annotations

import asyncio
import base64
import html
import logging
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from email.utils import parsedate_to_datetime
from html.parser import HTMLParser
from typing import Any, cast
from urllib.parse import parse_qs, urlsplit

import httpx

from libs.common.config import Settings
from libs.common.embeddings import Vector
from services.knowledge.backends import BackendUnavailable, PromotionRefused
from services.knowledge.domain import (
    AUTO_DRAFTED_PARENT,
    ONBOARDING_PARENT,
    Access,
    KnowledgeHit,
    Page,
    PageListing,
    PageQuery,
    PromotionDraft,
    PromotionResult,
    SearchOutcome,
    ServedMode,
    UnsearchedReason,
    is_auto_draft,
)
from services.knowledge.scope import credential_of

__all__ = [
    "ConfluenceBackend",
    "ConfluenceClient",
    "cql_string",
    "render_storage",
    "search_terms",
    "storage_to_text",
]

_log = logging.getLogger(__name__)

_LUCENE = re.compile(r'[+\-&|!(){}\[\]^"~*?:\\/]')
_WS = re.compile(r"\s+")
_HL = re.compile(r"@@@(?:end)?hl@@@")
_TAG = re.compile(r"<[^>]+>")
_PAGE_EXPAND = "ancestors,space,version"


def cql_string(value: str) -> str:
    """``value`` as a CQL string literal: backslashes and double quotes escaped."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def search_terms(query: str) -> str:
    """The words of a query for ``text ~``: Lucene's operators and quotes removed (a stray quote or
    bracket would make CQL refuse the search, and ``*`` or ``~`` would change what it means)."""
    return _WS.sub(" ", _LUCENE.sub(" ", query)).strip()


def _cql_list(values: Sequence[str]) -> str:
    return "(" + ", ".join(cql_string(v) for v in values) + ")"


def _id_list(ids: Sequence[str]) -> str:
    return "(" + ", ".join(str(int(i)) for i in ids) + ")"


def _one_line(text: str, limit: int = 400) -> str:
    flat = _WS.sub(" ", text).strip()
    if len(flat) <= limit:
        return flat
    return flat[:limit].rsplit(" ", 1)[0] + " …"


# ---------------------------------------------------------------------------- storage format


class _Text(HTMLParser):
    """Storage-format XHTML as text: blocks on their own lines, list items as bullets."""

    _BLOCKS = frozenset({"p", "div", "br", "h1", "h2", "h3", "h4", "h5", "h6", "tr", "pre", "table", "ul", "ol"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self._BLOCKS:
            self.parts.append("\n")
        elif tag == "li":
            self.parts.append("\n- ")
        if tag in ("h1", "h2", "h3", "h4", "h5", "h6"):
            self.parts.append("#" * int(tag[1]) + " ")

    def handle_endtag(self, tag: str) -> None:
        if tag in self._BLOCKS:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        self.parts.append(data)


def storage_to_text(xhtml: str) -> str:
    """The page body a reader is shown: the storage format's text, one block per line."""
    parser = _Text()
    parser.feed(xhtml or "")
    parser.close()
    lines = [ln.rstrip() for ln in "".join(parser.parts).splitlines()]
    out: list[str] = []
    for line in lines:
        if line.strip() or (out and out[-1].strip()):
            out.append(line)
    return "\n".join(out).strip()


_INLINE = [
    (re.compile(r"`([^`]+)`"), r"<code>\1</code>"),
    (re.compile(r"\*\*([^*]+)\*\*"), r"<strong>\1</strong>"),
]


def _inline(text: str) -> str:
    out = html.escape(text, quote=False)
    for pattern, repl in _INLINE:
        out = pattern.sub(repl, out)
    return out


def render_storage(markdown: str) -> str:
    """A draft's Markdown as Confluence storage-format XHTML: headings, bullet and numbered lists,
    paragraphs, inline code and bold; everything else is escaped text."""
    out: list[str] = []
    para: list[str] = []
    lst: str | None = None

    def flush() -> None:
        nonlocal lst
        if para:
            out.append(f"<p>{_inline(' '.join(para))}</p>")
            para.clear()
        if lst:
            out.append(f"</{lst}>")
            lst = None

    for raw in markdown.splitlines():
        line = raw.strip()
        heading = re.match(r"^(#{1,6})\s+(.*)$", line)
        bullet = re.match(r"^[-*]\s+(.*)$", line)
        numbered = re.match(r"^\d+[.)]\s+(.*)$", line)
        if not line or line == "---":
            flush()
        elif heading:
            flush()
            level = len(heading.group(1))
            out.append(f"<h{level}>{_inline(heading.group(2))}</h{level}>")
        elif (item_match := bullet or numbered) is not None:
            kind = "ul" if bullet else "ol"
            if para:
                out.append(f"<p>{_inline(' '.join(para))}</p>")
                para.clear()
            if lst != kind:
                if lst:
                    out.append(f"</{lst}>")
                out.append(f"<{kind}>")
                lst = kind
            item = item_match.group(1)
            out.append(f"<li>{_inline(item)}</li>")
        else:
            if lst:
                out.append(f"</{lst}>")
                lst = None
            para.append(line)
    flush()
    return "".join(out)


# ---------------------------------------------------------------------------- the HTTP client


def _auth_header(credential: str) -> str:
    """``user:api-token`` is Basic (Cloud); anything else a Bearer personal access token (DC)."""
    if ":" in credential:
        return "Basic " + base64.b64encode(credential.encode()).decode()
    return f"Bearer {credential}"


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, (when - datetime.now(when.tzinfo)).total_seconds())


class ConfluenceClient:
    """REST calls with one credential each, their failures as :class:`BackendUnavailable`."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout_seconds: float = 10.0,
        max_retries: int = 2,
        max_retry_after_seconds: float = 5.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ):
        self.base_url = base_url.rstrip("/")
        self.max_retries = max_retries
        self.max_retry_after_seconds = max_retry_after_seconds
        self._http = httpx.AsyncClient(
            base_url=self.base_url, timeout=timeout_seconds, transport=transport, follow_redirects=False
        )

    async def close(self) -> None:
        await self._http.aclose()

    async def request(
        self,
        method: str,
        path: str,
        credential: str,
        whose: str,
        *,
        params: Mapping[str, Any] | None = None,
        body: Any = None,
        missing_ok: bool = False,
    ) -> dict[str, Any] | None:
        """The JSON answer; None for a 404 when ``missing_ok``. ``whose`` names the credential in
        a refusal ("the seat's own credential", "the org token")."""
        headers = {"Authorization": _auth_header(credential), "Accept": "application/json"}
        attempt = 0
        while True:
            try:
                resp = await self._http.request(method, path, params=params, json=body, headers=headers)
            except httpx.TimeoutException as err:
                raise BackendUnavailable(UnsearchedReason.UNREACHABLE, "Confluence did not answer in time") from err
            except httpx.HTTPError as err:
                raise BackendUnavailable(
                    UnsearchedReason.UNREACHABLE, f"Confluence could not be reached ({type(err).__name__})"
                ) from err
            if resp.status_code == 429:
                wait = _retry_after(resp.headers.get("Retry-After"))
                if attempt < self.max_retries and wait is not None and wait <= self.max_retry_after_seconds:
                    attempt += 1
                    await asyncio.sleep(wait)
                    continue
                after = f"; it asks to retry after {wait:g} s" if wait is not None else ""
                raise BackendUnavailable(
                    UnsearchedReason.RATE_LIMITED, f"Confluence is rate-limiting (HTTP 429){after}", retry_after=wait
                )
            if resp.status_code in (401, 403):
                raise BackendUnavailable(
                    UnsearchedReason.CREDENTIAL_REFUSED,
                    f"Confluence refused {whose} (HTTP {resp.status_code})",
                )
            if resp.status_code == 404 and missing_ok:
                return None
            if resp.status_code >= 400:
                # The status only: Confluence's own message echoes the request (a CQL query written
                # from a person's ask, a page title), and this text is logged where no erasure
                # reaches (docs/operations.md, "Logs").
                raise BackendUnavailable(UnsearchedReason.UNREACHABLE, f"Confluence answered HTTP {resp.status_code}")
            try:
                data = resp.json()
            except ValueError as err:
                raise BackendUnavailable(
                    UnsearchedReason.UNREACHABLE, "Confluence answered something not JSON"
                ) from err
            if not isinstance(data, dict):
                raise BackendUnavailable(UnsearchedReason.UNREACHABLE, "Confluence answered something not an object")
            return data


def _next_start(data: Mapping[str, Any]) -> int | None:
    """Where the next result page starts: ``_links.next``'s ``start`` (or start + size), None at
    the end."""
    nxt = (data.get("_links") or {}).get("next")
    if not nxt:
        return None
    query = parse_qs(urlsplit(str(nxt)).query)
    if "start" in query:
        try:
            return int(query["start"][0])
        except ValueError:
            pass
    return int(data.get("start") or 0) + int(data.get("size") or len(data.get("results") or []))


# ---------------------------------------------------------------------------- the backend


class ConfluenceBackend:
    mode: ServedMode | None = ServedMode.CONFLUENCE

    def __init__(self, client: ConfluenceClient, settings: Settings):
        self.client = client
        self.settings = settings
        cfg = settings.knowledge.confluence
        self.org_token = cfg.token.get_secret_value() if cfg.token is not None else None
        self.page_size = cfg.page_size
        self.max_pages = cfg.max_pages

    # ------------------------------------------------------------------ credentials

    def _credential(self, access: Access) -> tuple[str, str] | None:
        """(credential, whose): the seat's own, else the org token; None when there is neither."""
        own = credential_of(self.settings, access.reader) if access.own_credential else None
        if own is not None:
            return own, f"the credential of seat {access.reader.seat}"
        if self.org_token is not None:
            return self.org_token, "the org token (knowledge.confluence.token)"
        return None

    def _org(self) -> tuple[str, str]:
        if self.org_token is None:
            raise BackendUnavailable(UnsearchedReason.UNCONFIGURED, "knowledge.confluence.token is not set")
        return self.org_token, "the org token (knowledge.confluence.token)"

    def can_search(self, access: Access) -> bool:
        return access.any and self._credential(access) is not None

    @staticmethod
    def _spaces(access: Access) -> list[str] | None:
        """The spaces a read is narrowed to; None: unscoped (the seat's own user, or an operator)."""
        return None if access.unscoped else list(access.containers)

    # ------------------------------------------------------------------ CQL helpers

    async def _content_search(
        self, cql: str, cred: tuple[str, str], *, start: int = 0, limit: int | None = None, expand: str = _PAGE_EXPAND
    ) -> dict[str, Any]:
        params = {"cql": cql, "start": start, "limit": limit or self.page_size, "expand": expand}
        data = await self.client.request("GET", "/rest/api/content/search", cred[0], cred[1], params=params)
        assert data is not None
        return data

    async def _ids_titled(self, title: str, spaces: Sequence[str] | None, cred: tuple[str, str]) -> list[str]:
        """Ids of the pages titled ``title`` in ``spaces`` (None: everywhere the credential reads)."""
        cql = f"type = page AND title = {cql_string(title)}"
        if spaces is not None:
            cql += f" AND space IN {_cql_list(spaces)}"
        ids: list[str] = []
        start: int | None = 0
        for _ in range(self.max_pages):
            data = await self._content_search(cql, cred, start=start or 0, expand="space")
            ids += [str(r["id"]) for r in data.get("results") or [] if str(r.get("id", "")).isdigit()]
            start = _next_start(data)
            if start is None:
                break
        return ids

    def _visible(self, content: Mapping[str, Any], spaces: Sequence[str] | None) -> bool:
        """Fail closed on this side too: a draft, or a page outside the scope, is dropped."""
        title = str(content.get("title") or "")
        ancestors = [str(a.get("title") or "") for a in content.get("ancestors") or []]
        if is_auto_draft(title, ancestors):
            return False
        space = str((content.get("space") or {}).get("key") or "")
        return spaces is None or space in spaces

    def _page(self, access: Access, content: Mapping[str, Any], with_body: bool = True) -> Page:
        version = content.get("version") or {}
        when = None
        if version.get("when"):
            try:
                when = datetime.fromisoformat(str(version["when"]).replace("Z", "+00:00"))
            except ValueError:
                when = None
        storage = ((content.get("body") or {}).get("storage") or {}).get("value") or ""
        return Page(
            id=str(content["id"]),
            company=access.reader.company,
            container=str((content.get("space") or {}).get("key") or ""),
            title=str(content.get("title") or ""),
            body=storage_to_text(storage) if with_body else "",
            parent_titles=tuple(str(a.get("title") or "") for a in content.get("ancestors") or []),
            update_time=when,
            backend=ServedMode.CONFLUENCE,
        )

    # ------------------------------------------------------------------ search

    async def search(self, access: Access, query: str, limit: int, *, vector: Vector | None = None) -> SearchOutcome:
        del vector  # Confluence's CQL search ranks by words only
        cred = self._credential(access)
        if cred is None:
            return SearchOutcome.did_not_run(
                UnsearchedReason.UNCONFIGURED,
                "no Confluence credential: the seat has none of its own and knowledge.confluence.token is not set",
            )
        if not access.any:
            return SearchOutcome.did_not_run(UnsearchedReason.SCOPED_TO_NOTHING)
        terms = search_terms(query)
        if not terms:
            return SearchOutcome(ServedMode.CONFLUENCE)
        spaces = self._spaces(access)
        try:
            drafts = await self._ids_titled(AUTO_DRAFTED_PARENT, spaces, cred)
            hits = await self._search(terms, spaces, drafts, cred, limit)
        except BackendUnavailable as err:
            _log.warning("confluence search for %s did not run: %s", access.reader, err.detail)
            return SearchOutcome.did_not_run(err.reason, err.detail)
        return SearchOutcome(ServedMode.CONFLUENCE, None, hits)

    async def _search(
        self, terms: str, spaces: list[str] | None, drafts: list[str], cred: tuple[str, str], limit: int
    ) -> tuple[KnowledgeHit, ...]:
        cql = f"type = page AND text ~ {cql_string(terms)}"
        if spaces is not None:
            cql += f" AND space IN {_cql_list(spaces)}"
        if drafts:
            cql += f" AND ancestor NOT IN {_id_list(drafts)}"
        hits: list[KnowledgeHit] = []
        seen: set[str] = set()
        start: int | None = 0
        for _ in range(self.max_pages):
            params = {
                "cql": cql,
                "start": start or 0,
                "limit": self.page_size,
                "excerpt": "highlight",
                "expand": "content.ancestors,content.space",
            }
            data = await self.client.request("GET", "/rest/api/search", cred[0], cred[1], params=params)
            assert data is not None
            for result in data.get("results") or []:
                content = result.get("content") or {}
                pid = str(content.get("id") or "")
                if not pid or pid in seen or (content.get("type") not in (None, "page")):
                    continue
                if not self._visible(content, spaces):
                    continue
                seen.add(pid)
                snippet = _one_line(_TAG.sub("", _HL.sub("", html.unescape(str(result.get("excerpt") or "")))))
                hits.append(
                    KnowledgeHit(
                        page_id=pid,
                        title=str(content.get("title") or result.get("title") or ""),
                        container=str((content.get("space") or {}).get("key") or ""),
                        snippet=snippet,
                    )
                )
                if len(hits) >= limit:
                    return tuple(hits)
            start = _next_start(data)
            if start is None:
                break
        return tuple(hits)

    # ------------------------------------------------------------------ reads

    async def get_page(self, access: Access, page_id: str) -> Page | None:
        if not page_id.isdigit():
            return None
        cred = self._credential(access)
        if cred is None:
            raise BackendUnavailable(UnsearchedReason.UNCONFIGURED, "no Confluence credential for this reader")
        data = await self.client.request(
            "GET",
            f"/rest/api/content/{page_id}",
            cred[0],
            cred[1],
            params={"expand": "body.storage,ancestors,space,version"},
            missing_ok=True,
        )
        if data is None or data.get("type", "page") != "page":
            return None
        return self._page(access, data)

    async def list_pages(self, access: Access, query: PageQuery) -> PageListing:
        cred = self._credential(access)
        if cred is None:
            raise BackendUnavailable(UnsearchedReason.UNCONFIGURED, "no Confluence credential for this reader")
        spaces = None if query.containers is None else list(query.containers)
        parent_title, include_drafts, cursor = query.parent_title, query.include_drafts, query.cursor
        cql = "type = page"
        if spaces is not None:
            cql += f" AND space IN {_cql_list(spaces)}"
        if parent_title:
            parents = await self._ids_titled(parent_title, spaces, cred)
            if not parents:
                return PageListing((), None)
            cql += f" AND parent IN {_id_list(parents)}"
        if not include_drafts:
            drafts = await self._ids_titled(AUTO_DRAFTED_PARENT, spaces, cred)
            if drafts:
                cql += f" AND ancestor NOT IN {_id_list(drafts)}"
        cql += " ORDER BY title"
        # The cursor is a decoded page token (JSON) holding the offset this backend wrote.
        start = int(cast("int | str", cursor["start"])) if cursor is not None else 0
        expand = _PAGE_EXPAND + (",body.storage" if query.with_body else "")
        data = await self._content_search(cql, cred, start=start, limit=query.size, expand=expand)
        pages = [
            self._page(access, c, query.with_body)
            for c in data.get("results") or []
            if include_drafts or self._visible(c, spaces)
        ]
        nxt = _next_start(data)
        return PageListing(tuple(pages), None if nxt is None else {"start": nxt})

    async def onboarding(self, access: Access, containers: Sequence[str], limit: int) -> SearchOutcome:
        """The ``Onboarding`` pages of the unit chain's spaces and the pages under them: own unit
        first, then by depth and title (the native backend's order)."""
        cred = self._credential(access)
        if cred is None or not containers:
            return SearchOutcome(ServedMode.CONFLUENCE)
        spaces = list(containers)
        try:
            parents = await self._content_search(
                f"type = page AND title = {cql_string(ONBOARDING_PARENT)} AND space IN {_cql_list(spaces)}",
                cred,
                limit=min(limit, 100),
            )
            roots = [c for c in parents.get("results") or [] if str(c.get("id", "")).isdigit()]
            children: list[dict[str, Any]] = []
            if roots:
                ids = _id_list([str(c["id"]) for c in roots])
                data = await self._content_search(
                    f"type = page AND space IN {_cql_list(spaces)} AND ancestor IN {ids}",
                    cred,
                    limit=min(limit * 2, 100),
                )
                children = list(data.get("results") or [])
        except BackendUnavailable as err:
            _log.warning("onboarding pages of %s unreadable: %s", access.reader, err.detail)
            return SearchOutcome.did_not_run(err.reason, err.detail)
        found = [c for c in [*roots, *children] if self._visible(c, spaces)]
        order = {s: i for i, s in enumerate(spaces)}
        found.sort(
            key=lambda c: (
                order.get(str((c.get("space") or {}).get("key")), len(order)),
                len(c.get("ancestors") or []),
                str(c.get("title") or ""),
            )
        )
        return SearchOutcome(
            ServedMode.CONFLUENCE,
            None,
            tuple(
                KnowledgeHit(
                    page_id=str(c["id"]),
                    title=str(c.get("title") or ""),
                    container=str((c.get("space") or {}).get("key") or ""),
                    snippet="",
                )
                for c in found[:limit]
            ),
        )

    # ------------------------------------------------------------------ PromotionWriter

    async def _by_title(self, space: str, title: str, cred: tuple[str, str]) -> dict[str, Any] | None:
        data = await self.client.request(
            "GET",
            "/rest/api/content",
            cred[0],
            cred[1],
            params={"spaceKey": space, "title": title, "type": "page", "expand": "ancestors,space"},
        )
        results = (data or {}).get("results") or []
        return results[0] if results else None

    async def existing_draft(self, company: str, container: str, title: str) -> PromotionResult | None:
        found = await self._by_title(container, title, self._org())
        if found is None:
            return None
        return PromotionResult(str(found["id"]), str(found.get("title") or title), False, ServedMode.CONFLUENCE)

    async def _create(
        self, space: str, title: str, xhtml: str, parent: str | None, cred: tuple[str, str]
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "type": "page",
            "title": title,
            "space": {"key": space},
            "body": {"storage": {"value": xhtml, "representation": "storage"}},
        }
        if parent is not None:
            body["ancestors"] = [{"id": parent}]
        data = await self.client.request("POST", "/rest/api/content", cred[0], cred[1], body=body)
        assert data is not None
        return data

    async def write_draft(self, draft: PromotionDraft) -> PromotionResult:
        cred = self._org()
        space = draft.container_key
        existing = await self.existing_draft(draft.company, space, draft.title)
        if existing is not None:
            return existing
        parent = await self._by_title(space, AUTO_DRAFTED_PARENT, cred)
        if parent is None:
            try:
                parent = await self._create(
                    space,
                    AUTO_DRAFTED_PARENT,
                    "<p>Drafts distilled from procedures several agents of this unit converged on. They are "
                    "hidden from every agent's knowledge search until a lead reviews one and moves it out of "
                    "this page; delete a draft to reject it.</p>",
                    None,
                    cred,
                )
            except BackendUnavailable as err:
                # A draft at the space root would be read by every agent: refuse it instead.
                raise PromotionRefused(
                    f"the {AUTO_DRAFTED_PARENT} page of space {space} could not be created ({err.detail}); "
                    "the draft is not filed at the space root"
                ) from err
        try:
            page = await self._create(space, draft.title, render_storage(draft.body), str(parent["id"]), cred)
        except BackendUnavailable:
            # A page of that title arrived meanwhile (Confluence refuses a duplicate title): quiet.
            again = await self.existing_draft(draft.company, space, draft.title)
            if again is not None:
                return again
            raise
        return PromotionResult(str(page["id"]), str(page.get("title") or draft.title), True, ServedMode.CONFLUENCE)
