"""Reading the rich status of a failed call."""

from __future__ import annotations

from grpc_status import rpc_status

from libs.common.status_details import status_details

__all__ = ["error_info"]


def error_info(err) -> tuple:  # type: ignore[no-untyped-def]
    """(code, ErrorInfo, BadRequest|None) of a grpc.aio.AioRpcError, its details read as the
    services read one another's refusals (``libs.common.status_details``). The call must carry a
    rich status that parses, as every refusal of ours does (a mismatched one raises ValueError)."""
    assert rpc_status.from_call(err) is not None, f"{err.code()} carries no rich status: {err.details()}"
    details = status_details(err)
    return err.code(), details.info, details.bad
