"""Log lines that used to carry model-made or provider text (docs/operations.md: "A log line never
quotes a model's answer, a message or a DOC recommendation: it names them by length and sha256:
digest, and a sender by the digest of its key"): an endpoint's error message, a profiler failure
naming its sender, a skill's draft name, the memory judge's own tier string, a review's keys.
A log line is kept where no erasure reaches.

The paths are the real ones: the seam over the scripted OpenAI-compatible server, the reflector and
the skills pass on loopback gRPC and Postgres, the readers the workers call.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from agentlearn.reflector.v1 import reflector_service_pb2 as rf_pb
from agentlearn.skills.v1 import skill_service_pb2 as sk_pb
from libs.common.auxmodel import AuxiliaryModel, AuxiliaryUnavailable
from libs.common.auxmodel.answers import InvalidOutput, digest
from libs.common.auxmodel.openai_provider import OpenAICompatibleProvider
from libs.common.memory_tiers import read_tier, read_ttl_days
from services.reflector.workers.profiler import STYLE_CHARS
from services.sessions.evidence import Evidence
from services.sessions.review import Limits, read_review
from tests.support.app import open_app
from tests.support.scripted_openai import Reply, openai_provider
from tests.support.turns import turn
from tests.test_auxiliary_model import ATTR, PROMPT, chain_settings
from tests.test_privacy import NAMES, Env
from tests.test_reflector_workers import FIVE_TOOLS
from tests.test_reflector_workers import env_for as env_for  # the fixture, used by name
from tests.test_skills_synthesis import (
    X,
    create_unrelated_skill,
    draft_from_prompt,
    record,
    representative_of,
    stubs,
    synthesize,
)
from tests.test_skills_synthesis import app as app  # the fixture, used by name
from tests.test_telemetry_privacy import _her_message, _naming_her

pytestmark = pytest.mark.timeout(300)

HERS = "Carla Zyxmoreno prefers Zyxquartz digests"
"""Text naming her (her name, her words' mark): what a model or an endpoint may write back."""


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records]


async def test_an_endpoints_error_is_logged_by_status_and_type_not_its_message(
    make_settings: Any, clock: Any, scripted_openai: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """An endpoint that refuses with a message echoing the prompt: the seam's line names the
    provider, the error type and the HTTP status, never the message."""
    caplog.set_level(logging.INFO)
    settings = chain_settings(make_settings, scripted_openai)  # type: ignore[no-untyped-call]
    primary = OpenAICompatibleProvider(settings.providers.llm["primary"], name="primary")
    aux = AuxiliaryModel(settings, {"primary": primary}, None, None, clock)
    scripted_openai.push("chat", Reply(status=400, body={"error": {"message": f"bad: {HERS}", "type": "x"}}))
    try:
        with pytest.raises(AuxiliaryUnavailable):
            await aux.complete(ATTR, PROMPT)
    finally:
        await primary.close()
    failed = [m for m in _lines(caplog) if "provider primary failed" in m]
    assert failed == ["provider primary failed for echo: refused: BadRequestError (HTTP 400)"], _lines(caplog)
    assert [m for m in _lines(caplog) if _naming_her(m)] == []


def _reflector_settings(make_settings: Any, scripted_openai: Any) -> Any:
    return make_settings(
        companies={"acme": {"roles": {"swe": {"knowledge_containers": ["team"]}}}},
        providers={
            "llm": {"scripted": openai_provider(scripted_openai, "small", timeout_seconds=10)},
            "auxiliary_chain": ["scripted"],
        },
    )


def _is_profiler(body: dict[str, Any]) -> bool:
    system = next((m["content"] for m in body.get("messages", []) if m["role"] == "system"), "")
    return "private notes about one person" in system


async def test_a_retried_profiler_failure_names_its_sender_by_digest_in_the_reflectors_log(
    make_settings: Any,
    dsn: str,
    clock: Any,
    local_embedder: Any,
    edge_index: Any,
    scripted_openai: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The profiler's endpoint rate-limits it: the reflection is retried; the record's failure
    names her by the digest of her key, the harness logs only the failures' kinds, and the
    provider's line names the error, not the endpoint's message (which echoes her words here)."""
    caplog.set_level(logging.INFO)
    scripted_openai.rule(
        "chat",
        lambda body: (
            Reply(status=429, body={"error": {"message": f"slow down: {HERS}", "type": "x"}})
            if _is_profiler(body)
            else None
        ),
    )
    settings = _reflector_settings(make_settings, scripted_openai)
    async with open_app(settings, dsn, names=NAMES, clock=clock, embedder=local_embedder, index=edge_index) as app:
        env = Env(app)  # type: ignore[no-untyped-call]
        t = turn("log-1", now=clock.now(), messages=[_her_message()], label="Message: Slack message", ask="digest")
        await env.reflector.SubmitTurn(rf_pb.SubmitTurnRequest(turn=t))
        await env.harness.drain()
        got = await env.reflector.GetReflection(rf_pb.GetReflectionRequest(company="acme", seat="ana", turn_id="log-1"))
    workers = {w.worker: w for w in got.reflection.workers}
    assert workers["profiler"].status == rf_pb.WORKER_STATUS_RETRYING
    assert f"(sender {digest('slack/carlaz')}; 1 of 1 senders not profiled)" in workers["profiler"].failure
    # The harness's own lines name each unfinished worker's failure kind, not the failure's text
    # (which the record keeps, erasably): an owner's refusal there could quote what it refused.
    retried = [m for m in _lines(caplog) if "reflection of ana/log-1" in m]
    assert retried and all("profiler: rate_limited" in m for m in retried), _lines(caplog)
    assert not [m for m in retried if "not profiled" in m or "sender" in m], retried
    assert [m for m in _lines(caplog) if _naming_her(m)] == []


async def test_a_profile_field_left_out_is_logged_with_its_sender_by_digest(
    make_settings: Any,
    dsn: str,
    clock: Any,
    local_embedder: Any,
    edge_index: Any,
    scripted_openai: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A communication style past the contract's bound is left out, and the line that says so
    names the sender by digest."""
    caplog.set_level(logging.INFO)

    def handler(body: dict[str, Any]) -> str:
        if _is_profiler(body):
            return json.dumps({"communication_style": "x" * (STYLE_CHARS + 1), "topics": ["digests"]})
        return "{}"

    scripted_openai.chat_handler = handler
    settings = _reflector_settings(make_settings, scripted_openai)
    async with open_app(settings, dsn, names=NAMES, clock=clock, embedder=local_embedder, index=edge_index) as app:
        env = Env(app)  # type: ignore[no-untyped-call]
        t = turn("log-2", now=clock.now(), messages=[_her_message()], label="Message: Slack message", ask="digest")
        await env.reflector.SubmitTurn(rf_pb.SubmitTurnRequest(turn=t))
        await env.harness.drain()
    left_out = [m for m in _lines(caplog) if "left out a communication_style" in m]
    assert left_out and left_out[0].startswith(f"profiler: sender {digest('slack/carlaz')} on log-2:"), _lines(caplog)
    assert [m for m in _lines(caplog) if _naming_her(m)] == []


async def test_a_refused_clustered_draft_is_logged_by_its_names_digest(  # type: ignore[no-untyped-def]
    app,
    clock,
    scripted_openai,
    caplog,
):
    """A skill's name is the model's text, and may name the person the turns answered: the pass's
    line names a draft by the digest of its name (the skill row, which an erasure reaches, keeps
    the name)."""
    caplog.set_level(logging.INFO, logger="services.skills.passes")
    name = "carla-zyxmoreno-digests"
    estub, sstub = stubs(app)  # type: ignore[no-untyped-call]
    for turn_id, tools in X.items():
        await record(estub, clock, turn_id, tools)  # type: ignore[no-untyped-call]
    await create_unrelated_skill(sstub, name)

    def handler(body: dict[str, Any]) -> str:
        if representative_of(body) == X["x4"]:
            return json.dumps({"name": name, "summary": "x work", "body": "# x\n"})
        return draft_from_prompt(body)

    scripted_openai.chat_handler = handler
    report = await synthesize(app)  # type: ignore[no-untyped-call]
    assert report.dropped == 1
    refused = [m for m in _lines(caplog) if "clustered draft" in m]
    assert refused and all(digest(name) in m for m in refused), _lines(caplog)
    assert [m for m in _lines(caplog) if _naming_her(m)] == []


def test_the_judges_own_tier_string_is_named_by_length_and_digest() -> None:
    """The message is logged by the persist decider (``names no tier, NOOP: ...``)."""
    with pytest.raises(InvalidOutput) as exc:
        read_tier({"classification": HERS})
    assert (
        str(exc.value) == f"a classification ({len(HERS)} chars, {digest(HERS)}) that is none of LONG, SHORT, DOC, NOOP"
    )
    with pytest.raises(InvalidOutput) as exc:
        read_ttl_days({"ttl_days": HERS}, "SHORT")
    assert not _naming_her(str(exc.value))


def test_a_reviews_unknown_keys_are_counted_not_quoted() -> None:
    with pytest.raises(InvalidOutput) as exc:
        read_review(json.dumps({HERS: 1, "other": 2}), 10, 100, Evidence(), Limits(3, 3, 200, 200))
    assert (
        str(exc.value)
        == "the answer has none of ['personal_facts', 'project_lessons', 'skill_candidate'] (2 other keys)"
    )


async def test_a_single_turn_draft_waiting_for_its_episode_is_logged_by_its_skill_id(  # type: ignore[no-untyped-def]
    env_for, clock, caplog
):
    """The synthesizer's draft waits for the episodist's row (it runs first here) and the turn is
    retried: the record's failure names the skill by id, not by its name (taken from the ask's
    words by the offline rule, from the model's answer otherwise), and the harness logs only the
    failure's kind."""
    caplog.set_level(logging.INFO)
    async with env_for(learning={"reflection": {"workers": ["synthesizer", "episodist"]}}) as env:
        t = turn("log-3", now=clock.now(), tools=FIVE_TOOLS, ask="Send Zyxmoreno the weekly digest")
        r = await env.reflect(t)
        w = env.worker(r, "synthesizer")
        [skill] = (await env.skills.ListSkills(sk_pb.ListSkillsRequest(company="acme", seat="ana"))).skills
    assert w.status == rf_pb.WORKER_STATUS_RETRYING and _naming_her(skill.name)
    assert f"skill {skill.id} waits to stamp it" in w.failure
    assert [m for m in _lines(caplog) if "synthesizer: episode_pending" in m], _lines(caplog)
    assert [m for m in _lines(caplog) if _naming_her(m)] == []
