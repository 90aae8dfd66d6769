"""In-memory OTLP trace collectors for tests, over gRPC (:class:`OtlpCollector`) and over
HTTP/protobuf (:class:`OtlpHttpCollector`): the services export to them exactly as they would to a
real collector, and the test reads the spans back."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from tests.support.loopback_http import LoopbackHTTP

__all__ = ["CollectedSpan", "OtlpCollector", "OtlpHttpCollector"]


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


def _spans_of(request: trace_service_pb2.ExportTraceServiceRequest) -> list[CollectedSpan]:
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
    return spans


class _Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, sink: list[CollectedSpan], lock: threading.Lock):
        self._sink, self._lock = sink, lock

    async def Export(self, request, context):  # type: ignore[no-untyped-def]
        spans = _spans_of(request)
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


class OtlpHttpCollector(LoopbackHTTP):
    """OTLP over HTTP/protobuf: ``POST /v1/traces`` with an ExportTraceServiceRequest body."""

    def __init__(self) -> None:
        self._spans: list[CollectedSpan] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self.paths: list[str] = []

    def start(self) -> OtlpHttpCollector:
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                collector.paths.append(self.path)
                if self.path == "/v1/traces":
                    spans = _spans_of(trace_service_pb2.ExportTraceServiceRequest.FromString(body))
                    with collector._lock:
                        collector._spans.extend(spans)
                out = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args: object) -> None:
                pass

        self.serve_in_background(Handler)
        return self

    @property
    def endpoint(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def spans(self) -> list[CollectedSpan]:
        with self._lock:
            return list(self._spans)
