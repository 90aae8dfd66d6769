"""The Node.js example (examples/node, @grpc/grpc-js + @grpc/proto-loader over the protos, no
generated code) lives one turn against a real server: the turn-start context with its offered
skill, a note written and found again through CallTool, a refusal decoded from its google.rpc
status (reason and every bad field), and a submitted turn whose episode carries what it sent.
Its node_modules come from its package-lock.json (``npm ci``, skipped when the lock is unchanged,
as ./run does for buf)."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
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
NODE = ROOT / "examples" / "node"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def node_modules() -> Path:
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.fail("Node.js and npm are required (the README lists them)")
    want = hashlib.sha256((NODE / "package-lock.json").read_bytes()).hexdigest()
    marker = NODE / "node_modules" / ".lock.sha256"
    if not marker.exists() or marker.read_text() != want:
        subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=NODE, check=True, capture_output=True
        )
        marker.write_text(want)
    return NODE / "node_modules"


async def test_the_node_example_lives_a_turn(node_modules, make_settings, dsn, local_embedder, edge_index):
    async with serving(make_settings, dsn, local_embedder, edge_index) as app:
        skill = await offer_skill(app)
        text = await run_example(app, skill, ["node", "lifecycle.js"], "node-turn-1", NODE)
        assert "prod-deploy-approval" in text and "tools: refresh_memory, query_episodes" in text

        episode = await reflected_episode(app, "node-turn-1")
    assert list(episode.skills_used) == [skill.id]
    assert list(episode.tools_called) == ["reflect_and_persist", "refresh_memory"]
    assert "Who approves prod deploys?" in episode.ask
    assert episode.start_time.ToDatetime() <= episode.end_time.ToDatetime()


async def test_the_node_example_submits_to_the_reflector_of_a_split_deployment(
    node_modules, make_settings, dsn, local_embedder, edge_index
):
    async with (
        serving_without_reflector(make_settings, dsn, local_embedder, edge_index) as front,
        serving_reflector(make_settings, dsn) as back,
    ):
        skill = await offer_skill(front)
        flags = ("--reflector-address", f"127.0.0.1:{back.port}")
        await run_example(front, skill, ["node", "lifecycle.js"], "node-split-1", NODE, *flags)
        assert await queued_reflection(back, "node-split-1")
