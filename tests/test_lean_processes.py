"""A process builds only what its services or its pass need (docs/perf/analysis.md §2.5): a pass
opens its own service alone and never loads the embedding model when it has nothing to embed; a
server of services that never embed builds no embedder, and one whose service may embed loads the
model only on its first embed. No timing here: what is checked is what got built."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess

import grpc

from agentlearn.profiles.v1 import profile_service_pb2 as ppb
from agentlearn.profiles.v1 import profile_service_pb2_grpc as ppb_grpc
from agentlearn.skills.v1 import skill_service_pb2 as spb
from agentlearn.skills.v1 import skill_service_pb2_grpc as spb_grpc
from libs.common.grpcserver import create_server
from libs.common.vectorindex import collection_name
from services.runner import cli
from services.runner.registry import EMBEDDERS, PASSES, SERVICES, embedder_mode
from tests.support.app import open_app
from tests.support.runner import clean_env, run_once


async def test_the_pass_table_names_every_pass_the_components_build_and_its_home(make_settings, dsn, edge_index):
    async with open_app(make_settings(), dsn, embedder=None, index=edge_index) as app:
        built = {p.name: name for name, c in app.components.items() for p in c.passes}
        # The collection families a server opens at start are the ones its services write.
        declared = {name: c.vector_collections for name, c in app.components.items() if c.vector_collections}
        written = {
            "diary": [app.components["diary"].service.collection_base],
            "episodes": [app.components["episodes"].service.collection_base],
            "knowledge": [app.components["knowledge"].service.pages.collection_base],
        }
    assert {name: home.service for name, home in PASSES.items()} == built
    assert declared == written
    assert all(set(home.calls) <= set(SERVICES) for home in PASSES.values())
    assert set(EMBEDDERS) >= set(SERVICES)  # every service says what it does with the model


def test_a_process_embeds_as_its_most_demanding_service():
    assert embedder_mode(["profiles", "reflector", "telemetry"]) == "none"
    assert embedder_mode(["profiles", "skills"]) == "lazy"
    assert embedder_mode(["skills", "diary"]) == "warm"


def _pass(args: list[str], dsn: str, data_dir: str) -> subprocess.CompletedProcess[str]:
    return run_once("pass", *args, data_dir=data_dir, env=clean_env({"DATABASE_URL": dsn}))


async def test_a_diary_fill_with_nothing_to_do_opens_the_diary_alone_and_never_loads_the_model(dsn, tmp_path):
    done = await asyncio.to_thread(_pass, ["diary-fill"], dsn, str(tmp_path / "data"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "pass diary-fill: {'indexed': 0" in done.stdout
    assert "filled=0" in done.stdout
    # The runner's own account of what the process built, logged as the pass ends.
    [line] = [x for x in done.stderr.splitlines() if "pass diary-fill finished:" in x]
    assert "opened diary;" in line, line
    assert "embedder=not loaded" in line and "imported(onnxruntime,openai)=neither" in line, line


async def test_an_unknown_pass_is_refused_before_anything_is_opened(tmp_path):
    done = await asyncio.to_thread(_pass, ["no-such-pass"], "postgresql://nobody@127.0.0.1:1/none", str(tmp_path))
    assert done.returncode == 2 and "diary-fill" in done.stderr and "skill-promotion" in done.stderr


async def test_a_profiles_and_skills_server_never_loads_the_model(make_settings, dsn):
    settings = make_settings(database_url=dsn)
    async with contextlib.AsyncExitStack() as stack:
        infra, components = await cli._open(settings, stack, ["profiles"])
        assert infra.embedder is None  # profiles never embed: no embedder is built at all
    async with contextlib.AsyncExitStack() as stack:
        infra, components = await cli._open(settings, stack, ["profiles", "skills"])
        assert infra.embedder is not None and not infra.embedder.loaded  # skills may embed: lazily
        server, port, _ = await create_server([r for c in components for r in c.registrations], "127.0.0.1:0")
        stack.push_async_callback(server.stop, None)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            await ppb_grpc.ProfileServiceStub(channel).UpsertProfile(
                ppb.UpsertProfileRequest(
                    company="acme",
                    observer="ana",
                    subject=ppb.Subject(handle="bob", platform="slack"),
                    communication_style="short digests",
                )
            )
            await spb_grpc.SkillServiceStub(channel).ListSkills(spb.ListSkillsRequest(company="acme", seat="ana"))
        assert not infra.embedder.loaded
        assert cli.opened(infra).startswith("embedder=not loaded")
    async with contextlib.AsyncExitStack() as stack:
        infra, _ = await cli._open(settings, stack, ["diary"], warm=True)
        assert infra.embedder.loaded  # a diary server warms it: its first write must not pay the load
        # ...and opens its collection: nothing written yet, the index already holds it.
        assert await infra.index.collections() == [collection_name("diary_notes", infra.embedder.dimensions)]
