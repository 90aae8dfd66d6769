"""What every worker shares: the context it runs in, the turn as prompts describe it, prompt files,
output parsing, and the failure kinds a reflection records."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from string import Template
from typing import Any, Protocol

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from libs.common.auxmodel import (
    Attribution,
    AuxiliaryModel,
    AuxiliaryUnavailable,
    Completion,
    NoAuxiliaryModel,
    Prompt,
    Stage,
)
from libs.common.auxmodel.answers import InvalidOutput, parse_object
from libs.common.clients import Clients
from libs.common.clock import Clock
from libs.common.config import Settings
from libs.common.events import EventSink
from services.reflector.domain import Turn, WorkerOutcome
from services.reflector.workers.ports import WorkerPorts
from services.reflector.workers.provenance import prompt_version

__all__ = [
    "EpisodePending",
    "InvalidOutput",
    "Worker",
    "WorkerContext",
    "WorkerPrompt",
    "ask_model",
    "describe_turn",
    "failure_kind",
    "failure_text",
    "parse_object",
    "prompt_file",
]

_PROMPTS = Path(__file__).resolve().parent.parent / "prompts"


@dataclass
class WorkerContext:
    settings: Settings
    aux: AuxiliaryModel
    clients: Clients
    events: EventSink
    clock: Clock
    ports: WorkerPorts
    """The calls the workers make on other services (every worker calls these, never ``clients``
    directly; ``clients`` remains for the harness's own wiring)."""
    first_pass: bool = False
    """Set by the harness for a turn's first pass (no earlier pass started, so nothing of this turn
    was written before): a worker may skip looking for its own earlier write. False, the safe
    answer, when unknown."""
    outcomes: Mapping[str, WorkerOutcome] = field(default_factory=dict)
    """The outcomes of this turn's workers known so far, by name: recorded by an earlier pass, or
    finished in this one before the reader started (``ORDERED_WORKERS``: the synthesizer reads the
    episodist's, to tell an episode still coming from one that never will)."""


class Worker(Protocol):
    name: str

    def gate(self, turn: Turn) -> str | None:
        """The name of this worker's own gate when it does not apply to ``turn``, else None."""
        ...

    async def run(self, turn: Turn, ctx: WorkerContext) -> WorkerOutcome: ...


class EpisodePending(Exception):
    """A worker's write depends on the turn's episode, which the episodist has not recorded yet (it
    failed for a passing reason this attempt): a passing failure, retried with it."""


def prompt_file(name: str) -> Template:
    return Template((_PROMPTS / f"{name}.md").read_text())


@dataclass(frozen=True)
class WorkerPrompt:
    """A model worker's prompt, read once at import: ``<purpose>.md`` (the system text) and the
    ``string.Template`` ``<purpose>_user.md``. ``version`` names the pair (what a write's provenance
    records); ``purpose`` is also the offline rule's key and the call's attribution."""

    purpose: str
    system: str
    user: Template
    version: str

    @functools.cached_property
    def describes_turn(self) -> bool:
        """The user template shows the turn described (``$turn``)."""
        return "turn" in self.user.get_identifiers()

    @classmethod
    def load(cls, purpose: str) -> WorkerPrompt:
        system = prompt_file(purpose).template
        user = prompt_file(f"{purpose}_user")
        return cls(purpose, system, user, prompt_version(system, user.template))

    async def ask(
        self,
        ctx: WorkerContext,
        turn: Turn,
        *,
        data: Mapping[str, Any],
        max_tokens: int,
        senders: bool = False,
        **fields: str,
    ) -> tuple[dict[str, Any], Completion]:
        """One JSON-answer call attributed to ``turn``. The user template's ``$turn`` is the turn
        described (:func:`describe_turn`, with ``senders``), its other fields ``fields`` (a missing
        one raises: a template and its worker disagreeing is a bug). A template may leave ``$turn``
        out: the profiler's does, since the turn described whole shows every sender's messages to
        a pass about one of them. Returns the answer as an
        object (:class:`InvalidOutput` when it is not one) and the completion, whose model a
        write's provenance names."""
        # The turn is described only for a template that shows it (the whole turn's text, every
        # sender's messages: built for each of a profiler's passes, it was thrown away).
        described = {"turn": describe_turn(turn, senders=senders)} if self.describes_turn else {}
        prompt = Prompt(
            purpose=self.purpose,
            system=self.system,
            user=self.user.substitute(fields, **described),
            data=data,
            max_tokens=max_tokens,
            json_output=True,
        )
        completion = await ask_model(ctx, turn, self.purpose, prompt)
        return parse_object(completion.text), completion


def describe_turn(turn: Turn, *, senders: bool = False) -> str:
    """The turn under the names of what its fields are: woken by / asked / what it did — never a
    "task" and a "plan", which a model reads as the whole of what was asked and intended."""
    lines = [f"Woken by: {turn.label or '(no label)'}"]
    if senders and turn.interactions:
        lines.append("Asked (each message with its sender):")
        lines += [
            f"  {i.sender.name} ({i.sender.platform}{', this agent' if i.sender.is_seat(turn.seat) else ''}): {i.body}"
            for i in turn.interactions
        ]
    else:
        lines.append(f"Asked: {turn.asked or '(nothing)'}")
    lines.append(f"What it did: {turn.what_it_did or '(no account)'}")
    tools = ", ".join(turn.tool_sequence) or "none"
    lines.append(f"Outcome: {turn.outcome}; final-round tools: {tools}; tool calls: {len(turn.tools_called)}")
    return "\n".join(lines)


def turn_data(turn: Turn) -> dict[str, Any]:
    """The turn as structured data, for the offline rules."""
    return {
        "turn_id": turn.turn_id,
        "seat": turn.seat,
        "label": turn.label,
        "ask": turn.ask,
        "asked": turn.asked,
        "what_it_did": turn.what_it_did,
        "outcome": str(turn.outcome),
        "tool_sequence": list(turn.tool_sequence),
        "tools_called": list(turn.tools_called),
        "tool_run": list(turn.tool_run),
        "end_time": turn.end_time.isoformat() if turn.end_time else "",
        "interactions": [
            {
                "sender": i.sender.name,
                "sender_key": i.sender.key,
                "sender_is_seat": i.sender.is_seat(turn.seat),
                "body": i.body,
            }
            for i in turn.interactions
        ],
    }


async def ask_model(ctx: WorkerContext, turn: Turn, purpose: str, prompt: Prompt) -> Completion:
    attribution = Attribution(
        company=turn.company,
        seat=turn.seat,
        stage=Stage.REFLECTION,
        purpose=purpose,
        turn_id=turn.turn_id,
        role=turn.role,
    )
    return await ctx.aux.complete(attribution, prompt)


def _asks_to_retry(exc: grpc.aio.AioRpcError) -> bool:
    """The status carries ``google.rpc.RetryInfo``: the server says to come back later."""
    try:
        status = rpc_status.from_call(exc)  # type: ignore[arg-type]  # the stub says grpc.Call; AioRpcError has the methods it reads
    except Exception:  # a malformed status detail is no invitation
        return False
    return status is not None and any(d.Is(error_details_pb2.RetryInfo.DESCRIPTOR) for d in status.details)


def failure_text(exc: BaseException) -> str:
    """``"<kind>: <what happened>"`` for a reflection record: a gRPC failure as its status code and
    the server's own message, never an ``AioRpcError``'s multi-line Python repr."""
    kind = failure_kind(exc)
    if isinstance(exc, grpc.aio.AioRpcError):
        detail = " ".join((exc.details() or "").split())
        return f"{kind}: {exc.code().name}" + (f": {detail}" if detail else "")
    return f"{kind}: {exc}"


def failure_kind(exc: BaseException) -> str:
    """The recorded kind of a worker's failure: each cause is told apart. Whether a kind is retried
    is ``domain.RETRYABLE_FAILURES``."""
    if isinstance(exc, AuxiliaryUnavailable):
        return exc.kind  # rate_limited, server_error, timeout, connection, refused, configuration
    if isinstance(exc, NoAuxiliaryModel):
        return "no_model"
    if isinstance(exc, InvalidOutput):
        return "invalid_output"
    if isinstance(exc, EpisodePending):
        return "episode_pending"
    if isinstance(exc, grpc.aio.AioRpcError):
        code = exc.code()
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED and not _asks_to_retry(exc):
            # A limit (a full skill catalogue), not a server shedding load: asking again gets the
            # same answer. Load shedding says when to come back (RetryInfo) and is retried.
            return "rpc_limit_reached"
        return f"rpc_{code.name.lower()}"
    if isinstance(exc, TimeoutError):
        return "timeout"
    return "error"
