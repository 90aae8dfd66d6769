"""Rich errors: every refusal carries a ``google.rpc.Status`` with ``ErrorInfo`` (a reason a
program can branch on, its domain, metadata) and, for a bad field, ``BadRequest``."""

from __future__ import annotations

from dataclasses import dataclass, field

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

__all__ = ["ErrorDetails", "error_details"]


@dataclass(frozen=True)
class ErrorDetails:
    code: grpc.StatusCode
    message: str
    reason: str = ""
    domain: str = ""
    metadata: dict[str, str] = field(default_factory=dict)
    field_violations: list[tuple[str, str]] = field(default_factory=list)
    """(field, description) of every violated field."""
    retry_delay_seconds: float | None = None
    """From ``google.rpc.RetryInfo`` where the server says when to try again."""


def error_details(err: grpc.aio.AioRpcError | grpc.RpcError) -> ErrorDetails:
    """The status of a failed call, decoded."""
    code, message = err.code(), err.details() or ""  # type: ignore[union-attr]
    out = ErrorDetails(code, message)
    try:
        status = rpc_status.from_call(err)  # type: ignore[arg-type]
    except ValueError:
        status = None
    reason, domain, metadata, violations, delay = "", "", {}, [], None
    for detail in status.details if status is not None else []:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            reason, domain, metadata = info.reason, info.domain, dict(info.metadata)
        elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            violations = [(v.field, v.description) for v in bad.field_violations]
        elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            retry = error_details_pb2.RetryInfo()
            detail.Unpack(retry)
            delay = retry.retry_delay.ToTimedelta().total_seconds()
    if status is None:
        return out
    return ErrorDetails(code, message, reason, domain, metadata, violations, delay)
