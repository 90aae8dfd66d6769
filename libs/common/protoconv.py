"""Protobuf conversions every servicer shares: timestamps, and a caller's precomputed query vector
(checked, since a vector with no direction or the wrong width is a caller's mistake)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

from agentlearn.common.v1 import embedding_pb2
from libs.common.embeddings import Vector
from libs.common.errors import InvalidArgument

__all__ = ["query_vector", "timestamp", "timestamp_fields", "timestamp_value", "when"]


def timestamp(value: datetime | None) -> Timestamp | None:
    """A datetime as a Timestamp (None stays unset)."""
    if value is None:
        return None
    return Timestamp(**timestamp_fields(value))


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_SECONDS_MIN, _SECONDS_MAX = -62135596800, 253402300799  # Timestamp's range: 0001-01-01 .. 9999-12-31


def timestamp_fields(value: datetime) -> dict[str, int]:
    """``value``'s Timestamp as the ``{"seconds", "nanos"}`` a message's constructor takes for it:
    what ``Timestamp.FromDatetime`` gives, worked out in integers for an aware datetime (a turn
    start converts ~235; ``FromDatetime`` goes through ``utctimetuple`` and ``calendar.timegm``).
    Anything else (naive, an offset with microseconds, a subclass, a date at the range's edge) goes
    through ``FromDatetime`` itself, so the answer, or the error, is the same."""
    if value.__class__ is datetime:
        # UTC (what the database and the clock give) cannot spill past the range; another offset
        # can only at the range's first and last year, left to FromDatetime.
        if value.tzinfo is UTC or (
            1 < value.year < 9999 and (offset := value.utcoffset()) is not None and not offset.microseconds
        ):
            delta = value - _EPOCH
            return {"seconds": delta.days * 86400 + delta.seconds, "nanos": value.microsecond * 1000}
    ts = Timestamp()
    ts.FromDatetime(value)
    return {"seconds": ts.seconds, "nanos": ts.nanos}


def when(msg: Message, field: str) -> datetime | None:
    """A Timestamp field as an aware datetime, or None when it is unset."""
    if not msg.HasField(field):
        return None
    return timestamp_value(getattr(msg, field))


def timestamp_value(ts: Timestamp) -> datetime:
    """``ts.ToDatetime(tzinfo=UTC)``, without its checks and time-zone conversion for a valid
    Timestamp (an invalid one goes through it, to raise as it does)."""
    seconds, nanos = ts.seconds, ts.nanos
    if 0 <= nanos < 1_000_000_000 and _SECONDS_MIN <= seconds <= _SECONDS_MAX:
        return _EPOCH + timedelta(seconds=seconds, microseconds=nanos // 1000)
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
