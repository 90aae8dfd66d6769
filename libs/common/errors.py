"""One error root for every service; subclasses mirror gRPC status codes.

A use case raises these; one server interceptor (``libs.common.grpcserver``) turns them into a
``google.rpc.Status`` carrying ``ErrorInfo`` (reason, domain, metadata) and, for a caller's bad
field, ``BadRequest.FieldViolation``. Anything else that escapes is a bug and becomes INTERNAL;
a caller's mistake never does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Self

import grpc

__all__ = [
    "AgentLearnError",
    "AlreadyExists",
    "FailedPrecondition",
    "FieldViolation",
    "InvalidArgument",
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
