"""The google.rpc details a refusal carries (ErrorInfo, BadRequest), read off a failed call once.

Every caller that explains another service's refusal (the inspector's error page, the MCP server's
error text, a prefetch builtin passing the refusal through) read the status the same way: parse it,
tolerate a malformed one, and pick out the two details our services send (docs/errors.md). Here once.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

__all__ = ["StatusDetails", "status_details"]


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
