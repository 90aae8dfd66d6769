"""The request contract: protovalidate's standard rules, read from the message descriptors, checked
at the edge before any servicer runs.

The limits live in the protos (``buf.validate`` field and message options), so a Node or Go caller
reads them from the same contract the server enforces. This module checks them natively: each
message type's rules are compiled once into a plan (cached per type), and a check walks only the
fields that are set or carry a rule — no CEL interpreter runs per request (the turn-start RPC must
take a few milliseconds).

What is supported, and the reason code each violation carries (``ErrorInfo.reason``):

- ``required`` → ``FIELD_REQUIRED``; ``string.min_len`` / ``repeated.min_items`` on an empty value →
  ``FIELD_REQUIRED``.
- ``string.max_len`` / ``string.max_bytes`` → ``FIELD_TOO_LONG``; ``repeated.max_items`` →
  ``TOO_MANY_ITEMS``.
- ``string.pattern`` / ``uuid`` / ``in`` / ``not_in`` / ``prefix`` / ``suffix`` / ``contains`` /
  ``not_contains`` / ``len``, ``enum.defined_only`` / ``in`` / ``not_in`` / ``const``, numeric
  ``gt`` / ``gte`` / ``lt`` / ``lte`` / ``in`` / ``not_in`` / ``const``, ``repeated.unique`` →
  ``FIELD_INVALID``.
- ``(buf.validate.message).oneof`` → ``ONE_OF_REQUIRED``.
- A field's ``cel`` rule whose ``id`` is an UPPER_SNAKE reason: the reason is its ``id`` and the
  description its ``message``. Only three expression forms are understood — ``this.size() <= N``,
  ``this >= A`` and ``this >= A && this <= B`` — the ones a service needs to keep a reason code of
  its own (``TOO_MANY_IDS``, ``PAGE_SIZE_INVALID``, ``LIMIT_OUT_OF_RANGE``...). Any other rule
  (an unknown expression, a standard rule not listed here) is a :class:`ContractError` when the
  type is first compiled, so nobody can annotate a limit the server silently ignores.

Checked on every message whatever its annotations: no string holds U+0000 (PostgreSQL text cannot)
and every ``google.protobuf.Timestamp`` lies in years 1–9999 with nanos in 0..999,999,999 (both
``FIELD_INVALID``). A bad value is never echoed whole: at most a short prefix, so a refusal always
fits in the caller's metadata limit.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from buf.validate import validate_pb2
from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor
from google.protobuf.message import Message

from libs.common.errors import FieldViolation, InvalidArgument

__all__ = [
    "MAX_REPORTED",
    "ContractError",
    "Violation",
    "check_request",
    "echo",
    "plan_of",
    "refusal",
    "repeated_string_bounds",
    "string_max_len",
    "violations",
]

if TYPE_CHECKING:
    from google.protobuf.descriptor_pb2 import FieldOptions, MessageOptions
    from google.protobuf.internal.extension_dict import _ExtensionFieldDescriptor

# protoc's --pyi_out types an extension as a plain FieldDescriptor; these casts say which options
# message each extends and which rules message it holds, so reading them is typed.
_MESSAGE_RULES = cast("_ExtensionFieldDescriptor[MessageOptions, validate_pb2.MessageRules]", validate_pb2.message)
_FIELD_RULES = cast("_ExtensionFieldDescriptor[FieldOptions, validate_pb2.FieldRules]", validate_pb2.field)

MAX_REPORTED = 8
"""Violations listed in one refusal's BadRequest (the rest are counted in its metadata): the whole
status rides in the response trailers, which a client caps (8 KiB by default)."""
_MAX_DESCRIPTION = 160
_ECHO = 32

MIN_TIMESTAMP_SECONDS = -62_135_596_800
"""0001-01-01T00:00:00Z, the first instant a Timestamp may hold."""
MAX_TIMESTAMP_SECONDS = 253_402_300_799
"""9999-12-31T23:59:59Z, the last."""
_MAX_NANOS = 999_999_999
_TIMESTAMP = "google.protobuf.Timestamp"
_UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
_REASON = re.compile(r"^[A-Z][A-Z0-9_]*$")
_IGNORE_IF_ZERO = validate_pb2.IGNORE_IF_ZERO_VALUE
_IGNORE_ALWAYS = validate_pb2.IGNORE_ALWAYS


class ContractError(Exception):
    """A rule in a proto that this checker cannot enforce (raised when the type is compiled)."""


@dataclass(frozen=True)
class Violation:
    """One broken rule: the field's path (``turn.interactions[2].body``), the reason code, a
    description that names the limit, and the limit itself (empty when there is none)."""

    field: str
    reason: str
    description: str
    limit: str = ""
    facts: tuple[tuple[str, str], ...] = ()
    """What was measured (``length``, ``count``, ``value``), for the refusal's metadata."""


def echo(value: object) -> str:
    """A bad value as a message may quote it: at most a short prefix, never the whole input."""
    text = str(value)
    # ascii(): a quoted value never widens the status with multi-byte characters.
    return ascii(text) if len(text) <= _ECHO else ascii(text[:_ECHO]) + f"... ({len(text)} characters)"


# A check of one value: its path in, the violations out (empty when the value keeps the rule).
_Check = Callable[[Any, str], list[Violation]]


@dataclass
class _FieldPlan:
    fd: FieldDescriptor
    name: str
    repeated: bool
    message: Descriptor | None  # the field's message type (a singular or repeated message field)
    timestamp: bool
    presence: bool  # singular field that tracks presence (message, optional, oneof member)
    is_string: bool
    required: bool = False
    ignore_zero: bool = False
    ignore_always: bool = False
    value_checks: list[_Check] = field(default_factory=list)  # the value or each item (a string's: then _nul)
    list_checks: list[_Check] = field(default_factory=list)  # the list as a whole (repeated)
    sub: _MessagePlan | None = None  # the plan of ``message``, once a walk has looked it up

    @property
    def needs_walk(self) -> bool:
        return bool(
            self.required or self.value_checks or self.list_checks or self.message is not None or self.is_string
        )


@dataclass
class _OneofRule:
    fields: tuple[str, ...]
    required: bool


@dataclass
class _MessagePlan:
    name: str
    fields: list[_FieldPlan] = field(default_factory=list)
    oneofs: list[_OneofRule] = field(default_factory=list)


_PLANS: dict[str, _MessagePlan] = {}


def string_max_len(message: type[Message], field: str) -> int:
    """A string field's ``max_len`` as its contract states it, so a caller that must fit a text to
    another service's field (a search query cut from a longer ask) reads the bound from the
    contract rather than copying the number. Raises :class:`ContractError` when the field states
    none."""
    descriptor = cast("Descriptor", message.DESCRIPTOR)
    fd = descriptor.fields_by_name[field]
    rules = fd.GetOptions().Extensions[_FIELD_RULES] if fd.GetOptions().HasExtension(_FIELD_RULES) else None
    if rules is None or not rules.string.HasField("max_len"):
        raise ContractError(f"{descriptor.full_name}.{field} states no string max_len")
    return int(rules.string.max_len)


def repeated_string_bounds(message: type[Message], field: str) -> tuple[int, int]:
    """A repeated string field's ``max_items`` and its items' ``max_len`` as its contract states
    them (as :func:`string_max_len`, for a writer that must fit a list to another service's field).
    Raises :class:`ContractError` when the field states either none."""
    descriptor = cast("Descriptor", message.DESCRIPTOR)
    fd = descriptor.fields_by_name[field]
    rules = fd.GetOptions().Extensions[_FIELD_RULES] if fd.GetOptions().HasExtension(_FIELD_RULES) else None
    if rules is None or not rules.repeated.HasField("max_items") or not rules.repeated.items.string.HasField("max_len"):
        raise ContractError(f"{descriptor.full_name}.{field} states no max_items and item max_len")
    return int(rules.repeated.max_items), int(rules.repeated.items.string.max_len)


def plan_of(descriptor: Descriptor) -> _MessagePlan:
    """The compiled rules of a message type (compiled once, then cached)."""
    plan = _PLANS.get(descriptor.full_name)
    if plan is None:
        plan = _MessagePlan(descriptor.full_name)
        _PLANS[descriptor.full_name] = plan  # before the fields: a type may contain itself
        try:
            _compile(descriptor, plan)
        except Exception:
            del _PLANS[descriptor.full_name]
            raise
    return plan


def _compile(descriptor: Descriptor, plan: _MessagePlan) -> None:
    in_oneof_rule: set[str] = set()
    mopts = descriptor.GetOptions()
    if mopts.HasExtension(_MESSAGE_RULES):
        mrules = mopts.Extensions[_MESSAGE_RULES]
        if mrules.cel:
            raise ContractError(f"{descriptor.full_name}: message-level cel rules are not supported")
        for rule in mrules.oneof:
            names = tuple(rule.fields)
            for n in names:
                if n not in descriptor.fields_by_name:
                    raise ContractError(f"{descriptor.full_name}: oneof rule names unknown field {n}")
            plan.oneofs.append(_OneofRule(names, rule.required))
            in_oneof_rule.update(names)
    for fd in descriptor.fields:
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            continue  # no request carries a map; nothing to check in one
        repeated = fd.is_repeated
        message = fd.message_type if fd.type == FieldDescriptor.TYPE_MESSAGE else None
        fp = _FieldPlan(
            fd=fd,
            name=fd.name,
            repeated=repeated,
            message=message,
            timestamp=message is not None and message.full_name == _TIMESTAMP,
            presence=not repeated and fd.has_presence,
            is_string=fd.type == FieldDescriptor.TYPE_STRING,
            ignore_zero=fd.name in in_oneof_rule,
        )
        opts = fd.GetOptions()
        if opts.HasExtension(_FIELD_RULES):
            _compile_field(fp, opts.Extensions[_FIELD_RULES], f"{descriptor.full_name}.{fd.name}")
        if fp.is_string:
            fp.value_checks.append(_nul)  # last: a string's own rules first, then no NUL in it
        if fp.needs_walk:
            plan.fields.append(fp)


def _compile_field(fp: _FieldPlan, rules: validate_pb2.FieldRules, where: str) -> None:
    fp.required = rules.required
    if rules.HasField("ignore"):
        fp.ignore_zero = fp.ignore_zero or rules.ignore == _IGNORE_IF_ZERO
        fp.ignore_always = rules.ignore == _IGNORE_ALWAYS
    kind = rules.WhichOneof("type")
    if fp.repeated:
        target = fp.list_checks
        if kind not in (None, "repeated"):
            raise ContractError(f"{where}: a repeated field takes repeated rules, not {kind}")
        if kind == "repeated":
            fp.list_checks.extend(_repeated_checks(rules.repeated, fp, where))
            if rules.repeated.HasField("items"):
                items = rules.repeated.items
                if items.cel:
                    fp.value_checks.extend(_cel_checks(items.cel, where))
                item_kind = items.WhichOneof("type")
                if item_kind is not None:
                    fp.value_checks.extend(_typed_checks(item_kind, getattr(items, item_kind), fp.fd, where))
    else:
        target = fp.value_checks
        if kind is not None:
            fp.value_checks.extend(_typed_checks(kind, getattr(rules, kind), fp.fd, where))
    target.extend(_cel_checks(rules.cel, where))


# ------------------------------------------------------------------------------ rule compilers


def _unsupported(rules: Any, supported: set[str], where: str) -> None:
    for fd, _ in rules.ListFields():
        if fd.name not in supported:
            raise ContractError(f"{where}: rule {fd.name} is not supported by libs.common.contract")


def _typed_checks(kind: str, rules: Any, fd: FieldDescriptor, where: str) -> list[_Check]:
    if kind == "string":
        return _string_checks(rules, where)
    if kind == "enum":
        if fd.enum_type is None:
            raise ContractError(f"{where}: enum rules on a field that is not an enum")
        return _enum_checks(rules, fd.enum_type, where)
    if kind in ("int32", "int64", "uint32", "uint64", "sint32", "sint64", "fixed32", "fixed64", "sfixed32", "sfixed64"):
        return _number_checks(rules, where)
    if kind == "timestamp":
        _unsupported(rules, set(), where)
        return []
    raise ContractError(f"{where}: {kind} rules are not supported by libs.common.contract")


def _v(path: str, reason: str, description: str, limit: object = "", **facts: object) -> list[Violation]:
    measured = tuple((k, str(v)) for k, v in facts.items())
    return [Violation(path, reason, description[:_MAX_DESCRIPTION], str(limit), measured)]


def _string_checks(r: validate_pb2.StringRules, where: str) -> list[_Check]:
    _unsupported(
        r,
        {
            "min_len",
            "max_len",
            "len",
            "max_bytes",
            "pattern",
            "uuid",
            "in",
            "not_in",
            "prefix",
            "suffix",
            "contains",
            "not_contains",
        },
        where,
    )
    checks = _count_checks(
        r, ("min_len", "max_len"), lambda k: f"is {k} characters", "FIELD_TOO_LONG", "length", empty_is_required=True
    )
    if r.HasField("len"):
        exact = r.len

        def exact_len(value: str, path: str) -> list[Violation]:
            if len(value) == exact:
                return []
            return _v(path, "FIELD_INVALID", f"{path} must be exactly {exact} characters, not {len(value)}", exact)

        checks.append(exact_len)
    if r.HasField("max_bytes"):
        mb = r.max_bytes

        def max_bytes(value: str, path: str) -> list[Violation]:
            size = len(value.encode("utf-8", "surrogatepass"))
            if size <= mb:
                return []
            return _v(path, "FIELD_TOO_LONG", f"{path} is {size} bytes; the limit is {mb}", mb, bytes=size)

        checks.append(max_bytes)
    if r.HasField("pattern"):
        try:
            rx = re.compile(r.pattern)
        except re.error as err:
            raise ContractError(f"{where}: pattern {r.pattern!r} does not compile: {err}") from None
        shown = r.pattern

        def pattern(value: str, path: str) -> list[Violation]:
            if rx.search(value):
                return []
            return _v(path, "FIELD_INVALID", f"{path} {echo(value)} does not match {shown}", shown)

        checks.append(pattern)
    if r.uuid:

        def is_uuid(value: str, path: str) -> list[Violation]:
            if _UUID.match(value):
                return []
            return _v(path, "FIELD_INVALID", f"{path} {echo(value)} is not a UUID")

        checks.append(is_uuid)
    if r.HasField("prefix"):
        pre = r.prefix
        checks.append(lambda v, p: [] if v.startswith(pre) else _v(p, "FIELD_INVALID", f"{p} must start with {pre!r}"))
    if r.HasField("suffix"):
        suf = r.suffix
        checks.append(lambda v, p: [] if v.endswith(suf) else _v(p, "FIELD_INVALID", f"{p} must end with {suf!r}"))
    if r.HasField("contains"):
        sub = r.contains
        checks.append(lambda v, p: [] if sub in v else _v(p, "FIELD_INVALID", f"{p} must contain {sub!r}"))
    if r.HasField("not_contains"):
        bad = r.not_contains
        checks.append(lambda v, p: [] if bad not in v else _v(p, "FIELD_INVALID", f"{p} must not contain {bad!r}"))
    return checks + _set_checks(r, lambda allowed: str(sorted(allowed)), lambda v, p: f"{p} {echo(v)} is refused")


def _enum_checks(r: validate_pb2.EnumRules, enum: EnumDescriptor, where: str) -> list[_Check]:
    _unsupported(r, {"defined_only", "in", "not_in", "const"}, where)
    checks: list[_Check] = []
    names = {v.number: v.name for v in enum.values}
    if r.defined_only:

        def defined(value: int, path: str) -> list[Violation]:
            if value in names:
                return []
            return _v(path, "FIELD_INVALID", f"{path} {value} is not a defined {enum.name} value")

        checks.append(defined)
    return checks + _set_checks(
        r,
        lambda allowed: ", ".join(names.get(n, str(n)) for n in sorted(allowed)),
        lambda v, p: f"{p} must not be {names.get(v, v)}",
        lambda want: str(names.get(want, want)),
    )


def _number_checks(r: Any, where: str) -> list[_Check]:
    _unsupported(r, {"gt", "gte", "lt", "lte", "in", "not_in", "const"}, where)
    lo = r.gte if r.HasField("gte") else (r.gt + 1 if r.HasField("gt") else None)
    hi = r.lte if r.HasField("lte") else (r.lt - 1 if r.HasField("lt") else None)
    if lo is not None and hi is not None and lo > hi:
        raise ContractError(f"{where}: exclusive ranges (gt above lt) are not supported")
    checks: list[_Check] = []
    if lo is not None or hi is not None:
        checks.append(_range_check("FIELD_INVALID", lo, hi, ""))
    return checks + _set_checks(r, lambda allowed: str(sorted(allowed)), lambda v, p: f"{p} must not be {v}", str)


def _set_checks(
    r: Any,
    one_of: Callable[[frozenset[Any]], str],
    refused: Callable[[Any, str], str],
    const: Callable[[Any], str] | None = None,
) -> list[_Check]:
    """The value-set rules strings, enums and numbers share: ``in``, ``not_in`` and (given how to
    show it) ``const``; each kind says how its values read in the violation."""
    checks: list[_Check] = []
    if getattr(r, "in"):
        allowed = frozenset(getattr(r, "in"))
        shown = one_of(allowed)
        checks.append(lambda v, p: [] if v in allowed else _v(p, "FIELD_INVALID", f"{p} must be one of {shown}"))
    if r.not_in:
        bad = frozenset(r.not_in)
        checks.append(lambda v, p: [] if v not in bad else _v(p, "FIELD_INVALID", refused(v, p)))
    if const is not None and r.HasField("const"):
        want = r.const
        must = const(want)
        checks.append(lambda v, p: [] if v == want else _v(p, "FIELD_INVALID", f"{p} must be {must}"))
    return checks


def _range_check(reason: str, lo: int | None, hi: int | None, message: str) -> _Check:
    if lo is not None and hi is not None:
        bounds, limit = f"between {lo} and {hi}", f"{lo}..{hi}"
    elif lo is not None:
        bounds, limit = f"at least {lo}", str(lo)
    else:
        bounds, limit = f"at most {hi}", str(hi)

    def in_range(value: int, path: str) -> list[Violation]:
        if (lo is None or value >= lo) and (hi is None or value <= hi):
            return []
        text = f"{path}: {message} (got {value})" if message else f"{path} must be {bounds}, got {value}"
        return _v(path, reason, text, limit, value=value)

    return in_range


def _count_checks(
    r: Any,
    bounds: tuple[str, str],
    amount: Callable[[int], str],
    over_reason: str,
    over_fact: str,
    *,
    empty_is_required: bool = False,
) -> list[_Check]:
    """A string's length or a list's size within the rules' (least, most) fields: ``amount`` says
    how a size reads ("is 3 characters", "has 3 items"); an empty value short of the least is
    FIELD_REQUIRED (said as "is required" when ``empty_is_required``)."""
    least, most = bounds
    checks: list[_Check] = []
    if r.HasField(least):
        n = getattr(r, least)

        def at_least(value: Any, path: str) -> list[Violation]:
            if len(value) >= n:
                return []
            if not value and empty_is_required:
                return _v(path, "FIELD_REQUIRED", f"{path} is required", n)
            reason = "FIELD_REQUIRED" if not value else "FIELD_INVALID"
            return _v(path, reason, f"{path} {amount(len(value))}; at least {n} are needed", n)

        checks.append(at_least)
    if r.HasField(most):
        m = getattr(r, most)

        def at_most(value: Any, path: str) -> list[Violation]:
            if len(value) <= m:
                return []
            return _v(path, over_reason, f"{path} {amount(len(value))}; the limit is {m}", m, **{over_fact: len(value)})

        checks.append(at_most)
    return checks


def _repeated_checks(r: validate_pb2.RepeatedRules, fp: _FieldPlan, where: str) -> list[_Check]:
    _unsupported(r, {"min_items", "max_items", "unique", "items"}, where)
    checks = _count_checks(r, ("min_items", "max_items"), lambda k: f"has {k} items", "TOO_MANY_ITEMS", "count")
    if r.unique:
        if fp.message is not None:
            raise ContractError(f"{where}: repeated.unique applies to scalars only")

        def unique(value: Any, path: str) -> list[Violation]:
            if len(set(value)) == len(value):
                return []
            return _v(path, "FIELD_INVALID", f"{path} must not repeat an item")

        checks.append(unique)
    return checks


_CEL_SIZE = re.compile(r"^\s*this\.size\(\)\s*<=\s*(\d+)\s*$")
_CEL_RANGE = re.compile(r"^\s*this\s*>=\s*(-?\d+)\s*&&\s*this\s*<=\s*(-?\d+)\s*$")
_CEL_MIN = re.compile(r"^\s*this\s*>=\s*(-?\d+)\s*$")


def _cel_checks(rules: Any, where: str) -> list[_Check]:
    checks: list[_Check] = []
    for rule in rules:
        reason = rule.id
        if not _REASON.match(reason):
            raise ContractError(f"{where}: a cel rule's id is the refusal's reason and must be UPPER_SNAKE: {reason!r}")
        message = rule.message
        expr = rule.expression
        if m := _CEL_SIZE.match(expr):
            checks.append(_size_check(reason, int(m.group(1)), message))
        elif m := _CEL_RANGE.match(expr):
            checks.append(_range_check(reason, int(m.group(1)), int(m.group(2)), message))
        elif m := _CEL_MIN.match(expr):
            checks.append(_range_check(reason, int(m.group(1)), None, message))
        else:
            raise ContractError(f"{where}: cel expression {expr!r} is not one libs.common.contract understands")
    return checks


def _size_check(reason: str, limit: int, message: str) -> _Check:
    def size(value: Any, path: str) -> list[Violation]:
        if len(value) <= limit:
            return []
        unit = "characters" if isinstance(value, str) else "items"
        text = f"{path} has {len(value)} {unit}; the limit is {limit}"
        measured = {"length": len(value)} if isinstance(value, str) else {"count": len(value)}
        return _v(path, reason, f"{text} ({message})" if message else text, limit, **measured)

    return size


# ------------------------------------------------------------------------------ the walk


def _zero(value: Any) -> bool:
    return not value  # "", 0, False, 0.0, b"", an empty list (messages are judged by presence, not here)


def _timestamp(ts: Any, path: str) -> list[Violation]:
    out: list[Violation] = []
    if not MIN_TIMESTAMP_SECONDS <= ts.seconds <= MAX_TIMESTAMP_SECONDS:
        out += _v(
            f"{path}.seconds",
            "FIELD_INVALID",
            f"{path} is outside years 1 to 9999 (seconds {ts.seconds})",
            f"{MIN_TIMESTAMP_SECONDS}..{MAX_TIMESTAMP_SECONDS}",
        )
    if not 0 <= ts.nanos <= _MAX_NANOS:
        out += _v(
            f"{path}.nanos",
            "FIELD_INVALID",
            f"{path}.nanos must be 0 to {_MAX_NANOS}, got {ts.nanos}",
            f"0..{_MAX_NANOS}",
        )
    return out


def _nul(value: str, path: str) -> list[Violation]:
    if "\x00" not in value:
        return []
    return _v(path, "FIELD_INVALID", f"{path} contains a NUL character (U+0000), which text fields cannot hold")


def _walk(msg: Any, plan: _MessagePlan, prefix: str, out: list[Violation]) -> None:
    """Append the violations of ``msg`` to ``out`` in field order, stopping once it holds
    :data:`MAX_COLLECTED` (a list, not a generator: a check's list is added as it is, with no
    generator frame per field and item)."""
    for rule in plan.oneofs:
        present = [n for n in rule.fields if _set(msg, msg.DESCRIPTOR.fields_by_name[n])]
        names = " and ".join(rule.fields)
        first = f"{prefix}{rule.fields[0]}"
        if len(present) > 1:
            out += _v(first, "ONE_OF_REQUIRED", f"name exactly one of {names}, not several")
        elif rule.required and not present:
            out += _v(first, "ONE_OF_REQUIRED", f"name exactly one of {names}")
    for fp in plan.fields:
        if len(out) >= MAX_COLLECTED:
            return
        if fp.ignore_always:
            continue
        path = f"{prefix}{fp.name}"
        if fp.message is not None and not fp.repeated:
            if not msg.HasField(fp.name):
                if fp.required:
                    out += _v(path, "FIELD_REQUIRED", f"{path} is required")
                continue
            value = getattr(msg, fp.name)
            if fp.timestamp:
                out += _timestamp(value, path)
            _walk(value, fp.sub or _sub_plan(fp), f"{path}.", out)
            continue
        value = getattr(msg, fp.name)
        if fp.presence and not msg.HasField(fp.name):
            if fp.required:
                out += _v(path, "FIELD_REQUIRED", f"{path} is required")
            continue
        if _zero(value):  # one rule for a zero scalar and an empty list (never presence-tracked)
            if fp.required and not fp.presence:
                out += _v(path, "FIELD_REQUIRED", f"{path} is required")
                continue
            if fp.ignore_zero:
                continue
        if not fp.repeated:
            for check in fp.value_checks:
                out += check(value, path)
            continue
        for check in fp.list_checks:
            out += check(value, path)
        if fp.message is None:
            if not fp.value_checks:
                continue  # no rule on an item (an embedding's floats): nothing to walk per item
            for i, item in enumerate(value):
                if len(out) >= MAX_COLLECTED:
                    return
                ipath = f"{path}[{i}]"
                for check in fp.value_checks:
                    out += check(item, ipath)
            continue
        sub = fp.sub or _sub_plan(fp)
        for i, item in enumerate(value):
            if len(out) >= MAX_COLLECTED:
                return
            ipath = f"{path}[{i}]"
            if fp.timestamp:
                out += _timestamp(item, ipath)
            _walk(item, sub, f"{ipath}.", out)


def _sub_plan(fp: _FieldPlan) -> _MessagePlan:
    """The plan of a message field's type, kept on the field's plan after the first walk (compiled
    lazily, as a type may contain itself)."""
    assert fp.message is not None
    fp.sub = plan_of(fp.message)
    return fp.sub


def _set(msg: Message, fd: FieldDescriptor) -> bool:
    if fd.is_repeated:
        return len(getattr(msg, fd.name)) > 0
    if fd.has_presence:
        return msg.HasField(fd.name)
    return bool(getattr(msg, fd.name))


MAX_COLLECTED = 100
"""A walk stops after this many violations: a list of 100,000 bad items costs no more to refuse
than one of 100."""


def violations(msg: Any) -> list[Violation]:
    """The rules ``msg`` breaks, in field order (nested fields at their parent's place), at most
    :data:`MAX_COLLECTED` of them."""
    found: list[Violation] = []
    _walk(msg, plan_of(msg.DESCRIPTOR), "", found)
    return found[:MAX_COLLECTED]


def refusal(found: list[Violation], *, domain: str) -> InvalidArgument:
    """One INVALID_ARGUMENT for every violation at once: the first one's reason, every field path
    in the BadRequest (up to :data:`MAX_REPORTED`), every path in ``metadata.fields``."""
    first = found[0]
    shown = found[:MAX_REPORTED]
    count = f"{len(found)}+" if len(found) >= MAX_COLLECTED else str(len(found))
    if len(found) == 1:
        message = first.description
    else:
        message = f"{count} violations of the contract: " + "; ".join(v.description for v in shown[:3])
        if len(found) > 3:
            message += "; and more (see the BadRequest)"
    metadata: dict[str, object] = {"field": first.field, "violations": count}
    paths = ",".join(dict.fromkeys(v.field for v in found))
    metadata["fields"] = paths if len(paths) <= 96 else paths[:93] + "..."
    if first.limit:
        metadata["limit"] = first.limit
    metadata.update(first.facts)
    reasons = ",".join(dict.fromkeys(v.reason for v in found))
    if reasons != first.reason:
        metadata["reasons"] = reasons[:96]
    return InvalidArgument(
        message[:300],
        reason=first.reason,
        domain=domain,
        metadata=metadata,
        violations=[
            FieldViolation(v.field, v.description if v.reason == first.reason else f"{v.reason}: {v.description}")
            for v in shown
        ],
    )


def check_request(msg: Any, *, domain: str) -> None:
    """Raise one :class:`InvalidArgument` naming every field of ``msg`` that breaks the contract."""
    found = violations(msg)
    if found:
        raise refusal(found, domain=domain)
