"""An event names the span it was recorded in, beside its trace: the spec correlates a
``skill_used`` to the host turn "via trace_id / span_id". The events row keeps both and ListEvents
returns both; the span is one the trace really has.

Real services on loopback gRPC, real PostgreSQL, the OpenTelemetry SDK with an in-memory exporter."""

from __future__ import annotations

from typing import Any

import pytest

from agentlearn.skills.v1 import skill_service_pb2 as sk_pb
from agentlearn.skills.v1 import skill_service_pb2_grpc as sk_grpc
from agentlearn.telemetry.v1 import telemetry_service_pb2 as tm_pb
from agentlearn.telemetry.v1 import telemetry_service_pb2_grpc as tm_grpc
from libs.common.events import read_events
from tests.support.app import open_app
from tests.support.skills import create_skill

pytestmark = pytest.mark.timeout(300)

BODY = "---\nname: open-pr\ndescription: does open-pr\n---\n# open-pr\n\n## Steps\n\n1. Do it.\n"


async def test_skill_used_names_its_trace_and_span(make_settings: Any, dsn: str, clock: Any, spans: Any) -> None:
    async with open_app(make_settings(), dsn, names=["skills", "telemetry"], clock=clock) as app:
        skills = sk_grpc.SkillServiceStub(app.channel)
        await create_skill(skills, "open-pr", ["github_create_pr"], body=BODY)
        await skills.UseSkill(sk_pb.UseSkillRequest(company="acme", seat="ana", skill_name="open-pr", turn_id="run-9"))
        [row] = await read_events(app.infra.pool, "skill_used")
        listed = await tm_grpc.TelemetryServiceStub(app.channel).ListEvents(
            tm_pb.ListEventsRequest(company="acme", kinds=["skill_used"])
        )
    [event] = listed.events
    assert (event.trace_id, event.span_id) == (row["trace_id"], row["span_id"])
    assert len(event.span_id) == 16 and int(event.span_id, 16) != 0
    finished = spans.get_finished_spans()
    [span] = [s for s in finished if format(s.context.span_id, "016x") == event.span_id]
    assert format(span.context.trace_id, "032x") == event.trace_id
    # The span is the UseSkill call's (its server span, or one inside it): the same trace.
    [server] = [s for s in finished if s.name.endswith("SkillService/UseSkill") and s.kind.name == "SERVER"]
    assert server.context.trace_id == span.context.trace_id


async def test_an_event_recorded_with_no_span_has_no_ids(make_settings: Any, dsn: str, clock: Any) -> None:
    async with open_app(make_settings(), dsn, names=["telemetry"], clock=clock) as app:
        await app.infra.events.emit("diary_sweep_completed", company="acme", evicted=0)
        [row] = await read_events(app.infra.pool, "diary_sweep_completed")
        listed = await tm_grpc.TelemetryServiceStub(app.channel).ListEvents(tm_pb.ListEventsRequest(company="acme"))
    assert (row["trace_id"], row["span_id"]) == (None, None)
    assert [(e.kind, e.trace_id, e.span_id) for e in listed.events] == [("diary_sweep_completed", "", "")]
