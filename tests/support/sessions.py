"""Session events, plans and a running sessions service for tests (real Postgres, real gRPC)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from agentlearn.sessions.v1 import session_service_pb2 as pb
from agentlearn.sessions.v1 import session_service_pb2_grpc as pb_grpc
from libs.common.protoconv import timestamp
from tests.support.app import App, open_app
from tests.support.grpc_errors import error_info
from tests.support.scripted_openai import Reply, openai_provider

__all__ = [
    "LESSON",
    "WORKSPACE_ROLES",
    "SessionEnv",
    "assistant",
    "chat_answer",
    "info",
    "is_review",
    "open_reviewed",
    "open_sessions",
    "prompt_text",
    "result",
    "review_rule",
    "reviewed_settings",
    "run_check",
    "scripted_llm",
    "step",
    "tool_request",
    "turn_end",
    "user",
    "verification",
    "wait_for",
]

SERVICES = ["diary", "skills", "knowledge", "prefetch", "sessions"]


def scripted_llm(server, *, timeout: float = 10.0) -> dict:  # type: ignore[no-untyped-def]
    """``providers`` whose only auxiliary model is the scripted OpenAI-compatible server (no offline
    fallback, so a failure of the server is the check's model error)."""
    return {
        "llm": {"scripted": openai_provider(server, "small", timeout_seconds=timeout)},
        "auxiliary_chain": ["scripted"],
        "embeddings": {"kind": "none"},
    }


def is_review(body: dict) -> bool:
    """A scripted chat request that is a session review (not the memory judge)."""
    system = next((m["content"] for m in body.get("messages", []) if m["role"] == "system"), "")
    return "You review a piece of finished work from a chat session" in system


def prompt_text(body: dict) -> str:
    return "\n".join(m.get("content") or "" for m in body.get("messages", []))


def chat_answer(text: str, *, completion_tokens: int | None = None, finish: str = "stop") -> dict:
    """An OpenAI chat completion body with ``text`` (for Reply(body=...))."""
    return {
        "id": "chatcmpl-scripted",
        "object": "chat.completion",
        "created": 0,
        "model": "small",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}],
        "usage": {
            "prompt_tokens": 100,
            "completion_tokens": completion_tokens if completion_tokens is not None else len(text) // 4 + 1,
            "total_tokens": 100 + (completion_tokens or len(text) // 4 + 1),
        },
    }


def info(err):  # type: ignore[no-untyped-def]
    """The ErrorInfo of a failed call."""
    return error_info(err)[1]


def _ev(event_id: str, kind: int, text: str, at: datetime, turn: str = "t1", **kw: Any) -> pb.SessionEvent:
    return pb.SessionEvent(event_id=event_id, kind=kind, text=text, event_time=timestamp(at), turn_id=turn, **kw)


def user(event_id: str, text: str, at: datetime, turn: str = "t1", remember: bool = False) -> pb.SessionEvent:
    return _ev(event_id, pb.EVENT_KIND_USER_MESSAGE, text, at, turn, remember=remember)


def assistant(event_id: str, text: str, at: datetime, turn: str = "t1") -> pb.SessionEvent:
    return _ev(event_id, pb.EVENT_KIND_ASSISTANT_MESSAGE, text, at, turn)


def tool_request(event_id: str, tool: str, text: str, at: datetime, turn: str = "t1") -> pb.SessionEvent:
    return _ev(event_id, pb.EVENT_KIND_TOOL_REQUEST, text, at, turn, tool_name=tool)


def result(
    event_id: str, tool: str, text: str, at: datetime, turn: str = "t1", ok: bool = True, source: str = ""
) -> pb.SessionEvent:
    status = pb.EVENT_STATUS_SUCCEEDED if ok else pb.EVENT_STATUS_FAILED
    return _ev(event_id, pb.EVENT_KIND_TOOL_RESULT, text, at, turn, tool_name=tool, status=status, source=source)


def verification(
    event_id: str, tool: str, text: str, at: datetime, turn: str = "t1", ok: bool = True
) -> pb.SessionEvent:
    status = pb.EVENT_STATUS_SUCCEEDED if ok else pb.EVENT_STATUS_FAILED
    return _ev(event_id, pb.EVENT_KIND_VERIFICATION, text, at, turn, tool_name=tool, status=status)


def turn_end(
    event_id: str, at: datetime, turn: str = "t1", outcome: int = pb.TURN_OUTCOME_SUCCEEDED
) -> pb.SessionEvent:
    return _ev(event_id, pb.EVENT_KIND_TURN_END, "", at, turn, turn_outcome=outcome)


def step(step_id: str, status: int, title: str = "") -> pb.PlanStep:
    return pb.PlanStep(id=step_id, title=title or f"step {step_id}", status=status)


def results(prefix: str, n: int, start: datetime, turn: str = "t1", tool: str = "bash") -> list[pb.SessionEvent]:
    return [result(f"{prefix}{i}", tool, f"output {i}", start + timedelta(seconds=i), turn) for i in range(n)]


async def wait_for(predicate, timeout: float = 30.0, interval: float = 0.05):  # type: ignore[no-untyped-def]
    """Wait until ``await predicate()`` is truthy (a condition with a deadline, never a blind sleep)."""
    async with asyncio.timeout(timeout):
        while True:
            value = await predicate()
            if value:
                return value
            await asyncio.sleep(interval)


@dataclass
class SessionEnv:
    app: App
    stub: pb_grpc.SessionServiceStub
    company: str = "acme"
    seat: str = "ana"
    role: str = "swe"
    user: str = "dana"

    @property
    def sessions(self):  # type: ignore[no-untyped-def]
        return self.app.components["sessions"].service

    async def append(self, session_id: str, *events: pb.SessionEvent, **kw: Any) -> pb.AppendSessionEventsResponse:
        fields = {"company": self.company, "user": self.user, "seat": self.seat, "role": self.role, **kw}
        return await self.stub.AppendSessionEvents(
            pb.AppendSessionEventsRequest(session_id=session_id, events=list(events), **fields)
        )

    async def plan(
        self, session_id: str, revision: int, *steps: pb.PlanStep, user: str | None = None
    ) -> pb.SavePlanResponse:
        return await self.stub.SavePlan(
            pb.SavePlanRequest(
                company=self.company,
                session_id=session_id,
                user=user or self.user,
                revision=revision,
                steps=list(steps),
            )
        )

    async def checks(self, session_id: str, user: str | None = None, page_size: int = 0) -> list[pb.LearningCheck]:
        resp = await self.stub.ListLearningChecks(
            pb.ListLearningChecksRequest(
                company=self.company, session_id=session_id, user=user or self.user, page_size=page_size
            )
        )
        return list(resp.checks)

    async def manual(self, session_id: str, user: str | None = None) -> pb.CheckRecentWorkResponse:
        return await self.stub.CheckRecentWork(
            pb.CheckRecentWorkRequest(company=self.company, session_id=session_id, user=user or self.user)
        )

    async def drain(self) -> int:
        """Run every queued check now, in this process (the worker's own loop, without its clock)."""
        return await self.sessions.worker.drain()


@contextlib.asynccontextmanager
async def open_sessions(settings, dsn: str, **kw: Any) -> AsyncIterator[SessionEnv]:  # type: ignore[no-untyped-def]
    kw.setdefault("names", SERVICES)
    async with open_app(settings, dsn, **kw) as app:
        yield SessionEnv(app, pb_grpc.SessionServiceStub(app.channel))


LESSON = "Run make migrate before the payments tests: the test database needs the current schema."
WORKSPACE_ROLES = {
    "swe": {"workspaces": ["payments"]},
    "sre": {"workspaces": ["payments"], "knowledge_containers": ["ops"]},
    "writer": {"knowledge_containers": ["docs"]},
}


def reviewed_settings(make_settings, server, *, companies: dict[str, Any] | None = None, **extra: Any):  # type: ignore[no-untyped-def]
    """The scripted model answers the review; every other purpose falls back to the offline rules.
    acme's roles are ``WORKSPACE_ROLES`` unless ``companies`` says otherwise."""
    providers = {
        "llm": {
            "scripted": openai_provider(server, "small"),
            "offline": {"kind": "offline"},
        },
        "auxiliary_chain": ["scripted", "offline"],
    }
    companies = companies if companies is not None else {"acme": {"roles": WORKSPACE_ROLES}}
    return make_settings(providers=providers, companies=companies, **extra)


def review_rule(
    lessons: Sequence[str] | Callable[[str], Sequence[str]] = (), facts: Sequence[str] = ()
) -> Callable[[dict[str, Any]], Reply | None]:
    """The review: each lesson cites the verification, each fact the first user message.
    ``lessons`` may be a function of the prompt (the lessons of that session)."""

    def rule(body: dict[str, Any]) -> Reply | None:
        if not is_review(body):
            return Reply(status=500)  # the offline rule answers instead
        prompt = body["messages"][-1]["content"]
        lines = prompt.splitlines()
        verify = next(ln[1 : ln.index("]")] for ln in lines if ln.startswith("[") and "(verification" in ln)
        said = next(ln[1 : ln.index("]")] for ln in lines if ln.startswith("[") and "(user_message" in ln)
        answer = {
            "project_lessons": [
                {"lesson": text, "evidence": [verify]} for text in (lessons(prompt) if callable(lessons) else lessons)
            ],
            "personal_facts": [{"fact": text, "evidence": [said]} for text in facts],
        }
        return Reply(body=chat_answer(json.dumps(answer)))

    return rule


@contextlib.asynccontextmanager
async def open_reviewed(  # type: ignore[no-untyped-def]
    make_settings,
    server,
    dsn: str,
    review: Callable[[dict[str, Any]], Reply | None],
    *,
    companies: dict[str, Any] | None = None,
    **kw: Any,
) -> AsyncIterator[SessionEnv]:
    """``open_sessions`` with ``reviewed_settings``, the scripted ``server`` answering chat by ``review``."""
    server.rule("chat", review)
    async with open_sessions(reviewed_settings(make_settings, server, companies=companies), dsn, **kw) as env:
        yield env


async def run_check(
    env: SessionEnv,
    session: str,
    *,
    user_name: str = "dana",
    workspace: str = "payments",
    said: str = "The payments tests keep failing on CI.",
) -> pb.LearningCheck:
    """One manual learning check of ``session`` (a user message, a tool result and a passing
    verification), run to its end; the check as listed."""
    t = env.app.infra.clock.now()
    await env.append(
        session,
        user(f"{session}-u", said, t),
        result(f"{session}-r", "make", "make migrate: applied 3 migrations", t),
        verification(f"{session}-v", "pytest", "42 passed", t),
        user=user_name,
        workspace=workspace,
    )
    await env.manual(session, user=user_name)
    assert await env.drain() == 1
    return (await env.checks(session, user=user_name))[0]
