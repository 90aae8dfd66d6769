"""The Python client's turn lifecycle (``clients/python``, imported from its source) against real
services deployed split, as ``./run up --split`` and Kubernetes run them: the reflector on a port of
its own, every other service on another. A turn is kept until it is submitted for good (a failed
submit is sent again, a self-iterated round settles under its run id), a misuse turn_end would
refuse is refused at turn_start, a tool call carries the unit chain its turn started with, and
gRPC retries only the calls a second run of cannot double a write."""

from __future__ import annotations

import sys
from pathlib import Path

import grpc
import pytest

from agentlearn.prefetch.v1 import prefetch_service_pb2 as pf_pb
from agentlearn.reflector.v1 import reflector_service_pb2 as rf_pb
from agentlearn.reflector.v1 import reflector_service_pb2_grpc as rf_grpc
from services.prefetch.domain import chain_hash
from tests.support.runner import free_port
from tests.test_clients_support import queued_reflection, serving_reflector, serving_without_reflector

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "clients" / "python" / "src"))
from agentlearn_client import RETRY_SERVICE_CONFIG, AgentLearn, Outcome, Sender

BOB, CARLA = Sender(handle="bob", platform="slack"), Sender(handle="carla", platform="slack")


async def test_a_turn_runs_against_the_split_deployment(make_settings, dsn, local_embedder, edge_index):
    async with (
        serving_without_reflector(make_settings, dsn, local_embedder, edge_index) as front,
        serving_reflector(make_settings, dsn) as back,
    ):
        with pytest.raises(grpc.aio.AioRpcError) as err:  # the deployment is split: no reflector up front
            await rf_grpc.ReflectorServiceStub(front.channel).GetReflection(
                rf_pb.GetReflectionRequest(company="acme", seat="ana", turn_id="x")
            )
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED

        async with AgentLearn(
            f"127.0.0.1:{front.port}",
            company="acme",
            seat="ana",
            role="swe",
            reflector_address=f"127.0.0.1:{back.port}",
        ) as al:
            await al.turn_start("split-1", "Who approves prod deploys?", senders=[BOB])
            await al.call_tool("split-1", "refresh_memory", {"context_hint": "prod deploy approvals"})
            submitted = await al.turn_end("split-1", outcome=Outcome.DONE, what_it_did="Told Bob.")
        assert submitted.queued
        assert await queued_reflection(back, "split-1")

        # reflector_channel= is the same for a caller that opens its own channels (and keeps them open).
        async with AgentLearn(
            "", company="acme", seat="ana", role="swe", channel=front.channel, reflector_channel=back.channel
        ) as al:
            await al.turn_start("split-2", "Any news?", senders=[BOB])
            assert (await al.turn_end("split-2", outcome=Outcome.DONE, what_it_did="None.")).queued
        assert await queued_reflection(back, "split-2")


async def test_a_submit_that_failed_is_sent_again(make_settings, dsn, local_embedder, edge_index):
    address = f"127.0.0.1:{free_port()}"  # the reflector is down at first: nothing listens there yet
    async with (
        serving_without_reflector(make_settings, dsn, local_embedder, edge_index) as front,
        grpc.aio.insecure_channel(address) as to_reflector,
        AgentLearn(
            "", company="acme", seat="ana", role="swe", channel=front.channel, reflector_channel=to_reflector
        ) as al,
    ):
        al.timeout = 5.0
        await al.turn_start("down-1", "Who approves prod deploys?", senders=[BOB])
        await al.call_tool("down-1", "refresh_memory", {"context_hint": "prod deploy approvals"})
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await al.turn_end("down-1", outcome=Outcome.DONE, what_it_did="Told Bob.")
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE

        async with serving_reflector(make_settings, dsn, address) as back:
            await to_reflector.channel_ready()
            submitted = await al.turn_end("down-1", outcome=Outcome.DONE, what_it_did="Told Bob.")
            assert submitted.queued and await queued_reflection(back, "down-1")
            with pytest.raises(KeyError):  # submitted for good: the client forgot the turn
                await al.turn_end("down-1", outcome=Outcome.DONE, what_it_did="Told Bob.")


async def test_a_self_iterated_turn_settles_under_its_run_id(make_settings, dsn, local_embedder, edge_index):
    async with (
        serving_without_reflector(make_settings, dsn, local_embedder, edge_index) as front,
        serving_reflector(make_settings, dsn) as back,
        AgentLearn(
            "", company="acme", seat="ana", role="swe", channel=front.channel, reflector_channel=back.channel
        ) as al,
    ):
        await al.turn_start("iter-1", "Fix the flaky deploy test.", senders=[BOB])
        round_one = await al.turn_end("iter-1", outcome=Outcome.SELF_ITERATE, what_it_did="Retried the test.")
        settled = await al.turn_end("iter-1", outcome=Outcome.DONE, what_it_did="Pinned the clock; it passes.")
        assert round_one.queued and settled.queued
        assert await queued_reflection(back, "iter-1#self_iterate")
        assert await queued_reflection(back, "iter-1")


async def test_several_senders_without_messages_are_refused_at_turn_start(
    make_settings, dsn, local_embedder, edge_index
):
    async with (
        serving_without_reflector(make_settings, dsn, local_embedder, edge_index) as front,
        AgentLearn("", company="acme", seat="ana", role="swe", channel=front.channel) as al,
    ):
        with pytest.raises(ValueError, match="messages="):
            await al.turn_start("two-1", "Bob and Carla: who approves prod deploys?", senders=[BOB, CARLA])
        with pytest.raises(KeyError):  # no turn was started
            al.record_tool_call("two-1", "slack_post")


async def test_a_tool_call_stamps_the_unit_chain_its_turn_started_with(make_settings, dsn, local_embedder, edge_index):
    async with (
        serving_without_reflector(make_settings, dsn, local_embedder, edge_index) as front,
        AgentLearn("", company="acme", seat="ana", role="swe", channel=front.channel) as al,
    ):
        await al.turn_start("chain-1", "What should I know on my first day?", unit_chain=["platform", "eng"])
        marked = await al.call_tool("chain-1", "mark_onboarded", {})
    assert marked.result["chain_hash"] == chain_hash(["platform", "eng"]) != chain_hash([])


def test_only_calls_that_cannot_double_a_write_are_retried():
    [method_config] = RETRY_SERVICE_CONFIG["methodConfig"]
    retried = {(n["service"].rsplit(".", 1)[1], n["method"]) for n in method_config["name"]}
    assert retried == {
        ("PrefetchService", "BuildTurnContext"),
        ("PrefetchService", "ListTools"),
        ("PrefetchService", "GetGuidance"),
        ("BuiltinService", "CallTool"),
        ("BuiltinService", "RefreshMemory"),
        ("BuiltinService", "QueryEpisodes"),
        ("BuiltinService", "SearchKnowledge"),
        ("ReflectorService", "SubmitTurn"),
        ("ReflectorService", "GetReflection"),
        ("ReflectorService", "ListReflections"),
    }
    files = {
        "PrefetchService": pf_pb.DESCRIPTOR,
        "BuiltinService": pf_pb.DESCRIPTOR,
        "ReflectorService": rf_pb.DESCRIPTOR,
    }
    for service, method in retried:  # every name is a method of the contract (a typo retries nothing)
        assert method in files[service].services_by_name[service].methods_by_name
    # The typed writes carry no idempotency key: a retry after a run that landed writes twice.
    for unkeyed in (pf_pb.ReflectAndPersistRequest, pf_pb.RefineSkillRequest, pf_pb.UseSkillRequest):
        assert "request_id" not in unkeyed.DESCRIPTOR.fields_by_name
    assert "request_id" in pf_pb.CallToolRequest.DESCRIPTOR.fields_by_name
    assert method_config["retryPolicy"]["retryableStatusCodes"] == ["UNAVAILABLE"]
