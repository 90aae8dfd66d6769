"""A property/fuzz suite over every RPC of every registered service.

Messages are generated from each RPC's request descriptor (Hypothesis): plausible values mixed
with hostile ones (NUL, 10,000-character strings, undefined enum values, int32 extremes, lists past
their limits, timestamps outside years 1–9999 or with negative nanos, forged page tokens). They go
to the real services on a loopback port with real PostgreSQL and the real embedding model. The
properties: nothing answers INTERNAL or UNKNOWN, every answer arrives, every refusal carries an
ErrorInfo, and every INVALID_ARGUMENT names at least one field in its BadRequest.

The RPCs are discovered from the servicers the runner registers, so a new RPC is fuzzed without
touching this file; a server-streaming one (ExportSeat) is read to its end, so a failure mid-stream
is judged too. Bounded for CI: a few derandomized examples per RPC.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import threading
import uuid
from typing import Any

import grpc
import pytest
from buf.validate import validate_pb2
from google.protobuf import descriptor_pool, message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from grpc_status import rpc_status
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from libs.common.clock import ManualClock
from libs.common.vectorindex.qdrant_client_index import QdrantClientIndex
from tests.support.app import open_app
from tests.support.grpc_errors import error_info

EXAMPLES_PER_RPC = 30
CALL_TIMEOUT = 30.0

F = FieldDescriptor
_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)

# Values a caller plausibly sends, so calls reach past the contract into the use cases.
_IDENTS = ["acme", "ana", "bob", "eng", "slack", "r1", "ops/team-1", "x@y"]
_HOSTILE = [
    "",
    " ",
    "a\x00b",
    "x" * 201,
    "y" * 257,
    "z" * 10_000,
    "line\nbreak",
    "é" * 300,
    "../../etc/passwd",
    "'; DROP TABLE episodes; --",
    "%s %d {0}",
]


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _crafted_token(cursor: dict[str, Any], mac: str = "") -> str:
    body = _b64(json.dumps({"c": cursor, "f": "000000000000"}).encode())
    return f"{body}.{mac}" if mac else body


# Cursors an attacker would write: a time that overflows on its way to UTC, NUL inside an id or a
# name, a version past int32, the wrong types; signed or not, none may reach the store.
_TOKENS = [
    _crafted_token({"t": "9999-12-31T23:59:59.999999-23:59", "id": str(uuid.uuid4())}),
    _crafted_token({"t": "0001-01-01T00:00:00+23:59", "id": str(uuid.uuid4())}),
    _crafted_token({"t": "2024-01-01T00:00:00+00:00", "id": "a\x00b"}),
    _crafted_token({"name": "a\x00b"}),
    _crafted_token({"v": 2**31}),
    _crafted_token({"v": 2**70}),
    _crafted_token({"company": ["x"], "seat": {"y": 1}}),
    _crafted_token({"v": 3}, mac="AAAAAAAAAAAAAAAAAAAAAA"),
    "not-a-token",
    "....",
    "x" * 3000,
]


def _strings(fd: FieldDescriptor) -> st.SearchStrategy[str]:
    options: list[st.SearchStrategy[str]] = [
        st.sampled_from(_IDENTS),
        st.sampled_from(_HOSTILE),
        st.uuids().map(str),
        st.text(max_size=40),
    ]
    if fd.name == "page_token":
        options.append(st.sampled_from(_TOKENS))
    return st.one_of(options)


def _scalar(fd: FieldDescriptor) -> st.SearchStrategy[Any]:
    t = fd.type
    if t == F.TYPE_STRING:
        return _strings(fd)
    if t == F.TYPE_BYTES:
        return st.binary(max_size=64)
    if t == F.TYPE_BOOL:
        return st.booleans()
    if t in (F.TYPE_FLOAT, F.TYPE_DOUBLE):
        return st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=32), st.just(0.5))
    if t == F.TYPE_ENUM:
        defined = [v.number for v in fd.enum_type.values]
        return st.one_of(st.sampled_from(defined), st.sampled_from([-1, 99, _INT32[1]]))
    if t in (F.TYPE_INT32, F.TYPE_SINT32, F.TYPE_SFIXED32):
        return st.one_of(st.sampled_from([-1, 0, 1, 5, 50, 100, 101, 500, 501, *_INT32]), st.integers(*_INT32))
    if t in (F.TYPE_INT64, F.TYPE_SINT64, F.TYPE_SFIXED64):
        return st.one_of(st.sampled_from([-1, 0, 1, *_INT64]), st.integers(*_INT64))
    if t in (F.TYPE_UINT32, F.TYPE_FIXED32):
        return st.integers(0, 2**32 - 1)
    if t in (F.TYPE_UINT64, F.TYPE_FIXED64):
        return st.integers(0, 2**64 - 1)
    raise AssertionError(f"no strategy for {fd.full_name} (type {t})")


_SECONDS = [0, 1_700_000_000, -62_135_596_800, 253_402_300_799, 253_402_300_800, -62_135_596_801, *_INT64]


def _timestamp(desc: Descriptor) -> st.SearchStrategy[Any]:
    cls = message_factory.GetMessageClass(desc)
    return st.builds(
        lambda s, n: cls(seconds=s, nanos=n),
        st.one_of(st.sampled_from(_SECONDS), st.integers(-(2**40), 2**40)),
        st.one_of(st.sampled_from([0, -1, 999_999_999, 1_000_000_000, *_INT32]), st.integers(0, 999_999_999)),
    )


def _small(fd: FieldDescriptor) -> Any:
    if fd.message_type is not None:
        return message_factory.GetMessageClass(fd.message_type)()
    if fd.type == F.TYPE_STRING:
        return "x"
    if fd.type == F.TYPE_BYTES:
        return b"x"
    if fd.type == F.TYPE_BOOL:
        return True
    if fd.type in (F.TYPE_FLOAT, F.TYPE_DOUBLE):
        return 0.5
    if fd.type == F.TYPE_ENUM:
        return fd.enum_type.values[-1].number
    return 1


# Known-good values of fields whose rule lives in a use case rather than the contract.
_PLAUSIBLE = {
    "work_item": ["native:42", "jira:OPS-7", ""],
    "tier": ["long", "short", ""],
    "outcome_filter": ["done", "failed", "self_iterate", ""],
    "role": ["eng", "ops"],
    "platform": ["slack", "jira"],
    "page_token": [""],
}


def _rules(fd: FieldDescriptor) -> Any:
    opts = fd.GetOptions()
    return opts.Extensions[validate_pb2.field] if opts.HasExtension(validate_pb2.field) else None


def _valid_scalar(fd: FieldDescriptor, rules: Any) -> st.SearchStrategy[Any]:
    """A value the field's contract accepts (so the call reaches the use case)."""
    required = rules is not None and rules.required
    kind = rules.WhichOneof("type") if rules is not None else None
    t = fd.type
    if t == F.TYPE_STRING:
        if fd.name in _PLAUSIBLE:
            return st.sampled_from([v for v in _PLAUSIBLE[fd.name] if v or not required])
        srules = rules.string if kind == "string" else None
        if srules is not None and srules.uuid:
            return st.uuids().map(str)
        if srules is not None and srules.HasField("pattern"):
            fits = [v for v in _IDENTS if re.search(srules.pattern, v)]
            return st.sampled_from(fits)
        longest = min(srules.max_len, 60) if srules is not None and srules.HasField("max_len") else 60
        return st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=longest)
    if t == F.TYPE_ENUM:
        defined = [v.number for v in fd.enum_type.values]
        return st.sampled_from([n for n in defined if n != 0] if required or fd.is_repeated else defined)
    if t in (F.TYPE_FLOAT, F.TYPE_DOUBLE):
        return st.floats(-1, 1, width=32)
    if t == F.TYPE_BOOL:
        return st.booleans()
    if t in (F.TYPE_INT32, F.TYPE_INT64, F.TYPE_SINT32, F.TYPE_SINT64, F.TYPE_UINT32, F.TYPE_UINT64):
        return st.integers(1 if required else 0, 10)
    return _scalar(fd)


def _valid_timestamp(desc: Descriptor) -> st.SearchStrategy[Any]:
    cls = message_factory.GetMessageClass(desc)
    return st.builds(lambda s, n: cls(seconds=s, nanos=n), st.integers(1_600_000_000, 1_800_000_000), st.just(0))


def _field(fd: FieldDescriptor, depth: int) -> st.SearchStrategy[Any] | None:
    """The field's value, or None to leave it unset: mostly valid, sometimes hostile."""
    rules = _rules(fd)
    if fd.message_type is not None:
        if depth >= 3:
            return None
        valid = messages(fd.message_type, depth + 1)
        hostile = messages(fd.message_type, depth + 1, hostile=True)
    else:
        item_rules = rules.repeated.items if rules is not None and rules.WhichOneof("type") == "repeated" else rules
        valid, hostile = _valid_scalar(fd, item_rules if fd.is_repeated else rules), _scalar(fd)
    if fd.is_repeated:
        # Past the 1,000-item limits with a small item: the whole message stays far below the
        # transport's 4 MiB, which refuses a larger one before any service code runs.
        valid = st.lists(valid, min_size=1 if rules is not None and rules.required else 0, max_size=3)
        hostile = st.one_of(st.lists(hostile, max_size=3), st.just([_small(fd)] * 1001))
    if rules is not None and rules.required:
        return st.one_of(valid, valid, valid, valid, hostile)
    return st.one_of(valid, valid, valid, hostile, st.none())


def messages(desc: Descriptor, depth: int = 0, *, hostile: bool = False) -> st.SearchStrategy[Any]:
    """Messages of ``desc``'s type: each field unset, valid by its contract, or hostile."""
    if desc.full_name == "google.protobuf.Timestamp":
        return _timestamp(desc) if hostile else st.one_of(_valid_timestamp(desc), _timestamp(desc))
    cls = message_factory.GetMessageClass(desc)
    fields: dict[str, st.SearchStrategy[Any]] = {}
    for fd in desc.fields:
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            continue
        one = _field(fd, depth)
        if one is not None:
            fields[fd.name] = one

    def build(values: dict[str, Any]) -> Any:
        msg = cls()
        for name, value in values.items():
            if value is None:
                continue
            fd = desc.fields_by_name[name]
            if fd.is_repeated:
                target = getattr(msg, name)
                if fd.message_type is not None:
                    for item in value:
                        target.add().CopyFrom(item)
                else:
                    target.extend(value)
            elif fd.message_type is not None:
                getattr(msg, name).CopyFrom(value)
            else:
                setattr(msg, name, value)
        return msg

    return st.fixed_dictionaries(fields).map(build)


class _Services:
    """Every registered service on one loopback port, in a thread with its own event loop (the
    property runs synchronously, so Hypothesis can drive it)."""

    def __init__(self, settings: Any, dsn: str, embedder: Any) -> None:
        self._settings, self._dsn, self._embedder = settings, dsn, embedder
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self.port = 0
        self.services: list[str] = []
        self._thread = threading.Thread(target=self._run, name="fuzz-services", daemon=True)

    def _run(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            index = QdrantClientIndex.local()
            try:
                async with open_app(
                    self._settings, self._dsn, clock=ManualClock(), embedder=self._embedder, index=index
                ) as app:
                    self.port = app.port
                    self.services = [r.service_name for c in app.components.values() for r in c.registrations]
                    self._ready.set()
                    await self._stop.wait()
            finally:
                await index.close()

        try:
            asyncio.run(main())
        except BaseException as exc:
            self._error = exc
            self._ready.set()

    def __enter__(self) -> _Services:
        self._thread.start()
        if not self._ready.wait(60) or self._error is not None:
            raise RuntimeError(f"services did not start: {self._error!r}")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(60)


def _methods(service_names: list[str]) -> list[tuple[str, Descriptor, Any, bool]]:
    """Every RPC to fuzz: its path, request type, response class, and whether it streams its
    answers (server-streaming; no RPC here takes a stream)."""
    pool = descriptor_pool.Default()
    out = []
    for name in service_names:
        service = pool.FindServiceByName(name)
        for method in service.methods:
            assert not method.client_streaming, f"{name}/{method.name}: a client-streaming RPC is not fuzzed yet"
            out.append(
                (
                    f"/{name}/{method.name}",
                    method.input_type,
                    message_factory.GetMessageClass(method.output_type),
                    method.server_streaming,
                )
            )
    return out


def _judge(path: str, request: Any, err: grpc.RpcError) -> str | None:
    """What is wrong with a failed call's answer, or None when it is a proper refusal."""
    if rpc_status.from_call(err) is None:
        return f"{path}: {err.code().name} without a rich status ({err.details()!r})"
    code, info, bad = error_info(err)
    if code in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN):
        return f"{path}: {code.name} {err.details()!r}"
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"{path}: no answer within {CALL_TIMEOUT}s"
    if info is None:
        return f"{path}: {code.name} without ErrorInfo ({err.details()!r})"
    if code == grpc.StatusCode.INVALID_ARGUMENT and (bad is None or not bad.field_violations):
        return f"{path}: INVALID_ARGUMENT {info.reason} names no field"
    return None


def _drained(stream: Any) -> Any:
    """A server-streaming call as a unary one: every answer read, so a failure mid-stream raises."""

    def call(request: Any, timeout: float) -> list[Any]:
        return list(stream(request, timeout=timeout))

    return call


def _property(call: Any, path: str, request_type: Descriptor) -> Any:
    @settings(
        max_examples=EXAMPLES_PER_RPC,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(messages(request_type))
    def prop(request: Any) -> None:
        try:
            call(request, timeout=CALL_TIMEOUT)
        except grpc.RpcError as err:
            problem = _judge(path, request, err)
            assert problem is None, f"{problem}\nrequest: {str(request)[:1500]}"

    return prop


def test_every_rpc_answers_every_generated_request_with_a_callers_error_at_worst(make_settings, dsn, local_embedder):
    """Zero INTERNAL/UNKNOWN over every RPC; every refusal rich and naming its field."""
    problems: list[str] = []
    with _Services(make_settings(), dsn, local_embedder) as services:
        methods = _methods(services.services)
        # Every service the runner registers is fuzzed, each with all its RPCs, streaming ones too.
        assert {p.split("/")[1] for p, _, _, _ in methods} == set(services.services)
        assert len(methods) >= 45 and any(streams for _, _, _, streams in methods)
        with grpc.insecure_channel(f"127.0.0.1:{services.port}") as channel:
            for path, request_type, response_cls, streams in methods:
                call = (channel.unary_stream if streams else channel.unary_unary)(
                    path,
                    request_serializer=lambda m: m.SerializeToString(),
                    response_deserializer=response_cls.FromString,
                )
                if streams:
                    call = _drained(call)

                prop = _property(call, path, request_type)
                try:
                    prop()
                except Exception as exc:  # the example that broke a property, kept short
                    problems.append(f"{type(exc).__name__}: {str(exc)[:2000]}")
    assert problems == [], "\n\n".join(problems)


@pytest.mark.parametrize("token", _TOKENS, ids=range(len(_TOKENS)))
def test_crafted_page_tokens_are_refused_as_the_callers(token):
    """The same forged tokens, straight through the decoder every listing uses."""
    from libs.common.errors import InvalidArgument
    from libs.common.validation import decode_page_token, decode_time_cursor

    with pytest.raises(InvalidArgument) as exc:
        decode_time_cursor(token, {"company": "acme"}, domain="d", id_type=uuid.UUID)
    assert exc.value.reason == "PAGE_TOKEN_INVALID" and exc.value.violations[0].field == "page_token"
    with pytest.raises(InvalidArgument):
        decode_page_token(token, {"company": "acme"}, domain="d")
