"""The pip-installable Python client: built into a wheel from a clean copy of the protos and
``clients/python`` (stubs generated at build time, none committed), installed into a fresh venv,
and run outside the repository: ``examples/python/lifecycle.py`` lives one turn against a real
server, and the reflector's episode of that turn shows what ``turn_end`` carried (the offered
skills, the times, the sender's message, the tools called).

Offline: the wheel is built with ``--no-build-isolation`` from the build tools already in .venv, and
the fresh venv reaches its runtime dependencies (grpcio, protobuf, ...) through a ``.pth`` line
naming .venv's site-packages — a line in a ``.pth`` adds a directory without running that
directory's own ``.pth`` files, so the repository (which .venv adds by one) stays out of reach,
as the test asserts."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.test_clients_support import (
    offer_skill,
    queued_reflection,
    reflected_episode,
    run_example,
    serving,
    serving_reflector,
    serving_without_reflector,
)

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:  # type: ignore[no-untyped-def]
    """A fresh venv with the client wheel installed; returns its python."""
    base = tmp_path_factory.mktemp("client")
    clean = base / "checkout"
    shutil.copytree(ROOT / "protos", clean / "protos")
    shutil.copytree(
        ROOT / "clients" / "python", clean / "clients" / "python", ignore=shutil.ignore_patterns("build", "*.egg-info")
    )
    dist = base / "dist"
    build = ["wheel", "--no-build-isolation", "--no-deps", "--no-index", "-q", "-w", str(dist)]
    subprocess.run(
        [sys.executable, "-m", "pip", *build, str(clean / "clients" / "python")],
        check=True,
        capture_output=True,
    )
    [wheel] = dist.glob("agentlearn_client-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "agentlearn/prefetch/v1/prefetch_service_pb2_grpc.py" in names
    assert "agentlearn/prefetch/v1/prefetch_service_pb2.pyi" in names and "agentlearn_client/_client.py" in names
    assert not list((ROOT / "clients" / "python").rglob("*_pb2.py")), "stubs are generated, never committed"

    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    python = venv / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-index", "--no-deps", wheel],
        check=True,
        capture_output=True,
    )
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    (Path(site) / "runtime-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def test_the_wheel_is_self_contained(installed, tmp_path):
    probe = (
        "import importlib.util, agentlearn_client, agentlearn.reflector.v1.reflector_service_pb2_grpc as r;"
        "print(agentlearn_client.__file__);"
        "print(importlib.util.find_spec('libs'), importlib.util.find_spec('services'))"
    )
    out = subprocess.run([installed, "-c", probe], cwd=tmp_path, check=True, capture_output=True, text=True).stdout
    where, repo = out.splitlines()
    assert where.startswith(str(installed.parent.parent)), where
    assert repo == "None None"  # the repository is not importable: everything came from the wheel


async def test_a_turn_lifecycle_with_the_installed_client(installed, make_settings, dsn, local_embedder, edge_index):
    async with serving(make_settings, dsn, local_embedder, edge_index) as app:
        skill = await offer_skill(app)
        program = [str(installed), str(ROOT / "examples" / "python" / "lifecycle.py")]
        text = await run_example(app, skill, program, "py-turn-1", installed.parent)
        assert "## Synthesized skills you've learned" in text and "prod-deploy-approval" in text

        episode = await reflected_episode(app, "py-turn-1")
    assert list(episode.skills_used) == [skill.id]
    assert list(episode.tools_called) == ["reflect_and_persist", "refresh_memory"]
    assert "Who approves prod deploys?" in episode.ask
    assert episode.start_time.ToDatetime() < episode.end_time.ToDatetime()
    assert episode.label == "Message from Bob: Slack message"


async def test_the_installed_client_submits_to_the_reflector_of_a_split_deployment(
    installed, make_settings, dsn, local_embedder, edge_index
):
    async with (
        serving_without_reflector(make_settings, dsn, local_embedder, edge_index) as front,
        serving_reflector(make_settings, dsn) as back,
    ):
        skill = await offer_skill(front)
        program = [str(installed), str(ROOT / "examples" / "python" / "lifecycle.py")]
        flags = ("--reflector-address", f"127.0.0.1:{back.port}")
        await run_example(front, skill, program, "py-split-1", installed.parent, *flags)
        assert await queued_reflection(back, "py-split-1")
