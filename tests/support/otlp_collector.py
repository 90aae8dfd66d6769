"""An in-memory OTLP/gRPC trace collector for tests: the services export to it exactly as they
would to a real collector (telemetry.otlp_endpoint), and the test reads the spans back."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

__all__ = ["CollectedSpan", "OtlpCollector"]


@dataclass(frozen=True)
class CollectedSpan:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict


def _value(v) -> object:  # type: ignore[no-untyped-def]
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


class _Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, sink: list[CollectedSpan], lock: threading.Lock):
        self._sink, self._lock = sink, lock

    async def Export(self, request, context):  # type: ignore[no-untyped-def]
        spans = []
        for rs in request.resource_spans:
            service = next((_value(a.value) for a in rs.resource.attributes if a.key == "service.name"), "")
            for ss in rs.scope_spans:
                for s in ss.spans:
                    spans.append(
                        CollectedSpan(
                            service=str(service),
                            name=s.name,
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_id=s.parent_span_id.hex(),
                            attributes={a.key: _value(a.value) for a in s.attributes},
                        )
                    )
        with self._lock:
            self._sink.extend(spans)
        return trace_service_pb2.ExportTraceServiceResponse()


class OtlpCollector:
    def __init__(self) -> None:
        self._spans: list[CollectedSpan] = []
        self._lock = threading.Lock()
        self._server: grpc.aio.Server | None = None
        self.port = 0

    async def start(self) -> OtlpCollector:
        self._server = grpc.aio.server()
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_Receiver(self._spans, self._lock), self._server)
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        await self._server.start()
        return self

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def spans(self) -> list[CollectedSpan]:
        with self._lock:
            return list(self._spans)

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(None)
