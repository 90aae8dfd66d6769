"""OpenTelemetry: one tracer provider per process; OTLP export only when configured.

A server interceptor spans every RPC and continues the caller's trace from the request metadata;
the client interceptors put the current context on every outgoing call, so a trace follows a turn
from ``SubmitTurn`` through every worker RPC. Exporting is off by default; set
``telemetry.otlp_endpoint`` to send spans to a collector.
"""

from __future__ import annotations

import logging
from typing import Any

import grpc
from opentelemetry import propagate, trace
from opentelemetry.instrumentation.grpc import aio_client_interceptors, aio_server_interceptor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanProcessor

from libs.common.config import TelemetryConfig

__all__ = [
    "client_interceptors",
    "configure_tracing",
    "inject_context",
    "restore_context",
    "server_interceptor",
    "tracer",
]

_log = logging.getLogger(__name__)
_provider: TracerProvider | None = None


def configure_tracing(config: TelemetryConfig, *, extra_processors: list[SpanProcessor] | None = None) -> None:
    """Install the process's tracer provider once; later calls only add processors."""
    global _provider
    if _provider is None:
        _provider = TracerProvider(resource=Resource.create({"service.name": config.service_name}))
        if config.otlp_endpoint:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

            _provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=config.otlp_endpoint)))
            _log.info("exporting spans to %s", config.otlp_endpoint)
        trace.set_tracer_provider(_provider)
    for processor in extra_processors or []:
        _provider.add_span_processor(processor)


def tracer(name: str) -> trace.Tracer:
    return trace.get_tracer(name)


def server_interceptor() -> grpc.aio.ServerInterceptor:
    return aio_server_interceptor()


def client_interceptors() -> list[Any]:
    return list(aio_client_interceptors())


def inject_context() -> dict[str, str]:
    """The current trace context as a carrier, to store beside a queued job."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


def restore_context(carrier: dict[str, str] | None) -> Any:
    """A context continuing the trace stored with a job (or the current one when none was)."""
    return propagate.extract(carrier or {})
