"""``BuiltinService.CallTool``: one builtin run by name with the arguments a model wrote, as JSON.

An engine hands its model the tools ``ListTools`` returns and forwards each tool call it gets back
unchanged: the name, the arguments as the model wrote them, and the turn's own fields (company,
seat, role, run id, senders, unit chain). Nothing here is a table per tool, so a builtin added to
``BuiltinService`` and to ``tools.tool_schemas`` is callable by every engine at once:

- the tool ``refresh_memory`` is the RPC ``RefreshMemory`` (the name in CamelCase), and its typed
  request is built from the arguments (a parameter's name is its request field's name) plus the
  turn's fields the request has;
- the arguments are validated against the very schema ``ListTools`` hands out, every violation
  named at once (``arguments_json.<parameter>``) — save a note's length, which the diary refuses
  as it does the typed call (``NOTE_TOO_LONG``, with its limit and length: ``_OWN_LENGTH_REFUSAL``);
- the scope is the tool's own RPC's ``required_scope`` from the proto, checked against the caller
  (CallTool's door only needs memory:read, so a read-only token can call the reading tools);
- a refusal of the typed RPC keeps its code, reason and domain; its field is renamed to where the
  caller wrote it (``content`` → ``arguments_json.content``).

Also here: the reading of the deprecated string fields of the builtin requests next to their enum
replacements (``tier`` / ``note_tier``, ``outcome_filter`` / ``outcome``).
"""

from __future__ import annotations

import contextvars
import json
import re
from collections.abc import Callable, Mapping
from typing import Any, NoReturn, TypeVar

from google.protobuf import json_format
from jsonschema import Draft202012Validator
from opentelemetry import trace

from agentlearn.diary.v1 import diary_service_pb2 as diary_pb
from agentlearn.episodes.v1 import episode_service_pb2 as ep_pb
from agentlearn.prefetch.v1 import prefetch_service_pb2 as pb
from libs.common.auth import current_principal, required_scope
from libs.common.bounds import at_most_chars
from libs.common.contract import check_request
from libs.common.errors import (
    AgentLearnError,
    FieldViolation,
    InvalidArgument,
    InvalidFields,
    NotFound,
    PermissionDenied,
    field_error,
)
from libs.common.rpctypes import ServicerContext
from libs.common.validation import require_ident, require_text
from services.knowledge.domain import Reader
from services.prefetch.deps import Deps
from services.prefetch.domain import DOMAIN
from services.prefetch.tools import BUILTIN_NAMES, tool_schemas

__all__ = [
    "ARGUMENTS_MAX_CHARS",
    "TOOL_CONTEXT_FIELDS",
    "call_tool",
    "method_of",
    "outcome_filter_of",
    "tier_of",
    "tool_request_id",
]

ARGUMENTS_MAX_CHARS = 1_000_000
"""``arguments_json`` past this is refused before it is parsed."""

TOOL_CONTEXT_FIELDS = ("company", "seat", "role", "turn_id", "senders", "unit_chain")
"""The CallToolRequest fields the engine fills; each is copied onto the typed request that has it."""

_SERVICE = pb.DESCRIPTOR.services_by_name["BuiltinService"]

_request_id: contextvars.ContextVar[str] = contextvars.ContextVar("agentlearn_tool_request_id", default="")


def tool_request_id() -> str:
    """The idempotency key of the CallTool being served ("" outside one): a writing builtin hands
    it to the write it makes. A context variable because the typed builtin requests carry no key
    of their own (the typed RPCs pass none)."""
    return _request_id.get()


def method_of(tool: str) -> Any:
    """The BuiltinService method serving a tool (``use_skill`` → ``UseSkill``), or None."""
    if not re.fullmatch(r"[a-z][a-z0-9_]*", tool):
        return None
    name = "".join(part.capitalize() for part in tool.split("_"))
    method = _SERVICE.methods_by_name.get(name)
    return None if method is None or name == "CallTool" else method


# ------------------------------------------------------------------------------------ CallTool


async def call_tool(
    servicer: Any, deps: Deps, request: pb.CallToolRequest, context: ServicerContext
) -> pb.CallToolResponse:
    """Validate, authorize and run one tool call through the typed handler of ``servicer``."""
    _check_envelope(request)
    name = request.name.strip()
    trace.get_current_span().set_attribute("agentlearn.tool", name[:100])
    can_search = await deps.searcher.can_search(Reader(request.company, request.seat, request.role))
    offered = {t["name"]: t for t in tool_schemas(deps.settings, request.company, request.role, can_search)}
    tool = offered.get(name)
    if tool is None:
        _not_offered(name, request.role, sorted(offered))
    method = method_of(name)
    if method is None:  # a schema with no RPC behind it: our bug, not the caller's
        raise RuntimeError(f"tool {name!r} has a schema but no BuiltinService RPC")
    scope = required_scope(f"/{_SERVICE.full_name}/{method.name}")
    if not current_principal().allows(scope):
        raise PermissionDenied(
            f"the credential lacks the scope {scope!r} the tool {name} needs",
            reason="SCOPE_MISSING",
            domain=DOMAIN,
            metadata={"scope": scope, "tool": name},
        )
    parameters: dict[str, Any] = tool["parameters"]
    arguments = _arguments(request.arguments_json)
    _validate(name, parameters, arguments)
    typed = _typed_request(method, arguments, request)
    handler = getattr(servicer, method.name)
    token = _request_id.set(request.request_id)
    try:
        # The typed request's own contract, as the edge checks every request (the handler is called
        # here, not through the server): a NUL in a hint reached Postgres as INTERNAL, a refresh
        # already spent. A refusal names the argument the caller wrote (renamed below).
        check_request(typed, domain=DOMAIN)
        answer = await handler(typed, context)
    except AgentLearnError as err:
        _rename_fields(err, set(parameters.get("properties", {})))
        raise
    finally:
        _request_id.reset(token)
    fields = answer.DESCRIPTOR.fields_by_name
    text = answer.text if "text" in fields else answer.body if "body" in fields else ""
    result = json_format.MessageToDict(
        answer, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    return pb.CallToolResponse(
        text=text,
        result_json=json.dumps(result, ensure_ascii=False, sort_keys=True),
        result_type=answer.DESCRIPTOR.full_name,
    )


def _check_envelope(request: pb.CallToolRequest) -> None:
    """Every bad envelope field at once (not the first), answered as every collecting RPC answers
    (:class:`InvalidFields`, docs/integrating.md "Errors"): it was ``FIELD_INVALID`` with only
    ``metadata.fields`` when several, and one bad field lost its ``field``/``value``/``limit``."""
    invalid = InvalidFields()
    with invalid.check():
        require_text(request.name, "name", domain=DOMAIN, max_chars=200)
    with invalid.check():
        require_ident(request.company, "company", domain=DOMAIN)
    with invalid.check():
        require_ident(request.seat, "seat", domain=DOMAIN)
    with invalid.check():
        require_text(request.role, "role", domain=DOMAIN, max_chars=200)
    for field, limit in (("turn_id", 200), ("request_id", 200), ("arguments_json", ARGUMENTS_MAX_CHARS)):
        with invalid.check():
            at_most_chars(getattr(request, field), field, limit, domain=DOMAIN)
    invalid.raise_any()


def _not_offered(name: str, role: str, offered: list[str]) -> NoReturn:
    metadata: dict[str, object] = {"tool": name[:100], "role": role, "tools": ",".join(offered)}
    if name in BUILTIN_NAMES or method_of(name) is not None:
        raise NotFound(
            f"the tool {name} is not offered to the role {role} (ListTools leaves it out: refine_skill when "
            f"skill refinement is off, search_knowledge when the role can search nothing); its tools: "
            f"{', '.join(offered)}",
            reason="TOOL_NOT_OFFERED",
            domain=DOMAIN,
            metadata=metadata,
        )
    raise NotFound(
        f"no builtin tool is named {name[:100]!r}; the role {role} has: {', '.join(offered)}",
        reason="TOOL_NOT_FOUND",
        domain=DOMAIN,
        metadata=metadata,
    )


def _arguments(text: str) -> dict[str, Any]:
    if not text.strip():
        return {}
    try:
        value = json.loads(text)
    except ValueError as err:
        raise field_error(
            "arguments_json",
            "ARGUMENTS_NOT_JSON",
            f"arguments_json is not JSON ({err.msg} at line {err.lineno} column {err.colno})"
            if isinstance(err, json.JSONDecodeError)
            else "arguments_json is not JSON",
            domain=DOMAIN,
        ) from None
    if not isinstance(value, dict):
        raise field_error(
            "arguments_json",
            "ARGUMENTS_NOT_OBJECT",
            f"arguments_json must be a JSON object of the tool's parameters, got {_json_type(value)}",
            domain=DOMAIN,
        )
    return value


# Arguments whose length the write behind the tool refuses with its own reason and metadata (the
# diary's NOTE_TOO_LONG, with limit and length): a value too long for its schema and wrong in no
# other way is left to that refusal, so CallTool answers what the typed RPC answers and what an
# engine is told to expect, not TOOL_ARGUMENTS_INVALID.
_OWN_LENGTH_REFUSAL = frozenset({("reflect_and_persist", "content")})


def _validate(tool: str, schema: dict[str, Any], arguments: dict[str, Any]) -> None:
    """Every violation of the tool's schema, each naming its parameter, in one INVALID_ARGUMENT."""
    properties = schema.get("properties", {})
    found: dict[tuple[str, str], None] = {}  # ordered and deduplicated
    deferred = 0  # violations left to the write's own refusal if they are all there is
    for error in sorted(Draft202012Validator(schema).iter_errors(arguments), key=lambda e: list(e.absolute_path)):
        if error.absolute_path:
            argument = str(error.absolute_path[0])
            if error.validator == "maxLength" and (tool, argument) in _OWN_LENGTH_REFUSAL:
                deferred += 1
            found[(argument, _describe(error))] = None
        elif error.validator == "required":
            for argument in error.validator_value:
                if argument not in arguments:
                    found[(argument, "is required")] = None
        elif error.validator == "additionalProperties":
            for argument in arguments:
                if argument not in properties:
                    known = ", ".join(properties) or "none"
                    found[(argument, f"is not a parameter of {tool} (its parameters: {known})")] = None
        else:
            found[("", error.message[:200])] = None
    if len(found) == deferred:
        return
    violations = [
        FieldViolation(f"arguments_json.{argument}" if argument else "arguments_json", f"{argument} {text}".strip())
        for argument, text in found
    ]
    raise InvalidArgument(
        f"{tool}: " + "; ".join(v.description for v in violations),
        reason="TOOL_ARGUMENTS_INVALID",
        domain=DOMAIN,
        violations=violations,
        metadata={"tool": tool, "arguments": ",".join(a for a, _ in found if a)},
    )


# A value's JSON type as an error names it; bool before int (a bool is an int in Python).
_JSON_TYPES: tuple[tuple[type, str], ...] = (
    (bool, "a boolean"),
    (int, "an integer"),
    (float, "a number"),
    (str, "a string"),
    (list, "an array"),
    (dict, "an object"),
)


def _json_type(value: Any) -> str:
    return next((name for kind, name in _JSON_TYPES if isinstance(value, kind)), "null")


def _shown(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "..."


_WANTED = {"integer": "an integer", "string": "a string", "number": "a number", "boolean": "a boolean"}

# Each JSON-schema keyword a tool's parameters use, as words: (its limit, the value sent) -> text.
_VIOLATIONS: dict[str, Callable[[Any, Any], str]] = {
    "type": lambda limit, value: f"must be {_WANTED.get(limit, limit)}, got {_json_type(value)}",
    "maxLength": lambda limit, value: f"is {len(value)} characters; the limit is {limit}",
    "minLength": lambda limit, _: "must not be empty" if limit == 1 else f"must be at least {limit} characters",
    "minimum": lambda limit, value: f"must be at least {limit}, got {_shown(value)}",
    "maximum": lambda limit, value: f"must be at most {limit}, got {_shown(value)}",
    "enum": lambda limit, value: f"must be one of {', '.join(str(v) for v in limit)}, got {_shown(value)}",
}


def _describe(error: Any) -> str:
    """One violation in words a model can act on (never the validator's Python repr of the value)."""
    kind = error.validator
    words = _VIOLATIONS.get(kind)
    return words(error.validator_value, error.instance) if words else f"is not valid ({kind})"


def _typed_request(method: Any, arguments: dict[str, Any], request: pb.CallToolRequest) -> Any:
    """The typed request: the arguments by field name, then the turn's fields the request has."""
    from google.protobuf import message_factory

    typed = message_factory.GetMessageClass(method.input_type)()
    try:
        json_format.ParseDict(arguments, typed)
    except json_format.ParseError as err:  # the schema let through what the field cannot hold
        raise field_error(
            "arguments_json", "TOOL_ARGUMENTS_INVALID", f"{request.name}: {err}"[:500], domain=DOMAIN
        ) from None
    fields = typed.DESCRIPTOR.fields_by_name
    for field in TOOL_CONTEXT_FIELDS:
        if field not in fields:
            continue
        value = getattr(request, field)
        # typed is built from a descriptor at run time (a plain Message to the checker), and a
        # repeated field is extended, not assigned.
        if field in ("senders", "unit_chain"):
            getattr(typed, field).extend(value)
        else:
            setattr(typed, field, value)
    return typed


def _rename_fields(err: AgentLearnError, arguments: set[str]) -> None:
    """A typed refusal names the typed request's field; the caller wrote it in arguments_json."""

    def renamed(field: str) -> str:
        head = re.split(r"[.\[]", field, maxsplit=1)[0]
        return f"arguments_json.{field}" if head in arguments else field

    err.violations = [FieldViolation(renamed(v.field), v.description) for v in err.violations]
    if "field" in err.metadata:
        err.metadata["field"] = renamed(err.metadata["field"])


# ------------------------------------------------------------------------------------ deprecated strings

_TIERS = {diary_pb.NOTE_TIER_LONG: "long", diary_pb.NOTE_TIER_SHORT: "short"}
_OUTCOMES = {
    ep_pb.TURN_OUTCOME_DONE: "done",
    ep_pb.TURN_OUTCOME_FAILED: "failed",
    ep_pb.TURN_OUTCOME_SELF_ITERATE: "self_iterate",
    ep_pb.TURN_OUTCOME_SKIPPED: "skipped",
}


_E = TypeVar("_E", bound=int)  # a proto enum: an int subclass per enum type


def _either(
    enum_value: _E, enum_field: str, names: Mapping[_E, str], enum_type: Any, legacy: str, legacy_field: str
) -> str:
    """The value the builtin reads: the enum when set, else the deprecated string (still honoured).
    Both set and naming different values is refused, naming both fields."""
    if not enum_value:
        return legacy
    chosen = names.get(enum_value)
    if chosen is None:
        raise field_error(
            enum_field,
            "FIELD_INVALID",
            f"{enum_field} {enum_value} is not one of {', '.join(enum_type.Name(v) for v in names)}",
            domain=DOMAIN,
            value=enum_value,
        )
    if legacy.strip() and legacy.strip().lower() != chosen:
        message = (
            f"{legacy_field} {legacy.strip()[:100]!r} and {enum_field} {enum_type.Name(enum_value)} disagree; "
            f"set {enum_field} alone ({legacy_field} is deprecated)"
        )
        raise InvalidArgument(
            message,
            reason="FIELD_CONFLICT",
            domain=DOMAIN,
            violations=[FieldViolation(legacy_field, message), FieldViolation(enum_field, message)],
            metadata={legacy_field: legacy.strip()[:100], enum_field: enum_type.Name(enum_value)},
        )
    return chosen


def tier_of(request: pb.ReflectAndPersistRequest) -> str:
    """ReflectAndPersist's tier as the builtin reads it ("long", "short", or "" for the default)."""
    return _either(request.note_tier, "note_tier", _TIERS, diary_pb.NoteTier, request.tier, "tier")


def outcome_filter_of(request: pb.QueryEpisodesRequest) -> str:
    """QueryEpisodes' outcome filter as the builtin reads it ("" for any)."""
    return _either(request.outcome, "outcome", _OUTCOMES, ep_pb.TurnOutcome, request.outcome_filter, "outcome_filter")
