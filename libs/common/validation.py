"""Request checks shared by every servicer: identities, ids, limits, page tokens.

Each check raises :class:`~libs.common.errors.InvalidArgument` naming the field, so a caller's
mistake is always INVALID_ARGUMENT with a reason a program can branch on.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

from libs.common.errors import InvalidArgument

__all__ = [
    "decode_cursor",
    "decode_page_token",
    "decode_time_cursor",
    "encode_page_token",
    "encode_time_cursor",
    "optional_limit",
    "page_size",
    "require_id",
    "require_text",
    "seat_ref",
]

_IDENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@/-]{0,199}$")


def require_text(value: str, field: str, *, domain: str, max_chars: int | None = None) -> str:
    if not value or not value.strip():
        raise InvalidArgument(f"{field} is required", reason="FIELD_REQUIRED", domain=domain, field=field)
    if max_chars is not None and len(value) > max_chars:
        raise InvalidArgument(
            f"{field} is {len(value)} characters; the limit is {max_chars}",
            reason="FIELD_TOO_LONG",
            domain=domain,
            field=field,
            metadata={"limit": max_chars, "length": len(value)},
        )
    return value


def require_ident(value: str, field: str, *, domain: str) -> str:
    """A company or seat handle: 1..200 characters of letters, digits and ``._:@/-``."""
    require_text(value, field, domain=domain)
    if not _IDENT.match(value):
        raise InvalidArgument(
            f"{field} {value!r} is not a valid handle (letters, digits, . _ : @ / -, at most 200)",
            reason="FIELD_INVALID",
            domain=domain,
            field=field,
            metadata={"value": value[:200]},
        )
    return value


def seat_ref(company: str, seat: str, *, domain: str) -> tuple[str, str]:
    return require_ident(company, "company", domain=domain), require_ident(seat, "seat", domain=domain)


def require_id(value: str, field: str, *, domain: str) -> uuid.UUID:
    require_text(value, field, domain=domain)
    try:
        return uuid.UUID(value)
    except ValueError:
        raise InvalidArgument(
            f"{field} {value!r} is not a valid id",
            reason="FIELD_INVALID",
            domain=domain,
            field=field,
            metadata={"value": value[:100]},
        ) from None


def optional_limit(value: int | None, field: str, *, default: int, maximum: int, domain: str) -> int:
    """A top-K knob: unset means ``default``, 0 switches its half off, negative is refused."""
    if value is None:
        return default
    if value < 0 or value > maximum:
        raise InvalidArgument(
            f"{field} must be between 0 and {maximum}, got {value}",
            reason="LIMIT_OUT_OF_RANGE",
            domain=domain,
            field=field,
            metadata={"value": value, "maximum": maximum},
        )
    return value


def page_size(value: int, *, default: int = 50, maximum: int = 500, domain: str) -> int:
    """AIP-158: 0 means the default, past the maximum is clamped, negative is refused."""
    if value < 0:
        raise InvalidArgument(
            f"page_size must not be negative, got {value}",
            reason="PAGE_SIZE_INVALID",
            domain=domain,
            field="page_size",
            metadata={"value": value},
        )
    return default if value == 0 else min(value, maximum)


def _fingerprint(scope: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(scope, sort_keys=True, default=str).encode()).hexdigest()[:12]


def encode_page_token(cursor: dict[str, Any], scope: dict[str, Any]) -> str:
    """An opaque token: the cursor plus a fingerprint of the request's filters."""
    raw = json.dumps({"c": cursor, "f": _fingerprint(scope)}, default=str).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_page_token(token: str, scope: dict[str, Any], *, domain: str) -> dict[str, Any] | None:
    """The cursor of ``token``; refused when malformed or minted for other filters."""
    if not token:
        return None
    try:
        padded = token + "=" * (-len(token) % 4)
        body = json.loads(base64.urlsafe_b64decode(padded.encode()))
        cursor, fingerprint = body["c"], body["f"]
    except (ValueError, KeyError, TypeError, binascii.Error):
        raise InvalidArgument(
            "page_token is not a token this service issued",
            reason="PAGE_TOKEN_INVALID",
            domain=domain,
            field="page_token",
        ) from None
    if fingerprint != _fingerprint(scope):
        raise InvalidArgument(
            "page_token was issued for a request with other filters",
            reason="PAGE_TOKEN_INVALID",
            domain=domain,
            field="page_token",
        )
    return cursor


def decode_cursor(token: str, scope: dict[str, Any], read: Callable[[dict[str, Any]], Any], *, domain: str) -> Any:
    """A listing's position from its page token, as ``read`` takes it out of the cursor (None: the
    first page); a cursor ``read`` cannot take apart is a token this service did not issue."""
    cursor = decode_page_token(token, scope, domain=domain)
    if cursor is None:
        return None
    try:
        return read(cursor)
    except (KeyError, ValueError, TypeError):
        raise InvalidArgument(
            "page_token is not a token this service issued",
            reason="PAGE_TOKEN_INVALID",
            domain=domain,
            field="page_token",
        ) from None


def decode_time_cursor(
    token: str, scope: dict[str, Any], *, domain: str, id_type: Callable[[str], Any] = str
) -> tuple[datetime, Any] | None:
    """The (time, id) position of a newest-first listing, from its page token (None: first page)."""
    return decode_cursor(token, scope, lambda c: (datetime.fromisoformat(c["t"]), id_type(c["id"])), domain=domain)


def encode_time_cursor(time: datetime, ident: object, scope: dict[str, Any]) -> str:
    """The page token that resumes a newest-first listing after (time, id)."""
    return encode_page_token({"t": time.isoformat(), "id": str(ident)}, scope)
