"""Session events, plans and a running sessions service for tests (real Postgres, real gRPC)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from agentlearn.sessions.v1 import session_service_pb2 as pb
from agentlearn.sessions.v1 import session_service_pb2_grpc as pb_grpc
from libs.common.protoconv import timestamp
from tests.support.app import App, open_app
from tests.support.grpc_errors import error_info
from tests.support.scripted_openai import openai_provider

__all__ = [
    "SessionEnv",
    "assistant",
    "chat_answer",
    "info",
    "is_review",
    "open_sessions",
    "prompt_text",
    "result",
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
