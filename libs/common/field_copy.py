"""Copying same-named fields between a domain record and a protobuf message.

Every servicer wrote its conversions field by field (``company=note.company, seat=note.seat, ...``,
and back ``company=request.company, ...``), restating in each the same few rules: a datetime is a
Timestamp, an id is its string, a tuple is a repeated field, None is an unset field (and, going
back, an unset Timestamp is None and a repeated field a tuple). Here the rules live once; a
conversion names the fields that carry over as they are and gives the rest (renamed, enum-mapped,
nested) explicitly.
"""

from __future__ import annotations

import keyword
import uuid
from collections.abc import Callable, Iterable
from datetime import datetime
from enum import Enum
from functools import cache
from typing import Any, TypeVar, cast

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from libs.common.enum_maps import enum_to_pb
from libs.common.protoconv import timestamp_fields, timestamp_value, when

__all__ = ["enum_from_pb", "from_pb", "pb_fields", "to_pb"]

M = TypeVar("M", bound=Message)
T = TypeVar("T")
E = TypeVar("E", bound=Enum)


_AS_IS = frozenset({str, int, float, bool, bytes})
_TIMESTAMP = "google.protobuf.Timestamp"


@cache
def _names(names: str) -> tuple[str, ...]:
    """A conversion's field list, split once per call site's string (these run per row on read paths)."""
    return tuple(names.split())


def _pb_value(value: Any) -> Any:
    """The rules, for any value: what a compiled conversion falls back to for a value whose type is
    not the one its field expects (a UUID for a string, an enum member given as it is, ...)."""
    if type(value) in _AS_IS:
        return value
    if isinstance(value, datetime):
        return timestamp_fields(value)
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, tuple | list | frozenset):
        return list(value)
    return value


def to_pb(cls: type[M], source: object, names: str, /, **given: Any) -> M:
    """A ``cls`` message whose fields ``names`` (space-separated) are ``source``'s same-named
    attributes and whose other fields are ``given``; both converted to the message's types (a
    datetime to a Timestamp, a UUID to its string, a sequence to a list), None leaving a field unset."""
    key = (cls, names, *given)
    convert = _TO_PB.get(key)
    if convert is None:
        convert = _TO_PB[key] = _compile_to_pb(cls, names, tuple(given), "cls")
    return cast("M", convert(source, given))


def pb_fields(cls: type[Message], source: object, names: str, /, **given: Any) -> dict[str, Any]:
    """What :func:`to_pb` would pass to ``cls``'s constructor, as a dict (a Timestamp as its own
    dict; a field left unset may be there as None, which a constructor takes as unset): for a
    message nested in another, which the outer constructor then builds in place rather than
    copying one built before (a RecallNotes response nests ~114 notes)."""
    key = (cls, names, *given)
    convert = _PB_FIELDS.get(key)
    if convert is None:
        convert = _PB_FIELDS[key] = _compile_to_pb(cls, names, tuple(given), "dict")
    return cast("dict[str, Any]", convert(source, given))


# (cls, names, *given's keys) → the conversion compiled for that call site. A turn start makes ~160
# of these conversions; the rules below, applied per field per call, were most of their cost.
_TO_PB: dict[tuple[Any, ...], Callable[[object, dict[str, Any]], Any]] = {}
_PB_FIELDS: dict[tuple[Any, ...], Callable[[object, dict[str, Any]], Any]] = {}


def _identifiers(names: Iterable[str]) -> bool:
    return all(n.isidentifier() and not keyword.iskeyword(n) for n in names)


def _compile_to_pb(
    cls: type[Message], names: str, given: tuple[str, ...], make: str
) -> Callable[[object, dict[str, Any]], Any]:
    """One function for a call site: ``cls(field=<value>, ...)`` (or ``dict(...)`` for
    :func:`pb_fields`) with each field's conversion chosen once from the message's descriptor. A
    value of the type the field expects passes with one type check; any other goes through
    :func:`_pb_value`, so the result is the same as the rules give. None is passed as it is: a
    message's constructor leaves a field given None unset, as the rules say."""
    own = _names(names)
    if not _identifiers(own) or not _identifiers(given) or len({*own, *given}) < len(own) + len(given):
        # Not compiled: a field name Python cannot spell as an argument, a field named twice, or a
        # given field also named (where a given None leaves the source's value, as it always has).

        def generic(source: object, values: dict[str, Any]) -> Any:
            fields = {name: _pb_value(value) for name in own if (value := getattr(source, name)) is not None}
            fields.update((name, _pb_value(value)) for name, value in values.items() if value is not None)
            return cls(**fields) if make == "cls" else fields

        return generic

    by_name = cls.DESCRIPTOR.fields_by_name
    args = [f"{n}={_value_code(by_name.get(n), f'source.{n}')}" for n in own]
    args += [f"{n}={_value_code(by_name.get(n), f'given[{n!r}]')}" for n in given]
    code = f"def convert(source, given):\n    return {make}({', '.join(args)})\n"
    scope: dict[str, Any] = {
        "cls": cls,
        "dict": dict,
        "_pb_value": _pb_value,
        "_ts": timestamp_fields,
        "_datetime": datetime,
        "_UUID": uuid.UUID,
        "str": str,
        "int": int,
        "float": float,
        "bool": bool,
        "bytes": bytes,
        "tuple": tuple,
        "list": list,
    }
    # The code is made of field names checked as identifiers, and of the expressions below.
    exec(compile(code, f"<to_pb {cls.__name__}>", "exec"), scope)
    return cast("Callable[[object, dict[str, Any]], Any]", scope["convert"])


_SCALAR_TYPES = {
    FieldDescriptor.CPPTYPE_STRING: "str",
    FieldDescriptor.CPPTYPE_BOOL: "bool",
    FieldDescriptor.CPPTYPE_DOUBLE: "float",
    FieldDescriptor.CPPTYPE_FLOAT: "float",
    FieldDescriptor.CPPTYPE_INT32: "int",
    FieldDescriptor.CPPTYPE_INT64: "int",
    FieldDescriptor.CPPTYPE_UINT32: "int",
    FieldDescriptor.CPPTYPE_UINT64: "int",
}


def _value_code(field: Any, read: str) -> str:  # a FieldDescriptor, or None
    """The expression converting ``read`` for ``field``: the expected type passed on after one
    check (a string field's str, a Timestamp's datetime, a repeated field's tuple or list), anything
    else through the rules."""
    if field is None:  # not the message's: the constructor refuses it, as it did
        return f"_pb_value({read})"
    if field.is_repeated:
        # A tuple is taken by the constructor as the list the rules made of it; a list is copied.
        return f"(v if (v := {read}).__class__ is tuple else _pb_value(v))"
    if field.message_type is not None:
        if field.message_type.full_name == _TIMESTAMP:
            return f"(_ts(v) if (v := {read}).__class__ is _datetime else None if v is None else _pb_value(v))"
        return f"_pb_value({read})"
    expected = _SCALAR_TYPES.get(field.cpp_type)
    if expected is None:  # an enum: a member of the domain's enum has been mapped by the caller
        return f"(v if (v := {read}).__class__ is int or v is None else _pb_value(v))"
    if expected == "str":  # an id is often a UUID: its string, as the rules make it
        return (
            f"(v if (v := {read}).__class__ is str or v is None else str(v) if v.__class__ is _UUID else _pb_value(v))"
        )
    return f"(v if (v := {read}).__class__ is {expected} or v is None else _pb_value(v))"


def from_pb(cls: Callable[..., T], msg: Message, names: str, /, **given: Any) -> T:
    """A ``cls`` whose arguments ``names`` (space-separated) are ``msg``'s same-named fields and
    whose others are ``given``: a repeated field as a tuple, a Timestamp as an aware datetime (None
    when unset), a scalar as it is."""
    key = (cls, msg.__class__, names, *given)
    convert = _FROM_PB.get(key)
    if convert is None:
        convert = _FROM_PB[key] = _compile_from_pb(cls, msg.DESCRIPTOR, names, tuple(given))
    return cast("T", convert(msg, given))


# (cls, message class, names, *given's keys) → the conversion compiled for that call site.
_FROM_PB: dict[tuple[Any, ...], Callable[[Message, dict[str, Any]], Any]] = {}


def _compile_from_pb(
    cls: Callable[..., T], descriptor: Any, names: str, given: tuple[str, ...]
) -> Callable[[Message, dict[str, Any]], T]:
    """One function for a call site: ``cls(name=<msg's field>, ..., **given)``, each field read as
    its descriptor says once (a field not the message's raises as it did, on the first call)."""
    own = [n for n in _names(names) if n not in given]
    by_name = descriptor.fields_by_name
    if not _identifiers(own) or len(set(own)) < len(own):  # a name Python cannot spell, or one named twice

        def generic(msg: Message, values: dict[str, Any]) -> T:
            fields = {name: _domain_value(msg, name) for name in _names(names)}
            fields.update(values)
            return cls(**fields)

        return generic

    args = []
    for n in own:
        field = by_name[n]
        if field.is_repeated:
            args.append(f"{n}=tuple(msg.{n})")
        elif field.message_type is not None and field.message_type.full_name == _TIMESTAMP:
            args.append(f"{n}=(_ts(msg.{n}) if msg.HasField({n!r}) else None)")
        else:
            args.append(f"{n}=msg.{n}")
    code = f"def convert(msg, given):\n    return cls({', '.join([*args, '**given'])})\n"
    scope: dict[str, Any] = {"cls": cls, "_ts": timestamp_value, "tuple": tuple}
    exec(compile(code, f"<from_pb {getattr(cls, '__name__', 'cls')}>", "exec"), scope)
    return cast("Callable[[Message, dict[str, Any]], T]", scope["convert"])


def _domain_value(msg: Message, name: str) -> Any:
    field = msg.DESCRIPTOR.fields_by_name[name]
    value = getattr(msg, name)
    if field.is_repeated:
        return tuple(value)
    if field.message_type is not None and field.message_type.full_name == _TIMESTAMP:
        return when(msg, name)
    return value


def enum_from_pb(members: Iterable[E], pb_enum: Any, prefix: str) -> dict[int, E]:
    """``{proto value: member}``: :func:`libs.common.enum_maps.enum_to_pb` read the other way, for a
    request's enum fields (a value the domain lacks is then absent, for the caller to refuse)."""
    return {v: k for k, v in enum_to_pb(members, pb_enum, prefix).items()}
