"""Observability by the conventions: the standard OTEL_* environment (endpoint, protocol
http/protobuf or grpc, service name, resource attributes), a service name that is not doubled,
RPC metrics in the Prometheus exposition, and JSON logs that carry the trace and span ids."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
from collections.abc import AsyncIterator

import grpc
import pytest
from opentelemetry.sdk.trace import TracerProvider

from agentlearn.diary.v1 import diary_service_pb2 as pb
from agentlearn.diary.v1 import diary_service_pb2_grpc as pb_grpc
from libs.common.config import TelemetryConfig
from libs.common.telemetry import JsonFormatter, export_settings
from tests.support.otlp_collector import OtlpHttpCollector
from tests.support.runner import clean_env, start

CONFIG = TelemetryConfig()


def test_the_standard_environment_turns_export_on_and_wins_over_the_config():
    assert export_settings(CONFIG, "traces", {}) == ("", "grpc")  # nothing configured: no export
    configured = TelemetryConfig(otlp_endpoint="http://c:4317")
    assert export_settings(configured, "traces", {}) == ("http://c:4317", "grpc")
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}
    assert export_settings(configured, "traces", env) == (None, "http/protobuf")  # the exporter reads env
    per_signal = {"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://m:4318", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "grpc"}
    assert export_settings(CONFIG, "metrics", per_signal) == (None, "grpc")
    assert export_settings(CONFIG, "traces", per_signal) == ("", "grpc")


def test_json_logs_carry_the_trace_and_span_ids():
    provider = TracerProvider()
    tracer = provider.get_tracer("t")
    record_out = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            record_out.append(JsonFormatter().format(record))

    log = logging.getLogger("agentlearn.test.json")
    log.addHandler(Capture())
    log.propagate = False
    with tracer.start_as_current_span("work") as span:
        log.warning("recall degraded for %s", "ana", extra={"company": "acme"})
        ctx = span.get_span_context()
    log.error("outside any span")
    inside, outside = (json.loads(line) for line in record_out)
    assert inside["message"] == "recall degraded for ana" and inside["level"] == "WARNING"
    assert inside["trace_id"] == format(ctx.trace_id, "032x") and inside["span_id"] == format(ctx.span_id, "016x")
    assert inside["company"] == "acme" and inside["logger"] == "agentlearn.test.json"
    assert "trace_id" not in outside


@contextlib.asynccontextmanager
async def _serving_diary(tmp_path, collector: OtlpHttpCollector, variables: dict[str, str]) -> AsyncIterator[str]:  # type: ignore[no-untyped-def]
    """``serve diary`` in a clean environment plus ``variables``, exporting within 0.2 s: its
    address. At the end the process is stopped, then the collector."""
    env = {**clean_env(), **variables, "OTEL_BSP_SCHEDULE_DELAY": "200"}
    # Its stderr is the test's (pytest shows it on a failure).
    running = await start("serve", "diary", "--port", "0", "--data-dir", str(tmp_path / "d"), env=env, stderr=None)
    try:
        yield running.address
    finally:
        running.proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            await running.proc.wait()
        collector.stop()


@pytest.mark.slow
async def test_a_service_exports_over_otlp_http_under_the_standard_service_name(tmp_path):
    """``./run serve diary`` with only the standard variables set: spans arrive at an OTLP/HTTP
    collector named by OTEL_SERVICE_NAME, with OTEL_RESOURCE_ATTRIBUTES on the resource."""
    collector = OtlpHttpCollector().start()
    variables = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_SERVICE_NAME": "memory-diary",
    }
    async with _serving_diary(tmp_path, collector, variables) as address:
        async with grpc.aio.insecure_channel(address) as channel:
            await pb_grpc.DiaryServiceStub(channel).WriteNote(
                pb.WriteNoteRequest(company="acme", seat="ana", content="Bob prefers digests", tier=pb.NOTE_TIER_LONG)
            )
        async with asyncio.timeout(30):
            while not any(s.name.endswith("WriteNote") for s in collector.spans()):
                await asyncio.sleep(0.2)
        spans = collector.spans()
        assert {s.service for s in spans} == {"memory-diary"}
        assert "/v1/traces" in collector.paths
        rpc = next(s for s in spans if s.name.endswith("WriteNote"))
        assert rpc.attributes.get("rpc.system") == "grpc"


@pytest.mark.slow
async def test_a_configured_service_name_is_not_doubled(tmp_path):
    """The Kubernetes manifests name each pod (agentlearn-diary); serve used to append the service
    again (agentlearn-diary-diary)."""
    collector = OtlpHttpCollector().start()
    variables = {
        "AGENTLEARN_TELEMETRY__SERVICE_NAME": "agentlearn-diary",
        "AGENTLEARN_TELEMETRY__OTLP_ENDPOINT": collector.endpoint,
        "AGENTLEARN_TELEMETRY__OTLP_PROTOCOL": "http/protobuf",
    }
    async with _serving_diary(tmp_path, collector, variables) as address:
        async with grpc.aio.insecure_channel(address) as channel:
            await pb_grpc.DiaryServiceStub(channel).ListNotes(pb.ListNotesRequest(company="acme", seat="ana"))
        async with asyncio.timeout(30):
            while not collector.spans():
                await asyncio.sleep(0.2)
        assert {s.service for s in collector.spans()} == {"agentlearn-diary"}


async def test_rpc_durations_and_codes_reach_the_prometheus_exposition(make_settings, dsn, clock, edge_index):
    from prometheus_client import generate_latest

    from libs.common import telemetry
    from tests.support.app import open_app

    telemetry.configure_metrics(CONFIG)
    async with open_app(make_settings(), dsn, clock=clock, names=["diary"], embedder=None, index=edge_index) as app:
        stub = pb_grpc.DiaryServiceStub(app.channel)
        await stub.ListNotes(pb.ListNotesRequest(company="acme", seat="ana"))
        with pytest.raises(grpc.aio.AioRpcError):
            await stub.GetNote(pb.GetNoteRequest(company="acme", seat="ana", note_id="nope"))
    exposition = generate_latest().decode()
    counts = [line for line in exposition.splitlines() if line.startswith("rpc_server_duration_milliseconds_count")]
    assert any('rpc_method="ListNotes"' in c and 'rpc_grpc_status_code="OK"' in c for c in counts), counts
    assert any('rpc_method="GetNote"' in c and 'rpc_grpc_status_code="INVALID_ARGUMENT"' in c for c in counts), counts
