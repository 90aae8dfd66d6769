"""What of a person leaves the process where no erasure reaches it: span events (an exporter ships
them away) and log lines. Neither may carry her words, her name, her handle or her external id; the
events table (which an erasure does reach) keeps the full payload.

Everything is real: the services on a loopback gRPC server, Postgres, the embedded vector index,
the local embedding model; the auxiliary model is the scripted OpenAI-compatible server.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from agentlearn.knowledge.v1 import knowledge_service_pb2 as kn_pb
from agentlearn.prefetch.v1 import prefetch_service_pb2 as pf_pb
from agentlearn.prefetch.v1 import prefetch_service_pb2_grpc as pf_grpc
from agentlearn.reflector.v1 import reflector_service_pb2 as rf_pb
from libs.common.auxmodel.answers import digest
from libs.common.events import read_events, span_attributes
from tests.support.app import open_app
from tests.support.scripted_openai import openai_provider
from tests.support.turns import turn
from tests.test_privacy import NAMES, Env

pytestmark = pytest.mark.timeout(300)

MARK = "Zyxquartz"
PERSON = "Carla Zyxmoreno"
HER = ("zyx", "carlaz", "u0zyx")
"""Lower-case pieces of her words, her name, her handle and her external id."""


def _naming_her(text: str) -> bool:
    return any(w in text.lower() for w in HER)


def _span_texts(spans: Any) -> list[tuple[str, str, str, str]]:
    """Every text a finished span carries: its attributes, its events' attributes, its status."""
    out = []
    for s in spans.get_finished_spans():
        out += [(s.name, "attribute", k, str(v)) for k, v in (s.attributes or {}).items()]
        for e in s.events:
            out += [(s.name, f"event {e.name}", k, str(v)) for k, v in (e.attributes or {}).items()]
        if s.status.description:
            out.append((s.name, "status", "", s.status.description))
    return out


def _her_message() -> rf_pb.InboundInteraction:
    sender = rf_pb.Sender(handle="carlaz", external_id="U0ZYX", platform="slack", display_name=PERSON)
    return rf_pb.InboundInteraction(sender=sender, body=f"I prefer {MARK} weekly digests over daily pings.")


def test_a_span_event_carries_listed_keys_only() -> None:
    """Safe by default: a key nobody listed (a new one) is left off, and so is every free text."""
    payload = {
        "label": f"Message from {PERSON}",
        "query": MARK,
        "subject": {"handle": "carlaz"},
        "failures": {"profiler": MARK},
        "a_key_added_tomorrow": MARK,
        "tool_calls": 3,
        "state": "COMPLETED",
        "skills_hit": True,
        "gate": None,
    }
    assert span_attributes(payload) == {"tool_calls": "3", "state": "COMPLETED", "skills_hit": "True"}


async def test_span_events_name_no_person_and_the_rows_keep_the_payload(
    make_settings: Any, dsn: str, clock: Any, local_embedder: Any, edge_index: Any, spans: Any
) -> None:
    """Her turn (its label names her), her profile updated (its subject is her handle and external
    id) and a knowledge search for her (its query): the span events name the kind and the counts,
    never her; the events rows keep what the payload said, for an erasure to reach."""
    settings = make_settings(companies={"acme": {"roles": {"swe": {"knowledge_containers": ["team"]}}}})
    async with open_app(settings, dsn, names=NAMES, clock=clock, embedder=local_embedder, index=edge_index) as app:
        env = Env(app)  # type: ignore[no-untyped-call]
        await env.knowledge.UpsertPage(
            kn_pb.UpsertPageRequest(
                company="acme", container="team", title="Digest runbook", body=f"How to send the {MARK} digest."
            )
        )
        label = f"Message from {PERSON}: Slack message"
        t = turn("tel-1", now=clock.now(), messages=[_her_message()], label=label, ask=f"Send {PERSON} the digest")
        await env.reflector.SubmitTurn(rf_pb.SubmitTurnRequest(turn=t))
        await env.harness.drain()
        clock.advance(seconds=60)
        await pf_grpc.PrefetchServiceStub(app.channel).BuildTurnContext(
            pf_pb.BuildTurnContextRequest(
                company="acme",
                seat="ana",
                role="swe",
                turn_id="tel-2",
                ask=f"How do I send {PERSON} the {MARK} digest?",
                senders=[pf_pb.Counterparty(handle="carlaz", platform="slack", display_name=PERSON)],
            )
        )
        rows = {r["kind"]: r["payload"] for r in await read_events(app.infra.pool)}
    assert rows["turn_completed"]["label"] == label
    assert rows["counterparty_profile_updated"]["subject"]["handle"] == "carlaz"
    assert MARK.lower() in rows["knowledge_read"]["query"].lower()
    events = {e.name: dict(e.attributes or {}) for s in spans.get_finished_spans() for e in s.events}
    for kind in ("turn_completed", "counterparty_profile_updated", "knowledge_read", "reflection_completed"):
        assert kind in events, kind
    assert events["turn_completed"]["tool_calls"] == str(rows["turn_completed"]["tool_calls"])
    assert events["counterparty_profile_updated"]["profile_id"]
    assert [x for x in _span_texts(spans) if _naming_her(x[3])] == []


async def test_log_lines_and_failures_quote_no_model_answer(
    make_settings: Any,
    dsn: str,
    clock: Any,
    local_embedder: Any,
    edge_index: Any,
    spans: Any,
    caplog: pytest.LogCaptureFixture,
    scripted_openai: Any,
) -> None:
    """A model that answers in prose quoting her message (the profiler's and the synthesizer's
    prompts), and a DOC recommendation naming her: the warnings, the reflection's failures and the
    decider's log line say what failed and name the answer by length and digest, never its text;
    the sender by digest."""
    caplog.set_level(logging.INFO)
    recommendation = f"{PERSON} wants the {MARK} digest weekly."

    def handler(body: dict[str, Any]) -> str:
        system = next((m["content"] for m in body.get("messages", []) if m["role"] == "system"), "")
        user = next((m["content"] for m in body.get("messages", []) if m["role"] == "user"), "")
        if "should remember from a turn" in system:
            return json.dumps({"classification": "DOC", "content": recommendation})
        i = user.find(MARK)
        return "Sure! The person said: " + (user[max(0, i - 60) : i + 60] if i >= 0 else user[:120])

    scripted_openai.chat_handler = handler
    settings = make_settings(
        companies={"acme": {"roles": {"swe": {"knowledge_containers": ["team"]}}}},
        providers={
            "llm": {"scripted": openai_provider(scripted_openai, "small", timeout_seconds=10)},
            "auxiliary_chain": ["scripted"],
        },
    )
    async with open_app(settings, dsn, names=NAMES, clock=clock, embedder=local_embedder, index=edge_index) as app:
        env = Env(app)  # type: ignore[no-untyped-call]
        t = turn(
            "tel-9",
            now=clock.now(),
            messages=[_her_message()],
            label="Message: Slack message",
            ask="digest",
            tools=["a", "b", "c", "d", "e", "f"],
        )
        await env.reflector.SubmitTurn(rf_pb.SubmitTurnRequest(turn=t))
        await env.harness.drain()
        got = await env.reflector.GetReflection(rf_pb.GetReflectionRequest(company="acme", seat="ana", turn_id="tel-9"))
    workers = {w.worker: w for w in got.reflection.workers}
    assert workers["profiler"].status == rf_pb.WORKER_STATUS_FAILED
    assert workers["profiler"].failure.startswith("invalid_output: no JSON object in the answer (")
    assert "sha256:" in workers["profiler"].failure
    assert workers["synthesizer"].failure.startswith("invalid_output: no JSON object in the answer (")
    messages = [r.getMessage() for r in caplog.records]
    assert any(f"sender {digest('slack/carlaz')} on tel-9 not profiled" in m for m in messages), messages
    doc = [m for m in messages if "recommends team documentation" in m]
    assert doc == [f"persist decider recommends team documentation for acme/ana on tel-9 ({len(recommendation)} "
                   f"chars, {digest(recommendation)})"]  # fmt: skip
    assert [m for m in messages if _naming_her(m)] == []
    assert [x for x in _span_texts(spans) if _naming_her(x[3])] == []
