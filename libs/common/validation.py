"""Request checks shared by every servicer: identities, ids, limits, page tokens.

Each check raises :class:`~libs.common.errors.InvalidArgument` naming the field, so a caller's
mistake is always INVALID_ARGUMENT with a reason a program can branch on. Most field limits now
live in the protos and are checked at the edge (``libs.common.contract``); these remain for the
rules a use case applies after normalising (stripping, lower-casing) and for direct callers.

Page tokens are signed (HMAC-SHA256 with the deployment's page-token key, see
:func:`load_page_token_key`), so a caller can neither forge a cursor nor edit one it was given; a
token that does not verify, or whose cursor cannot be taken apart, is PAGE_TOKEN_INVALID.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
import secrets
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

import asyncpg

from libs.common.bounds import at_most_chars
from libs.common.contract import echo
from libs.common.errors import InvalidArgument, field_error

__all__ = [
    "decode_cursor",
    "decode_page_token",
    "decode_time_cursor",
    "encode_page_token",
    "encode_time_cursor",
    "field_error",
    "load_page_token_key",
    "optional_limit",
    "page_size",
    "require_id",
    "require_page_id",
    "require_text",
    "seat_ref",
    "use_page_token_key",
]

T = TypeVar("T")

_IDENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@/-]{0,199}$")


def require_text(value: str, field: str, *, domain: str, max_chars: int | None = None) -> str:
    if not value or not value.strip():
        raise field_error(field, "FIELD_REQUIRED", f"{field} is required", domain=domain)
    if max_chars is not None:
        at_most_chars(value, field, max_chars, domain=domain)
    return value


def require_ident(value: str, field: str, *, domain: str) -> str:
    """A company or seat handle: 1..200 characters of letters, digits and ``._:@/-``."""
    require_text(value, field, domain=domain)
    if not _IDENT.match(value):
        raise field_error(
            field,
            "FIELD_INVALID",
            f"{field} {echo(value)} is not a valid handle (letters, digits, . _ : @ / -, at most 200)",
            domain=domain,
            value=value[:200],
        )
    return value


def require_page_id(value: str, *, domain: str) -> str:
    """A knowledge page id a provenance read names (a native page's or a Confluence one's): at most
    200 characters, stripped, with no white space or control character left inside."""
    page_id = require_text(value, "page_id", domain=domain, max_chars=200).strip()
    if any(ch.isspace() or not ch.isprintable() for ch in page_id):
        raise field_error("page_id", "FIELD_INVALID", f"page_id {page_id!r} is not a page id", domain=domain)
    return page_id


def seat_ref(company: str, seat: str, *, domain: str) -> tuple[str, str]:
    return require_ident(company, "company", domain=domain), require_ident(seat, "seat", domain=domain)


def require_id(value: str, field: str, *, domain: str) -> uuid.UUID:
    require_text(value, field, domain=domain)
    try:
        return uuid.UUID(value)
    except ValueError:
        raise field_error(
            field,
            "FIELD_INVALID",
            f"{field} {echo(value)} is not a valid id",
            domain=domain,
            value=value[:100],
        ) from None


def optional_limit(value: int | None, field: str, *, default: int, maximum: int, domain: str) -> int:
    """A top-K knob: unset means ``default``, 0 switches its half off, negative is refused."""
    if value is None:
        return default
    if value < 0 or value > maximum:
        raise field_error(
            field,
            "LIMIT_OUT_OF_RANGE",
            f"{field} must be between 0 and {maximum}, got {value}",
            domain=domain,
            value=value,
            maximum=maximum,
        )
    return value


def page_size(value: int, *, default: int = 50, maximum: int = 500, domain: str) -> int:
    """AIP-158: 0 means the default, past the maximum is clamped, negative is refused."""
    if value < 0:
        raise field_error(
            "page_size",
            "PAGE_SIZE_INVALID",
            f"page_size must not be negative, got {value}",
            domain=domain,
            value=value,
        )
    return default if value == 0 else min(value, maximum)


# ------------------------------------------------------------------------------ page tokens

_KEY_NAME = "page_token"
_MAC_BYTES = 16
_INT64 = 2**63

# Named queries of the deployment-keys table (libs/common/migrations/0003_deployment_keys.sql).
SQL_INSERT_KEY = """
INSERT INTO deployment_keys (name, key, create_time) VALUES ($1, $2, $3)
ON CONFLICT (name) DO NOTHING
"""
SQL_SELECT_KEY = "SELECT key FROM deployment_keys WHERE name = $1"

# The key every token of this process is signed with. One per deployment, set once when the
# process opens its infrastructure (``open_infra``); a process that never does (a unit test, a
# one-off script) signs with a random key of its own, so its tokens verify only in itself. A
# module-level key rather than an argument: every listing of every service mints and reads tokens,
# and the key is as process-wide as the logging configuration.
_key: bytes = secrets.token_bytes(32)


def use_page_token_key(key: bytes) -> None:
    """Sign and verify every page token of this process with ``key`` from now on."""
    global _key
    if len(key) < 16:
        raise ValueError("a page-token key needs at least 16 bytes")
    _key = key


async def load_page_token_key(pool: asyncpg.Pool, secret: str | None, now: datetime) -> bytes:
    """The deployment's page-token key: ``auth.page_token_secret`` when configured, else a random
    key created by the first process to ask and kept in Postgres, so every replica and every
    restart verifies the tokens the others minted."""
    if secret:
        return hashlib.sha256(secret.encode()).digest()
    async with pool.acquire() as conn:
        await conn.execute(SQL_INSERT_KEY, _KEY_NAME, secrets.token_bytes(32), now)
        key = await conn.fetchval(SQL_SELECT_KEY, _KEY_NAME)
    return bytes(key)


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode((text + "=" * (-len(text) % 4)).encode())


def _mac(payload: bytes) -> bytes:
    return hmac.new(_key, payload, hashlib.sha256).digest()[:_MAC_BYTES]


def _fingerprint(scope: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(scope, sort_keys=True, default=str).encode()).hexdigest()[:12]


def encode_page_token(cursor: dict[str, Any], scope: dict[str, Any]) -> str:
    """An opaque, signed token: the cursor plus a fingerprint of the request's filters."""
    payload = json.dumps(
        {"c": cursor, "f": _fingerprint(scope)}, default=str, separators=(",", ":"), ensure_ascii=False
    ).encode()
    return f"{_b64(payload)}.{_b64(_mac(payload))}"


def _invalid_token(message: str, domain: str) -> InvalidArgument:
    return field_error("page_token", "PAGE_TOKEN_INVALID", message, domain=domain)


def _plain(value: Any) -> bool:
    """A cursor holds only what this service put in it: strings without NUL, 64-bit integers."""
    if isinstance(value, str):
        return "\x00" not in value
    if isinstance(value, bool) or value is None:
        return True
    if isinstance(value, int):
        return -_INT64 <= value < _INT64
    if isinstance(value, float):
        return value == value and abs(value) != float("inf")
    if isinstance(value, list):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return False


def decode_page_token(token: str, scope: dict[str, Any], *, domain: str) -> dict[str, Any] | None:
    """The cursor of ``token``; refused when it does not verify, is malformed, or was minted for
    other filters."""
    if not token:
        return None
    try:
        body, _, mac = token.partition(".")
        payload = _unb64(body)
        if not mac or not hmac.compare_digest(_unb64(mac), _mac(payload)):
            raise _invalid_token("page_token is not a token this service issued", domain)
        parsed = json.loads(payload)
        cursor, fingerprint = parsed["c"], parsed["f"]
    except (ValueError, KeyError, TypeError, binascii.Error, UnicodeError):
        raise _invalid_token("page_token is not a token this service issued", domain) from None
    if not isinstance(cursor, dict) or not _plain(cursor):
        raise _invalid_token("page_token is not a token this service issued", domain)
    if fingerprint != _fingerprint(scope):
        raise _invalid_token("page_token was issued for a request with other filters", domain)
    return cursor


def decode_cursor(token: str, scope: dict[str, Any], read: Callable[[dict[str, Any]], T], *, domain: str) -> T | None:
    """A listing's position from its page token, as ``read`` takes it out of the cursor (None: the
    first page); a cursor ``read`` cannot take apart is a token this service did not issue."""
    cursor = decode_page_token(token, scope, domain=domain)
    if cursor is None:
        return None
    try:
        return read(cursor)
    except (KeyError, ValueError, TypeError, OverflowError):
        raise _invalid_token("page_token is not a token this service issued", domain) from None


def _cursor_time(text: Any) -> datetime:
    """A cursor's time as an aware UTC datetime PostgreSQL can compare: any instant of years
    1..9999 UTC, the range the contract lets a Timestamp hold (``libs.common.contract``), so a
    cursor minted from any stored time comes back (an episode ending 9999-12-31 pages on). A time
    whose offset takes it outside those years fails its conversion to UTC here (OverflowError),
    before it reaches the driver."""
    if not isinstance(text, str):
        raise TypeError("time")
    value = datetime.fromisoformat(text)
    if value.tzinfo is None:
        raise ValueError("naive time")
    return value.astimezone(UTC)


def decode_time_cursor(
    token: str, scope: dict[str, Any], *, domain: str, id_type: Callable[[str], Any] = str
) -> tuple[datetime, Any] | None:
    """The (time, id) position of a newest-first listing, from its page token (None: first page)."""

    def read(c: dict[str, Any]) -> tuple[datetime, Any]:
        if not isinstance(c["id"], str):
            raise TypeError("id")
        return _cursor_time(c["t"]), id_type(c["id"])

    return decode_cursor(token, scope, read, domain=domain)


def encode_time_cursor(time: datetime, ident: object, scope: dict[str, Any]) -> str:
    """The page token that resumes a newest-first listing after (time, id). A naive ``time`` is
    UTC: every stored time is, and asyncpg reads the two instants it takes for its infinity
    sentinels (0001-01-01T00:00:00 and 9999-12-31T23:59:59.999999 UTC) back as naive datetimes."""
    if time.tzinfo is None:
        time = time.replace(tzinfo=UTC)
    return encode_page_token({"t": time.isoformat(), "id": str(ident)}, scope)
