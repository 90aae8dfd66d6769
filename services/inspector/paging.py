"""Paging every list the same way, whatever its source.

A list the owning service pages and searches itself passes its own page tokens through. A search
the service cannot run (skills, profiles, reflections and proposals by text) walks the service's
pages and keeps what matches, at most ``max_pages`` service pages per request; its token is the
service's token of the page it stopped in plus the position inside it, so the next request resumes
exactly there. A list the inspector holds whole (a merged seat list, a search's ranked pool) is
paged by offset. The inspector's tokens are plain (base64 JSON): they carry the services' signed
tokens, and a tampered one is refused by the service it reaches or reads as the first page."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

__all__ = ["Page", "decode", "encode", "offset_page", "scan"]

T = TypeVar("T")


@dataclass
class Page(Generic[T]):
    items: list[T]
    next_token: str = ""
    scanned_out: bool = False
    """The search read its ``max_pages`` without filling the page: ``next_token`` searches on."""
    total: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def encode(state: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(state, separators=(",", ":")).encode()).decode().rstrip("=")


def decode(token: str) -> dict[str, Any] | None:
    """The state of an inspector token; None for none and for one that is not ours (first page)."""
    if not token:
        return None
    try:
        state = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    except (ValueError, binascii.Error, UnicodeError):
        return None
    return state if isinstance(state, dict) else None


async def scan(
    fetch: Callable[[str], Awaitable[tuple[Sequence[T], str]]],
    match: Callable[[T], bool] | None,
    token: str,
    size: int,
    max_pages: int,
) -> Page[T]:
    """Up to ``size`` items that ``match`` from the service pages ``fetch(service_token)`` returns
    (``match`` None keeps every item), starting where ``token`` stopped."""
    state = decode(token) or {}
    t, o = state.get("t"), state.get("o")
    service_token = t if isinstance(t, str) else ""
    skip = o if isinstance(o, int) and o >= 0 else 0
    out: list[T] = []
    for _ in range(max_pages):
        items, following = await fetch(service_token)
        for index in range(skip, len(items)):
            item = items[index]
            if match is None or match(item):
                out.append(item)
                if len(out) == size:
                    if index + 1 < len(items):
                        return Page(out, encode({"t": service_token, "o": index + 1}))
                    return Page(out, encode({"t": following, "o": 0}) if following else "")
        skip = 0
        if not following:
            return Page(out)
        service_token = following
    return Page(out, encode({"t": service_token, "o": 0}), scanned_out=True)


def offset_page(items: Sequence[T], token: str, size: int) -> Page[T]:
    """One page of a list held whole."""
    state = decode(token) or {}
    o = state.get("o")
    start = o if isinstance(o, int) and o >= 0 else 0
    chunk = list(items[start : start + size])
    following = encode({"o": start + size}) if start + size < len(items) else ""
    return Page(chunk, following, total=len(items))
