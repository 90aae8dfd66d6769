"""A scripted Confluence for tests: the REST API (v1) over real HTTP on a loopback port.

It stands in for a Confluence site the way ``scripted_openai.py`` stands in for a model: the one
thing outside our control. It keeps spaces and pages in memory, parses the CQL it is sent (a real
parser of the subset our backend writes: ``AND``-joined clauses, quoted strings with ``\\"`` and
``\\\\`` escapes, ``=``, ``!=``, ``~``, ``IN``, ``NOT IN``, ``ORDER BY``) and answers it — a query it
cannot parse is a 400, as Confluence answers — enforces each user's page permissions (a space a
user may not read never appears, and its pages are 404), pages results by ``start`` + ``limit``
with ``_links.next`` (``limit`` capped at ``max_limit``), and records every request with its
parsed CQL. Tests push scripted replies (401, 403, 429 with ``Retry-After``, 500) that are served,
in order, before the site's own answer.

Endpoints: ``GET /rest/api/search``, ``GET /rest/api/content/search``, ``GET /rest/api/content``
(``spaceKey`` + ``title``), ``GET /rest/api/content/{id}``, ``POST /rest/api/content``.
"""

from __future__ import annotations

import base64
import json
import re
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from html.parser import HTMLParser
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

from tests.support.loopback_http import LoopbackHTTP, send_json

__all__ = ["CqlError", "Reply", "ScriptedConfluence", "parse_cql"]


# ------------------------------------------------------------------------------------------- CQL


class CqlError(ValueError):
    pass


_TOKEN = re.compile(
    r'\s*(?:(?P<str>"(?:[^"\\]|\\.)*")|(?P<num>\d+)|(?P<op>!=|=|~|\(|\)|,)|(?P<word>[A-Za-z_][A-Za-z0-9_.]*))'
)


def _tokens(cql: str) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    pos = 0
    while pos < len(cql):
        if cql[pos:].strip() == "":
            break
        m = _TOKEN.match(cql, pos)
        if m is None or m.end() == pos:
            raise CqlError(f"Could not parse cql : {cql!r} at {pos}")
        pos = m.end()
        if m.group("str") is not None:
            raw = m.group("str")[1:-1]
            out.append(("str", re.sub(r"\\(.)", r"\1", raw)))
        elif m.group("num") is not None:
            out.append(("num", m.group("num")))
        elif m.group("op") is not None:
            out.append(("op", m.group("op")))
        else:
            out.append(("word", m.group("word")))
    return out


@dataclass(frozen=True)
class Clause:
    field: str
    op: str
    """``=``, ``!=``, ``~``, ``in``, ``not in``."""
    value: Any
    """A string, or a tuple of strings for ``in`` / ``not in``."""


@dataclass(frozen=True)
class Cql:
    clauses: tuple[Clause, ...]
    order_by: str | None = None


def parse_cql(cql: str) -> Cql:
    toks = _tokens(cql)
    i = 0
    clauses: list[Clause] = []
    order_by = None

    def take() -> tuple[str, Any]:
        nonlocal i
        if i >= len(toks):
            raise CqlError(f"Could not parse cql : {cql!r} (unexpected end)")
        i += 1
        return toks[i - 1]

    def value() -> str:
        kind, v = take()
        if kind not in ("str", "num", "word"):
            raise CqlError(f"Could not parse cql : {cql!r} (expected a value, got {v!r})")
        return str(v)

    while i < len(toks):
        kind, word = take()
        if kind != "word":
            raise CqlError(f"Could not parse cql : {cql!r} (expected a field, got {word!r})")
        if word.upper() == "ORDER":
            k, by = take()
            if (k, str(by).upper()) != ("word", "BY"):
                raise CqlError(f"Could not parse cql : {cql!r} (ORDER without BY)")
            order_by = value()
            if i != len(toks):
                raise CqlError(f"Could not parse cql : {cql!r} (text after ORDER BY)")
            break
        k, op = take()
        negate = False
        if k == "word" and str(op).upper() == "NOT":
            negate = True
            k, op = take()
        if k == "word" and str(op).upper() == "IN":
            k, paren = take()
            if paren != "(":
                raise CqlError(f"Could not parse cql : {cql!r} (IN without a list)")
            values = [value()]
            while True:
                k, sep = take()
                if sep == ")":
                    break
                if sep != ",":
                    raise CqlError(f"Could not parse cql : {cql!r} (bad list)")
                values.append(value())
            clauses.append(Clause(word, "not in" if negate else "in", tuple(values)))
        elif k == "op" and op in ("=", "!=", "~") and not negate:
            clauses.append(Clause(word, op, value()))
        else:
            raise CqlError(f"Could not parse cql : {cql!r} (unknown operator {op!r})")
        if i < len(toks):
            k, conj = toks[i]
            if k == "word" and str(conj).upper() == "AND":
                i += 1
            elif not (k == "word" and str(conj).upper() == "ORDER"):
                raise CqlError(f"Could not parse cql : {cql!r} (expected AND, got {conj!r})")
    return Cql(tuple(clauses), order_by)


# ------------------------------------------------------------------------------------ the site


class _Text(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []

    def handle_data(self, data: str) -> None:
        self.parts.append(data)


def _text(xhtml: str) -> str:
    p = _Text()
    p.feed(xhtml)
    return " ".join(" ".join(p.parts).split())


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


@dataclass
class CPage:
    id: str
    space: str
    title: str
    body: str
    """Storage-format XHTML."""
    parent: str | None = None
    when: str = "2026-01-01T00:00:00.000Z"


@dataclass
class User:
    name: str
    spaces: frozenset[str] | None = None
    """Spaces the user may read (None: all)."""
    writes: bool = True


@dataclass
class Reply:
    """One scripted answer, served before the site's own."""

    status: int
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Recorded:
    method: str
    path: str
    params: dict[str, str]
    authorization: str
    body: Any
    cql: Cql | None
    status: int = 0


class ScriptedConfluence(LoopbackHTTP):
    def __init__(self, *, max_limit: int = 25, context: str = "/wiki"):
        self.max_limit = max_limit
        self.context = context
        self.pages: dict[str, CPage] = {}
        self.users: dict[str, User] = {}
        self.requests: list[Recorded] = []
        self._queue: deque[Reply] = deque()
        self.rule: Callable[[Recorded], Reply | None] | None = None
        self._lock = threading.Lock()
        self._next_id = 1000
        self._server: ThreadingHTTPServer | None = None

    # -------------------------------------------------------------- the site's contents

    def add_user(self, credential: str, name: str, spaces: set[str] | None = None, *, writes: bool = True) -> None:
        """A user reached with ``credential`` as the backend sends it (``user:token`` as Basic,
        anything else as Bearer)."""
        header = (
            "Basic " + base64.b64encode(credential.encode()).decode() if ":" in credential else f"Bearer {credential}"
        )
        self.users[header] = User(name, frozenset(spaces) if spaces is not None else None, writes)

    def page(self, space: str, title: str, body: str = "", parent: str | None = None) -> str:
        """A page (``body`` as plain text is wrapped in a paragraph); returns its id."""
        with self._lock:
            self._next_id += 1
            pid = str(self._next_id)
            xhtml = body if body.startswith("<") else f"<p>{body}</p>"
            self.pages[pid] = CPage(pid, space, title, xhtml, parent)
        return pid

    def titled(self, space: str, title: str) -> CPage | None:
        return next((p for p in self.pages.values() if p.space == space and p.title == title), None)

    def push(self, *replies: Reply) -> None:
        with self._lock:
            self._queue.extend(replies)

    def received(self, path: str | None = None) -> list[Recorded]:
        with self._lock:
            return [r for r in self.requests if path is None or r.path == path]

    # -------------------------------------------------------------- serving

    @property
    def base_url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}{self.context}"

    def start(self) -> ScriptedConfluence:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _serve(self, method: str) -> None:
                url = urlsplit(self.path)
                params = {k: v[0] for k, v in parse_qs(url.query).items()}
                body = None
                if method == "POST":
                    length = int(self.headers.get("content-length", 0))
                    body = json.loads(self.rfile.read(length) or b"{}")
                path = url.path
                if path.startswith(owner.context):
                    path = path[len(owner.context) :]
                cql = None
                if "cql" in params:
                    try:
                        cql = parse_cql(params["cql"])
                    except CqlError:
                        cql = None
                rec = Recorded(method, path, params, self.headers.get("Authorization", ""), body, cql)
                with owner._lock:
                    owner.requests.append(rec)
                    reply = owner._queue.popleft() if owner._queue else None
                if reply is None and owner.rule is not None:
                    reply = owner.rule(rec)
                if reply is None:
                    reply = owner._answer(method, path, params, body, rec)
                rec.status = reply.status
                payload = json.dumps(reply.body if reply.body is not None else {"statusCode": reply.status}).encode()
                send_json(self, reply.status, payload, reply.headers)

            def do_GET(self) -> None:
                self._serve("GET")

            def do_POST(self) -> None:
                self._serve("POST")

        self.serve_in_background(Handler)
        return self

    # -------------------------------------------------------------- the REST API

    def _error(self, status: int, message: str) -> Reply:
        return Reply(status, {"statusCode": status, "message": message})

    def _answer(self, method: str, path: str, params: dict[str, str], body: Any, rec: Recorded) -> Reply:
        user = self.users.get(rec.authorization)
        if user is None:
            return self._error(401, "Unauthorized")
        with self._lock:
            if method == "GET" and path in ("/rest/api/search", "/rest/api/content/search"):
                if rec.cql is None:
                    return self._error(400, f"Could not parse cql : {params.get('cql', '')}")
                return self._search(path, params, rec.cql, user)
            if method == "GET" and path == "/rest/api/content":
                found = [
                    p
                    for p in self.pages.values()
                    if p.space == params.get("spaceKey") and p.title == params.get("title") and self._reads(user, p)
                ]
                return Reply(
                    200, {"results": [self._content(p, params.get("expand", "")) for p in found], "size": len(found)}
                )
            m = re.fullmatch(r"/rest/api/content/(\d+)", path)
            if method == "GET" and m:
                page = self.pages.get(m.group(1))
                if page is None or not self._reads(user, page):
                    return self._error(404, "No content found with id")
                return Reply(200, self._content(page, params.get("expand", "")))
            if method == "POST" and path == "/rest/api/content":
                return self._create(body, user)
        return self._error(404, "null for uri")

    def _reads(self, user: User, page: CPage) -> bool:
        return user.spaces is None or page.space in user.spaces

    def _ancestors(self, page: CPage) -> list[CPage]:
        chain: list[CPage] = []
        parent = page.parent
        while parent is not None and parent in self.pages:
            chain.insert(0, self.pages[parent])
            parent = self.pages[parent].parent
        return chain

    def _content(self, page: CPage, expand: str) -> dict[str, Any]:
        out: dict[str, Any] = {"id": page.id, "type": "page", "status": "current", "title": page.title}
        wants = set(expand.split(","))
        if "space" in wants or "content.space" in wants:
            out["space"] = {"key": page.space}
        if "ancestors" in wants or "content.ancestors" in wants:
            out["ancestors"] = [{"id": a.id, "type": "page", "title": a.title} for a in self._ancestors(page)]
        if "body.storage" in wants:
            out["body"] = {"storage": {"value": page.body, "representation": "storage"}}
        if "version" in wants:
            out["version"] = {"number": 1, "when": page.when}
        out["_links"] = {"webui": f"/spaces/{page.space}/pages/{page.id}"}
        return out

    def _matches(self, page: CPage, clause: Clause) -> bool:
        f, op, v = clause.field.lower(), clause.op, clause.value
        if f == "type":
            ok = op in ("=", "in") and ("page" == v or (isinstance(v, tuple) and "page" in v))
            return ok
        if f == "text" and op == "~":
            terms = set(_words(str(v)))
            return bool(terms & set(_words(page.title + " " + _text(page.body))))
        if f == "title":
            if op == "=":
                return page.title == v
            if op == "~":
                return bool(set(_words(str(v))) & set(_words(page.title)))
        if f == "space":
            keys = v if isinstance(v, tuple) else (v,)
            inside = page.space in keys
            return inside if op in ("=", "in") else not inside
        if f in ("ancestor", "parent"):
            ids = v if isinstance(v, tuple) else (v,)
            related = {a.id for a in self._ancestors(page)} if f == "ancestor" else {page.parent}
            hit = bool(related & set(ids))
            return hit if op in ("=", "in") else not hit
        raise CqlError(f"unsupported field {clause.field}")

    def _search(self, path: str, params: dict[str, str], cql: Cql, user: User) -> Reply:
        try:
            found = [
                p for p in self.pages.values() if self._reads(user, p) and all(self._matches(p, c) for c in cql.clauses)
            ]
        except CqlError as err:
            return self._error(400, str(err))
        text = next((c for c in cql.clauses if c.field == "text"), None)
        terms = set(_words(str(text.value))) if text is not None else set()
        if terms:
            found.sort(key=lambda p: (-len(terms & set(_words(p.title + " " + _text(p.body)))), int(p.id)))
        elif cql.order_by == "title":
            found.sort(key=lambda p: (p.title, int(p.id)))
        else:
            found.sort(key=lambda p: int(p.id))
        start = int(params.get("start", 0))
        limit = min(int(params.get("limit", 25)), self.max_limit)
        window = found[start : start + limit]
        expand = params.get("expand", "")
        if path == "/rest/api/search":
            results = []
            for p in window:
                words = _text(p.body)
                hit = next((w for w in words.split() if w.lower().strip(".,") in terms), None)
                excerpt = words[:120]
                if hit:
                    excerpt = excerpt.replace(hit, f"@@@hl@@@{hit}@@@endhl@@@", 1)
                results.append(
                    {
                        "content": self._content(p, expand),
                        "title": p.title,
                        "excerpt": excerpt,
                        "url": f"/spaces/{p.space}/pages/{p.id}",
                        "entityType": "content",
                    }
                )
        else:
            results = [self._content(p, expand) for p in window]
        links: dict[str, str] = {"base": self.context, "context": self.context}
        if start + limit < len(found):
            query = "&".join(f"{k}={quote(str(v))}" for k, v in {**params, "start": start + limit}.items())
            links["next"] = f"{path}?{query}"
        return Reply(
            200,
            {
                "results": results,
                "start": start,
                "limit": limit,
                "size": len(results),
                "totalSize": len(found),
                "_links": links,
            },
        )

    def _create(self, body: Any, user: User) -> Reply:
        if not isinstance(body, dict) or body.get("type") != "page":
            return self._error(400, "bad content")
        space = (body.get("space") or {}).get("key")
        title = body.get("title")
        if not user.writes or (user.spaces is not None and space not in user.spaces):
            return self._error(403, "Not permitted to create content in this space")
        if any(p.space == space and p.title == title for p in self.pages.values()):
            return self._error(400, "A page with this title already exists")
        ancestors = body.get("ancestors") or []
        parent = str(ancestors[-1]["id"]) if ancestors else None
        if parent is not None and parent not in self.pages:
            return self._error(400, "parent not found")
        storage = ((body.get("body") or {}).get("storage") or {}).get("value", "")
        self._next_id += 1
        pid = str(self._next_id)
        self.pages[pid] = CPage(pid, space, title, storage, parent)
        return Reply(200, self._content(self.pages[pid], "space,ancestors,version"))
