"""The Python client's turn lifecycle (``clients/python``, imported from its source) against real
services deployed split, as ``./run up --split`` and Kubernetes run them: the reflector on a port of
its own, every other service on another."""

from __future__ import annotations

import sys
from pathlib import Path

import grpc
import pytest

from agentlearn.reflector.v1 import reflector_service_pb2 as rf_pb
from agentlearn.reflector.v1 import reflector_service_pb2_grpc as rf_grpc
from tests.test_clients_support import queued_reflection, serving_reflector, serving_without_reflector

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "clients" / "python" / "src"))
from agentlearn_client import AgentLearn, Outcome, Sender

BOB = Sender(handle="bob", platform="slack")


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
