"""The templates and the filters they use (Jinja2, autoescaped, undefined names fail loudly)."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from google.protobuf import json_format
from google.protobuf.timestamp_pb2 import Timestamp
from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape

__all__ = ["HANDLE", "environment", "seg", "unseg"]

HANDLE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@/-]{0,199}$")
"""A company, seat, user or session handle (the contracts' pattern)."""


def seg(handle: str) -> str:
    """A handle as one URL path segment: ``/`` (allowed in handles) becomes ``~`` (never in one)."""
    return handle.replace("/", "~")


def unseg(segment: str) -> str | None:
    """The handle a path segment names, or None when it names none."""
    handle = segment.replace("~", "/")
    return handle if HANDLE.match(handle) else None


def _when(msg: Any, field: str) -> str:
    """A Timestamp field as ``2026-03-10 09:00 UTC``; an em dash when unset."""
    if not msg.HasField(field):
        return "—"
    ts: Timestamp = getattr(msg, field)
    return ts.ToDatetime(tzinfo=UTC).strftime("%Y-%m-%d %H:%M UTC")


def _iso(msg: Any, field: str) -> str:
    return getattr(msg, field).ToDatetime(tzinfo=UTC).isoformat() if msg.HasField(field) else ""


def _enum(msg: Any, field: str) -> str:
    """An enum field's value in words: ``REFLECTION_STATE_DEAD_LETTERED`` reads ``dead lettered``."""
    fd = msg.DESCRIPTOR.fields_by_name[field]
    value = getattr(msg, field)
    name = fd.enum_type.values_by_number[value].name if value in fd.enum_type.values_by_number else str(value)
    prefix = re.sub(r"(?<!^)(?=[A-Z])", "_", fd.enum_type.name).upper() + "_"
    name = name.removeprefix(prefix)
    return "—" if name == "UNSPECIFIED" else name.lower().replace("_", " ")


def _payload(msg: Any) -> str:
    return json.dumps(json_format.MessageToDict(msg), sort_keys=True, ensure_ascii=False)


def _pct(value: float) -> str:
    return f"{value * 100:.0f}%"


def _num(value: float | int) -> str:
    return f"{value:,.2f}".rstrip("0").rstrip(".") if isinstance(value, float) else f"{value:,}"


def _query(base: dict[str, Any], **changes: Any) -> str:
    """``?a=1&b=2`` from the current filters with ``changes`` applied (None drops a key)."""
    merged = {**base, **changes}
    pairs = {k: v for k, v in merged.items() if v not in (None, "", False)}
    return "?" + urlencode(pairs) if pairs else "?"


def _day(value: datetime) -> str:
    return value.strftime("%Y-%m-%d")


def environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(Path(__file__).parent / "templates"),
        autoescape=select_autoescape(["html"]),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(seg=seg, pct=_pct, num=_num, day=_day)
    env.globals.update(when=_when, iso=_iso, enum=_enum, payload=_payload, query=_query)
    return env
