"""One error root for every service; subclasses mirror gRPC status codes.

A use case raises these; one server interceptor (``libs.common.grpcserver``) turns them into a
``google.rpc.Status`` carrying ``ErrorInfo`` (reason, domain, metadata) and, for a caller's bad
field, ``BadRequest.FieldViolation``. Anything else that escapes is a bug and becomes INTERNAL;
a caller's mistake never does.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Self

import grpc

__all__ = [
    "AgentLearnError",
    "AlreadyExists",
    "FailedPrecondition",
    "FieldViolation",
    "InvalidArgument",
    "InvalidFields",
    "NotFound",
    "PermissionDenied",
    "ResourceExhausted",
    "Unauthenticated",
    "Unavailable",
    "field_error",
]


@dataclass(frozen=True)
class FieldViolation:
    field: str
    description: str


class AgentLearnError(Exception):
    """Root of every error a service reports on purpose."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL

    def __init__(
        self,
        message: str,
        *,
        reason: str,
        domain: str = "agentlearn.dev",
        metadata: dict[str, object] | None = None,
        field: str | None = None,
        violations: list[FieldViolation] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason
        self.domain = domain
        # AIP-193: values quoted in the message also sit in metadata, as strings.
        self.metadata = {k: str(v) for k, v in (metadata or {}).items()}
        self.violations = list(violations or [])
        if field is not None:
            self.violations.insert(0, FieldViolation(field, message))
            self.metadata.setdefault("field", field)

    @classmethod
    def of_field(cls, field: str, reason: str, message: str, /, *, domain: str, **metadata: object) -> Self:
        """The refusal of one request field: this status with ``reason``, a FieldViolation naming
        ``field``, and ``metadata`` (the value, the limit, ...) beside the message that quotes them.
        Every use case words a bad field through here, whatever its status (a stale revision is
        FAILED_PRECONDITION, a name taken ALREADY_EXISTS)."""
        return cls(message, reason=reason, domain=domain, field=field, metadata=metadata)

    def __str__(self) -> str:
        return f"{self.code.name} {self.reason}: {self.message}"


class InvalidArgument(AgentLearnError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(AgentLearnError):
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(AgentLearnError):
    code = grpc.StatusCode.ALREADY_EXISTS


class FailedPrecondition(AgentLearnError):
    code = grpc.StatusCode.FAILED_PRECONDITION


def request_id_reused(request_id: str, message: str, *, domain: str, **metadata: object) -> FailedPrecondition:
    """An idempotency key reused for a different request (AIP-155): FAILED_PRECONDITION
    REQUEST_ID_REUSED naming ``request_id``, whichever owner keeps the key (diary notes, skill
    versions, erasures); ``message`` says what the key made before."""
    return FailedPrecondition.of_field(
        "request_id", "REQUEST_ID_REUSED", message, domain=domain, request_id=request_id, **metadata
    )


class PermissionDenied(AgentLearnError):
    code = grpc.StatusCode.PERMISSION_DENIED


class ResourceExhausted(AgentLearnError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unauthenticated(AgentLearnError):
    code = grpc.StatusCode.UNAUTHENTICATED


class Unavailable(AgentLearnError):
    code = grpc.StatusCode.UNAVAILABLE


field_error = InvalidArgument.of_field
"""The refusal of one request field (INVALID_ARGUMENT): ``field_error(field, reason, message,
domain=..., **metadata)``, see :meth:`AgentLearnError.of_field`."""


class InvalidFields:
    """Collects a request's bad fields so the caller hears of every one at once (docs/integrating.md,
    "Errors"), not one per round trip. Each check runs in its own ``with found.check():`` block (an
    :class:`InvalidArgument` it raises is kept and the next check runs), or hands its refusal to
    :meth:`add`. :meth:`raise_any` then raises:

    - nothing, when every check passed;
    - the one refusal unchanged, when one field is bad (its reason, message and metadata are what
      engines and tests match on, so a single violation answers as it did before);
    - one INVALID_ARGUMENT for several, built the way the edge's contract refusal is
      (``libs.common.contract.refusal``): the first violation's reason and metadata, ``violations``
      (the count), ``fields`` (every path) and ``reasons`` (when they differ) in metadata, and every
      field in the BadRequest, a description whose reason differs from the first's prefixed with it.

    Only INVALID_ARGUMENT is collected: any other refusal (a stale revision, a missing row) is
    about the request as a whole and propagates at once."""

    MAX_KEPT = 100
    """Refusals kept (the rest are counted as ``100+``): a list of 10,000 bad items costs no more
    to refuse than one of 100, as at the edge (``libs.common.contract.MAX_COLLECTED``)."""

    def __init__(self) -> None:
        self.errors: list[InvalidArgument] = []

    @contextmanager
    def check(self) -> Iterator[None]:
        try:
            yield
        except InvalidArgument as err:
            self.add(err)

    def add(self, err: InvalidArgument) -> None:
        """Keep a refusal a check built itself (``found.add(field_error(...))``)."""
        if len(self.errors) < self.MAX_KEPT:
            self.errors.append(err)

    def raise_any(self) -> None:
        if not self.errors:
            return
        first = self.errors[0]
        if len(self.errors) == 1:
            raise first
        shown: list[FieldViolation] = []
        reasons: list[str] = []
        for err in self.errors:
            reasons.append(err.reason)
            same = err.reason == first.reason
            for v in err.violations:
                shown.append(FieldViolation(v.field, v.description if same else f"{err.reason}: {v.description}"))
        count = f"{len(self.errors)}+" if len(self.errors) >= self.MAX_KEPT else str(len(self.errors))
        message = f"{count} violations: " + "; ".join(err.message for err in self.errors[:3])
        if len(self.errors) > 3:
            message += "; and more (see the BadRequest)"
        metadata: dict[str, object] = {"violations": count}
        paths = ",".join(dict.fromkeys(v.field for v in shown))
        metadata["fields"] = paths if len(paths) <= 96 else paths[:93] + "..."
        distinct = ",".join(dict.fromkeys(reasons))
        if distinct != first.reason:
            metadata["reasons"] = distinct
        # The first violation's own facts (field, value, limit...) after the summary: a status
        # keeps only its first metadata keys (libs.common.grpcserver), and the summary matters more.
        metadata.update({k: v for k, v in first.metadata.items() if k not in metadata})
        if "field" in first.metadata:
            metadata = {"field": first.metadata["field"], **metadata}
        raise InvalidArgument(message, reason=first.reason, domain=first.domain, metadata=metadata, violations=shown)
