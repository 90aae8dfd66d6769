"""A one-shot pass process (``./run pass NAME``, a CronJob pod's whole life) serves nothing: its
spans and metrics can leave it only by OTLP, so with no export configured it installs no
OpenTelemetry SDK (nor psutil, which the SDK's resources import, nor the Prometheus reader nobody
could scrape), and with export configured it installs exactly the exporting providers. What is
checked is what got imported and installed; no timing."""

from __future__ import annotations

import asyncio
import subprocess
import sys

from tests.support.runner import ROOT, clean_env, run_once

# Runs the real entry point (services/runner/__main__.py) and prints, from an exit hook (a pass
# ends in quick_exit, which runs the exit hooks), the modules the process imported.
_PASS_WITH_MODULES = """
import atexit, runpy, sys
atexit.register(lambda: print("MODULES " + " ".join(sorted(sys.modules)), flush=True))
sys.argv = ["services.runner", *sys.argv[1:]]
runpy.run_module("services.runner", run_name="__main__", alter_sys=True)
"""

_NEVER_IN_A_QUIET_PASS = (
    "opentelemetry.sdk.trace",
    "opentelemetry.sdk.metrics",
    "opentelemetry.sdk.resources",
    "opentelemetry.exporter.prometheus",
    "prometheus_client",
    "psutil",
    "opentelemetry.instrumentation.grpc",
    "onnxruntime",
)


def _without_otel(extra: dict[str, str]) -> dict[str, str]:
    """A clean environment with no OpenTelemetry variable of this shell, plus ``extra``."""
    return {**{k: v for k, v in clean_env().items() if not k.startswith("OTEL_")}, **extra}


def _run_pass(dsn: str, data_dir: str) -> subprocess.CompletedProcess[str]:
    env = _without_otel({"DATABASE_URL": dsn})
    return run_once("pass", "diary-fill", data_dir=data_dir, env=env, entry=("-c", _PASS_WITH_MODULES))


async def test_a_pass_that_exports_nothing_loads_no_telemetry_sdk_and_still_reports(dsn, tmp_path):
    done = await asyncio.to_thread(_run_pass, dsn, str(tmp_path / "data"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "pass diary-fill: {'indexed': 0" in done.stdout  # the pass ran, took its lease, reported
    [line] = [x for x in done.stdout.splitlines() if x.startswith("MODULES ")]
    modules = set(line.split()[1:])
    assert "libs.common.telemetry" in modules  # the check sees the process's imports
    assert not modules & set(_NEVER_IN_A_QUIET_PASS), sorted(modules & set(_NEVER_IN_A_QUIET_PASS))


_CONFIGURE = """
import os
from opentelemetry import metrics, trace
from libs.common import telemetry
from libs.common.config import TelemetryConfig
telemetry.configure_export_only(TelemetryConfig())
tp, mp = trace.get_tracer_provider(), metrics.get_meter_provider()
readers = [type(r).__name__ for r in mp._metric_readers] if hasattr(mp, "_metric_readers") else None
print(type(tp).__name__, type(mp).__name__, readers, flush=True)
os._exit(0)  # no exit-time export to the (absent) collector
"""


def _configure(env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-c", _CONFIGURE], cwd=ROOT, env=_without_otel(env), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def test_a_pass_exports_by_otlp_what_is_configured_and_nothing_else():
    # Nothing configured: the API's no-op (proxy) providers, nothing recorded.
    assert _configure({}) == "ProxyTracerProvider _ProxyMeterProvider None"
    # Both signals exported: the SDK providers, metrics read only by the OTLP exporter.
    both = _configure({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"})
    assert both == "TracerProvider MeterProvider ['PeriodicExportingMetricReader']", both
    # Only traces exported: no meter provider.
    traces = _configure({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:1"})
    assert traces == "TracerProvider _ProxyMeterProvider None", traces
    # The SDK switched off: nothing, even with an endpoint.
    off = _configure({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_SDK_DISABLED": "true"})
    assert off == "ProxyTracerProvider _ProxyMeterProvider None", off
