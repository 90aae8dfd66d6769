"""The translation of a downstream refusal into our own error root so it passes through unchanged.

A builtin that calls another service answers the caller with that service's own status: the
diary's ``INVALID_ARGUMENT NOTE_TOO_LONG`` (its ErrorInfo reason, domain and metadata, and its
BadRequest field) reaches the engine exactly as the diary sent it.
"""

from __future__ import annotations

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from libs.common.errors import AgentLearnError, FieldViolation
from services.prefetch.domain import DOMAIN

__all__ = ["passthrough", "rpc_failure"]


def rpc_failure(service: str, err: BaseException) -> str:
    """A short account of a failed read for the summary: ``"diary: UNAVAILABLE"``."""
    if isinstance(err, grpc.aio.AioRpcError):
        return f"{service}: {err.code().name}"
    if isinstance(err, TimeoutError):
        return f"{service}: DEADLINE_EXCEEDED"
    return f"{service}: {type(err).__name__}"


def passthrough(service: str, err: grpc.aio.AioRpcError) -> AgentLearnError:
    """The downstream status as our error root, keeping its code, reason, domain, metadata and
    field violations. A status with no ErrorInfo (the service was not reached at all) is reported
    under our domain as ``<SERVICE>_<CODE>``."""
    info, bad = None, None
    try:
        status = rpc_status.from_call(err)
    except ValueError:
        status = None
    for detail in status.details if status is not None else []:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
        elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
    code = err.code()
    if info is not None:
        exc = AgentLearnError(
            err.details() or code.name,
            reason=info.reason,
            domain=info.domain,
            metadata=dict(info.metadata),
            violations=[FieldViolation(v.field, v.description) for v in bad.field_violations] if bad else None,
        )
    else:
        exc = AgentLearnError(
            f"the {service} service did not answer: {code.name} {err.details() or ''}".strip(),
            reason=f"{service.upper()}_{code.name}",
            domain=DOMAIN,
            metadata={"service": service, "code": code.name},
        )
    exc.code = code  # the instance mirrors the downstream code (the class default is INTERNAL)
    return exc
