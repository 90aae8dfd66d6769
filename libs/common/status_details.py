"""The google.rpc details a refusal carries (ErrorInfo, BadRequest), read off a failed call once.

Every caller that explains another service's refusal (the inspector's error page, the MCP server's
error text, a prefetch builtin or any handler passing the refusal through) read the status the same
way: parse it, tolerate a malformed one, and pick out the two details our services send
(docs/errors.md). Here once.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from libs.common.errors import AgentLearnError, FieldViolation

__all__ = ["StatusDetails", "passthrough", "status_details"]


@dataclass(frozen=True)
class StatusDetails:
    """What a refusal said beyond its code and message; None where it did not say it."""

    info: error_details_pb2.ErrorInfo | None = None
    bad: error_details_pb2.BadRequest | None = None

    @property
    def first_field(self) -> str:
        """The first field the refusal names ("" for none)."""
        return self.bad.field_violations[0].field if self.bad and self.bad.field_violations else ""


def status_details(err: grpc.aio.AioRpcError) -> StatusDetails:
    """The ErrorInfo and BadRequest of ``err``'s rich status; both None when it has none, or one
    that does not parse (a status that disagrees with its call's code)."""
    try:
        status = rpc_status.from_call(err)  # type: ignore[arg-type]  # typed for grpc.Call; reads only what AioRpcError has
    except ValueError:
        status = None
    info, bad = None, None
    for detail in status.details if status is not None else []:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
        elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
    return StatusDetails(info, bad)


def passthrough(err: grpc.aio.AioRpcError, *, domain: str, service: str = "") -> AgentLearnError:
    """A downstream refusal as our error root, so it reaches our caller as the downstream sent it:
    its code, ErrorInfo reason, domain and metadata, and its BadRequest field violations. A status
    with no ErrorInfo (the service was not reached at all, or its deadline passed) is reported under
    ``domain`` as ``<SERVICE>_<CODE>`` (``DOWNSTREAM_<CODE>`` when ``service`` is not named), its
    code kept."""
    said = status_details(err)
    info, bad = said.info, said.bad
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
        label = service or "downstream"
        exc = AgentLearnError(
            f"the {label} service did not answer: {code.name} {err.details() or ''}".strip(),
            reason=f"{label.upper()}_{code.name}",
            domain=domain,
            metadata={"service": service, "code": code.name} if service else {"code": code.name},
        )
    exc.code = code  # the instance mirrors the downstream code (the class default is INTERNAL)
    return exc
