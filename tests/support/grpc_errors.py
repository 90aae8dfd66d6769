"""Reading the rich status of a failed call."""

from __future__ import annotations

from google.rpc import error_details_pb2
from grpc_status import rpc_status

__all__ = ["error_info"]


def error_info(err) -> tuple:  # type: ignore[no-untyped-def]
    """(code, ErrorInfo, BadRequest|None) of a grpc.aio.AioRpcError."""

    status = rpc_status.from_call(err)
    info, bad = None, None
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
        elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
    return err.code(), info, bad
