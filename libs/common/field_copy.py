"""Copying same-named fields between a domain record and a protobuf message.

Every servicer wrote its conversions field by field (``company=note.company, seat=note.seat, ...``,
and back ``company=request.company, ...``), restating in each the same few rules: a datetime is a
Timestamp, an id is its string, a tuple is a repeated field, None is an unset field (and, going
back, an unset Timestamp is None and a repeated field a tuple). Here the rules live once; a
conversion names the fields that carry over as they are and gives the rest (renamed, enum-mapped,
nested) explicitly.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from datetime import datetime
from enum import Enum
from functools import cache
from typing import Any, TypeVar

from google.protobuf.message import Message

from libs.common.enum_maps import enum_to_pb
from libs.common.protoconv import timestamp, when

__all__ = ["enum_from_pb", "from_pb", "to_pb"]

M = TypeVar("M", bound=Message)
T = TypeVar("T")
E = TypeVar("E", bound=Enum)


_AS_IS = frozenset({str, int, float, bool, bytes})


@cache
def _names(names: str) -> tuple[str, ...]:
    """A conversion's field list, split once per call site's string (these run per row on read paths)."""
    return tuple(names.split())


def _pb_value(value: Any) -> Any:
    if type(value) in _AS_IS:
        return value
    if isinstance(value, datetime):
        return timestamp(value)
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, tuple | list | frozenset):
        return list(value)
    return value


def to_pb(cls: type[M], source: object, names: str, /, **given: Any) -> M:
    """A ``cls`` message whose fields ``names`` (space-separated) are ``source``'s same-named
    attributes and whose other fields are ``given``; both converted to the message's types (a
    datetime to a Timestamp, a UUID to its string, a sequence to a list), None leaving a field unset."""
    fields = {name: _pb_value(value) for name in _names(names) if (value := getattr(source, name)) is not None}
    fields.update((name, _pb_value(value)) for name, value in given.items() if value is not None)
    return cls(**fields)


def _domain_value(msg: Message, name: str) -> Any:
    field = msg.DESCRIPTOR.fields_by_name[name]
    value = getattr(msg, name)
    if field.is_repeated:
        return tuple(value)
    if field.message_type is not None and field.message_type.full_name == "google.protobuf.Timestamp":
        return when(msg, name)
    return value


def from_pb(cls: Callable[..., T], msg: Message, names: str, /, **given: Any) -> T:
    """A ``cls`` whose arguments ``names`` (space-separated) are ``msg``'s same-named fields and
    whose others are ``given``: a repeated field as a tuple, a Timestamp as an aware datetime (None
    when unset), a scalar as it is."""
    values = {name: _domain_value(msg, name) for name in _names(names)}
    values.update(given)
    return cls(**values)


def enum_from_pb(members: Iterable[E], pb_enum: Any, prefix: str) -> dict[int, E]:
    """``{proto value: member}``: :func:`libs.common.enum_maps.enum_to_pb` read the other way, for a
    request's enum fields (a value the domain lacks is then absent, for the caller to refuse)."""
    return {v: k for k, v in enum_to_pb(members, pb_enum, prefix).items()}
