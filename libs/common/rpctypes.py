"""Type names shared by the gRPC servicers.

mypy-protobuf types each servicer method's context as `ServicerContext[Request, Awaitable[Response]]`.
A handler only reads metadata, aborts or sets trailers through it, never the two type parameters, so
the servicers take this one alias: `Any` there matches every generated signature without restating
each method's message types a second time.
"""

from __future__ import annotations

from typing import Any, TypeAlias

import grpc.aio

__all__ = ["ServicerContext"]

ServicerContext: TypeAlias = grpc.aio.ServicerContext[Any, Any]
