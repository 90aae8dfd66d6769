"""Split mode end to end: every service in its own process on its own port, as on Kubernetes. A
turn submitted to the reflector is followed through the queue to every service it writes, and the
whole of it is ONE trace: from SubmitTurn, through the job's stored context, every worker RPC, to
every store write — exported over OTLP to a collector (here, an in-memory one in the test)."""

from __future__ import annotations

import asyncio
import signal

import grpc
import pytest
import yaml

from agentlearn.diary.v1 import diary_service_pb2 as diary_pb
from agentlearn.diary.v1 import diary_service_pb2_grpc as diary_grpc
from agentlearn.reflector.v1 import reflector_service_pb2 as pb
from agentlearn.reflector.v1 import reflector_service_pb2_grpc as pb_grpc
from agentlearn.skills.v1 import skill_service_pb2_grpc as sk_grpc
from libs.common.clock import SystemClock
from services.runner.registry import SERVICES
from tests.support.otlp_collector import OtlpCollector
from tests.support.runner import clean_env, free_port, start_with_config
from tests.support.skills import skill_request
from tests.support.turns import message, turn

pytestmark = pytest.mark.slow


async def test_a_turn_is_one_trace_across_every_service_process(tmp_path):
    collector = await OtlpCollector().start()
    ports = {name: free_port() for name in SERVICES}
    config = tmp_path / "split.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "services": {name: f"127.0.0.1:{port}" for name, port in ports.items()},
                # Every statement a span (opt-in; by default only slow ones are)
                "telemetry": {"otlp_endpoint": collector.endpoint, "sql_spans": "all"},
                "run_passes_in_process": False,
                "server": {"http_port": 0},
                "learning": {"reflection": {"poll_interval_seconds": 0.5}},
            }
        )
    )
    try:
        running = await start_with_config(
            "up",
            "--split",
            config=config,
            data_dir=tmp_path / "data",
            env=clean_env({"OTEL_BSP_SCHEDULE_DELAY": "100"}),  # export within a tenth of a second
            ready="agentlearn ready (split)",
            timeout=180,
            start_new_session=True,
        )
    except BaseException:
        await collector.stop()
        raise
    proc, line = running.proc, running.line
    try:
        for name, port in ports.items():
            assert f"{name}=127.0.0.1:{port}" in line  # each service in its own process and port

        now = SystemClock().now()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{ports['skills']}") as skills_channel:
            tools = ["jira_get_issue", "github_search"]
            request = skill_request("ana", "triage", "triage a ticket", "# Triage\n1. Read.\n", tools, ["seed"])
            skill = (await sk_grpc.SkillServiceStub(skills_channel).CreateSkill(request)).skill
        async with grpc.aio.insecure_channel(f"127.0.0.1:{ports['reflector']}") as channel:
            stub = pb_grpc.ReflectorServiceStub(channel)
            t = turn(
                "split-run-1",
                now=now,
                messages=[message("bob", "I prefer weekly digests over daily pings.")],
                offered=[(skill.id, skill.name)],
                tools=["jira_get_issue", "github_search", "github_create_branch", "run_tests", "github_create_pr"],
            )
            assert (await stub.SubmitTurn(pb.SubmitTurnRequest(turn=t))).queued
            async with asyncio.timeout(90):
                while True:
                    r = (
                        await stub.GetReflection(
                            pb.GetReflectionRequest(company="acme", seat="ana", turn_id="split-run-1")
                        )
                    ).reflection
                    if r.state == pb.REFLECTION_STATE_COMPLETED:
                        break
                    await asyncio.sleep(0.2)
        statuses = {w.worker: w.status for w in r.workers}
        for worker in ("persist_decider", "episodist", "profiler", "skill_use"):
            assert statuses[worker] == pb.WORKER_STATUS_WROTE, (worker, r.workers)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{ports['diary']}") as channel:
            notes = await diary_grpc.DiaryServiceStub(channel).ListNotes(
                diary_pb.ListNotesRequest(company="acme", seat="ana")
            )
            assert [n.content for n in notes.notes] == ["Bob prefers weekly digests over daily pings."]

        # The trace: wait until the last writes have been exported.
        wanted_writes = {
            "db insert agent_diary",
            "db insert episodes",
            "db insert counterparty_profiles",
            "db update synthesized_skills",
            "reflect",  # the pass's own span ends (and is exported) last
        }
        async with asyncio.timeout(30):
            while True:
                spans = collector.spans()
                submit = [s for s in spans if s.name.endswith("ReflectorService/SubmitTurn")]
                if submit:
                    trace_id = submit[0].trace_id
                    names = {s.name for s in spans if s.trace_id == trace_id}
                    if wanted_writes <= names:
                        break
                await asyncio.sleep(0.2)
        mine = [s for s in spans if s.trace_id == trace_id]
        services = {s.service for s in mine}
        assert {
            "agentlearn-reflector",
            "agentlearn-diary",
            "agentlearn-episodes",
            "agentlearn-profiles",
            "agentlearn-skills",
        } <= services
        rpcs = {s.name for s in mine if s.name.startswith("/agentlearn.")}
        assert {
            "/agentlearn.reflector.v1.ReflectorService/SubmitTurn",
            "/agentlearn.diary.v1.DiaryService/WriteNote",
            "/agentlearn.episodes.v1.EpisodeService/RecordEpisode",
            "/agentlearn.profiles.v1.ProfileService/UpsertProfile",
            "/agentlearn.skills.v1.SkillService/MarkSkillsUsed",
        } <= rpcs
        reflect = [s for s in mine if s.name == "reflect"]
        assert reflect and reflect[0].attributes["agentlearn.turn_id"] == "split-run-1"
        assert (
            reflect[0].attributes["agentlearn.company"] == "acme" and reflect[0].attributes["agentlearn.seat"] == "ana"
        )
        workers = {s.attributes.get("agentlearn.worker") for s in mine if s.name.startswith("worker ")}
        assert {"persist_decider", "episodist", "profiler", "skill_use"} <= workers
        # The diary's server span (the reflector's client span of the same call has the same name).
        write = next(
            s
            for s in mine
            if s.name == "/agentlearn.diary.v1.DiaryService/WriteNote" and s.service == "agentlearn-diary"
        )
        assert write.attributes.get("agentlearn.turn_id") == "split-run-1"  # the RPC span names the turn
        # Store writes by the database semantic conventions; the pool's reset statement is not a span.
        insert = next(s for s in mine if s.name == "db insert agent_diary")
        assert insert.attributes["db.system.name"] == "postgresql"
        assert insert.attributes["db.collection.name"] == "agent_diary"
        assert insert.attributes["db.operation.name"] == "INSERT"
        assert not [s for s in spans if "UNLISTEN" in str(s.attributes.get("db.query.text", ""))]
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            async with asyncio.timeout(60):
                await proc.wait()
        await collector.stop()
    assert proc.returncode == 0
