"""Protobuf conversions every servicer shares: timestamps, and a caller's precomputed query vector
(checked, since a vector with no direction or the wrong width is a caller's mistake)."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

from agentlearn.common.v1 import embedding_pb2
from libs.common.embeddings import Vector
from libs.common.errors import InvalidArgument

__all__ = ["query_vector", "timestamp", "when"]


def timestamp(value: datetime | None) -> Timestamp | None:
    """A datetime as a Timestamp (None stays unset)."""
    if value is None:
        return None
    ts = Timestamp()
    ts.FromDatetime(value)
    return ts


def when(msg: Message, field: str) -> datetime | None:
    """A Timestamp field as an aware datetime, or None when it is unset."""
    if not msg.HasField(field):
        return None
    ts: Timestamp = getattr(msg, field)
    return ts.ToDatetime(tzinfo=UTC)


def query_vector(msg: embedding_pb2.Embedding, *, domain: str, field: str = "query_embedding") -> Vector | None:
    """The caller's vector of its query (embedded once per turn and shared), or None when absent."""
    if not msg.values:
        return None
    values = np.asarray(msg.values, dtype=np.float32)
    if not msg.model:
        raise InvalidArgument(
            f"{field}.model is required with {field}.values",
            reason="FIELD_REQUIRED",
            domain=domain,
            field=f"{field}.model",
        )
    if msg.dimensions and msg.dimensions != values.shape[0]:
        raise InvalidArgument(
            f"{field} has {values.shape[0]} values but says dimensions {msg.dimensions}",
            reason="FIELD_INVALID",
            domain=domain,
            field=f"{field}.dimensions",
            metadata={"values": values.shape[0], "dimensions": msg.dimensions},
        )
    if not np.all(np.isfinite(values)) or not np.any(values):
        raise InvalidArgument(
            f"{field} has no direction (all zeros or not finite)",
            reason="VECTOR_UNUSABLE",
            domain=domain,
            field=f"{field}.values",
        )
    return Vector(values, msg.model)
