"""The turn lifecycle of an engine, over agentlearn's gRPC contracts.

    async with AgentLearn("127.0.0.1:50051", token=..., company="acme", seat="ana", role="swe") as al:
        context = await al.turn_start("run-42", "Bob: can you send the payments update?", senders=[bob])
        system_prompt = base_prompt + context.markdown
        tools = await al.tools()                                   # hand these to the model
        result = await al.call_tool("run-42", "refresh_memory", {"context_hint": "..."})
        await al.turn_end("run-42", outcome=Outcome.DONE, what_it_did="Sent Bob the update.")

What it remembers per turn (so ``turn_end`` can say it): the start time, the senders, the ask, the
skill ids the turn-start skills block offered (they become ``offered_skills``), every builtin the
turn called through ``call_tool`` (plus what the engine reports with ``record_tool_call``), and
whether the turn persisted a note itself, and the unit chain it started with. A turn is kept
until ``turn_end`` submitted it for good: a failed submit can be sent again, and a self-iterated
round's submit keeps it for the settling one.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import IntEnum
from typing import Any

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from agentlearn.prefetch.v1 import prefetch_service_pb2 as prefetch_pb
from agentlearn.prefetch.v1 import prefetch_service_pb2_grpc as prefetch_grpc
from agentlearn.reflector.v1 import reflector_service_pb2 as reflector_pb
from agentlearn.reflector.v1 import reflector_service_pb2_grpc as reflector_grpc

__all__ = ["RETRY_SERVICE_CONFIG", "AgentLearn", "Message", "Outcome", "Sender", "ToolResult", "TurnContext"]

_PREFETCH, _BUILTINS = "agentlearn.prefetch.v1.PrefetchService", "agentlearn.prefetch.v1.BuiltinService"
_REFLECTOR = "agentlearn.reflector.v1.ReflectorService"

RETRY_SERVICE_CONFIG: dict[str, Any] = {
    "methodConfig": [
        {
            "name": [
                {"service": _PREFETCH, "method": "BuildTurnContext"},
                {"service": _PREFETCH, "method": "ListTools"},
                {"service": _PREFETCH, "method": "GetGuidance"},
                {"service": _BUILTINS, "method": "CallTool"},
                {"service": _BUILTINS, "method": "RefreshMemory"},
                {"service": _BUILTINS, "method": "QueryEpisodes"},
                {"service": _BUILTINS, "method": "SearchKnowledge"},
                {"service": _REFLECTOR, "method": "SubmitTurn"},
                {"service": _REFLECTOR, "method": "GetReflection"},
                {"service": _REFLECTOR, "method": "ListReflections"},
            ],
            "retryPolicy": {
                "maxAttempts": 4,
                "initialBackoff": "0.2s",
                "maxBackoff": "3s",
                "backoffMultiplier": 2,
                "retryableStatusCodes": ["UNAVAILABLE"],
            },
        }
    ]
}
"""gRPC's own retries: UNAVAILABLE only, and only of the calls a second run of cannot double a
write. Reads: ListTools, GetGuidance, QueryEpisodes, SearchKnowledge, GetReflection,
ListReflections. Keyed: BuildTurnContext and RefreshMemory (by the run id: the frozen context, the
refresh ledger's answer to a repeated hint), SubmitTurn (its run id) and CallTool (its
``request_id``, which ``call_tool`` always sets, keys the note and skill version a tool writes;
use_skill's use count is not keyed, so a retried use_skill may count one use twice). Not retried:
the typed writes, whose requests carry no key (ReflectAndPersist: a second note; RefineSkill: a
second version; UseSkill: a second use counted; MarkOnboarded, DistillSkill); call the tools
through CallTool to have them retried. The same JSON works in every gRPC implementation's channel
options."""


class Outcome(IntEnum):
    """How a turn ended (``agentlearn.reflector.v1.TurnOutcome``)."""

    DONE = reflector_pb.TURN_OUTCOME_DONE
    FAILED = reflector_pb.TURN_OUTCOME_FAILED
    SELF_ITERATE = reflector_pb.TURN_OUTCOME_SELF_ITERATE
    SKIPPED = reflector_pb.TURN_OUTCOME_SKIPPED


@dataclass(frozen=True)
class Sender:
    """Who sent a message of the trigger: a handle, or a platform's id of an external person."""

    handle: str = ""
    external_id: str = ""
    platform: str = ""
    display_name: str = ""


@dataclass(frozen=True)
class Message:
    """One message of the trigger: its salient body (never the notification wrapper) and sender."""

    sender: Sender
    body: str
    send_time: datetime | None = None


@dataclass(frozen=True)
class TurnContext:
    """What turn_start returns: the markdown to append to the system prompt, and the rest."""

    turn_id: str
    markdown: str
    offered_skill_ids: tuple[str, ...]
    summary_line: str
    response: prefetch_pb.BuildTurnContextResponse


@dataclass(frozen=True)
class ToolResult:
    """One builtin's answer: the text for the model, and the typed answer as a dict."""

    text: str
    result: dict[str, Any]
    result_type: str


@dataclass
class _Turn:
    ask: str
    role: str
    start_time: datetime
    messages: tuple[Message, ...]
    senders: tuple[Sender, ...]
    unit_chain: tuple[str, ...]
    offered_skill_ids: tuple[str, ...] = ()
    tools_called: list[str] = field(default_factory=list)
    self_persisted: bool = False


def _ts(when: datetime) -> Timestamp:
    out = Timestamp()
    out.FromDatetime(when)
    return out


def _counterparty(s: Sender) -> prefetch_pb.Counterparty:
    return prefetch_pb.Counterparty(
        handle=s.handle, external_id=s.external_id, platform=s.platform, display_name=s.display_name
    )


def _sender(s: Sender) -> reflector_pb.Sender:
    return reflector_pb.Sender(
        handle=s.handle, external_id=s.external_id, platform=s.platform, display_name=s.display_name
    )


class AgentLearn:
    """One engine's connection to agentlearn, for one company and seat.

    ``token`` is sent as ``authorization: Bearer <token>`` (not needed against ``./run up`` on
    loopback, which runs in local mode). ``tls=True`` uses the system roots, or pass
    ``root_certificates`` (PEM bytes). Every call has ``timeout`` seconds; UNAVAILABLE is retried
    by gRPC itself where that cannot double a write (``RETRY_SERVICE_CONFIG``).

    ``address`` (or ``channel``) serves PrefetchService and BuiltinService; SubmitTurn goes to
    ``reflector_address`` (or ``reflector_channel``), the same one unless given: in the split and
    Kubernetes deployments the reflector is a service of its own, at an address of its own.
    """

    def __init__(
        self,
        address: str,
        *,
        company: str,
        seat: str,
        role: str = "",
        token: str | None = None,
        unit_chain: Sequence[str] = (),
        tls: bool = False,
        root_certificates: bytes | None = None,
        timeout: float = 60.0,
        channel: grpc.aio.Channel | None = None,
        reflector_address: str | None = None,
        reflector_channel: grpc.aio.Channel | None = None,
    ):
        self.company, self.seat, self.role = company, seat, role
        self.unit_chain = tuple(unit_chain)
        self.timeout = timeout
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        options = [("grpc.service_config", json.dumps(RETRY_SERVICE_CONFIG)), ("grpc.enable_retries", 1)]
        self._owned: list[grpc.aio.Channel] = []

        def open_channel(target: str) -> grpc.aio.Channel:
            if tls or root_certificates:
                credentials = grpc.ssl_channel_credentials(root_certificates=root_certificates)
                opened = grpc.aio.secure_channel(target, credentials, options)
            else:
                opened = grpc.aio.insecure_channel(target, options)
            self._owned.append(opened)
            return opened

        self._channel = channel if channel is not None else open_channel(address)
        if reflector_channel is not None:
            self._reflector_channel = reflector_channel
        elif reflector_address is not None:
            self._reflector_channel = open_channel(reflector_address)
        else:
            self._reflector_channel = self._channel
        self.prefetch = prefetch_grpc.PrefetchServiceStub(self._channel)
        self.builtins = prefetch_grpc.BuiltinServiceStub(self._channel)
        self.reflector = reflector_grpc.ReflectorServiceStub(self._reflector_channel)
        self._turns: dict[str, _Turn] = {}

    async def __aenter__(self) -> AgentLearn:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        for opened in self._owned:
            await opened.close()

    def _kw(self) -> dict[str, Any]:
        return {"timeout": self.timeout, "metadata": self._metadata}

    # ------------------------------------------------------------------ turn start

    async def turn_start(
        self,
        turn_id: str,
        ask: str = "",
        *,
        senders: Iterable[Sender] = (),
        messages: Iterable[Message] = (),
        role: str | None = None,
        requires_recon: bool = False,
        unit_chain: Sequence[str] | None = None,
    ) -> TurnContext:
        """BuildTurnContext for a new turn. ``ask`` is what the turn was asked (each message's
        salient body); with ``messages`` and no ``ask``, their bodies joined. The skill ids of the
        skills block are remembered as the turn's offered skills.

        Several ``senders`` need ``messages`` (each body with its own sender, as turn_end must
        send them): refused here with ValueError, before the turn starts, not at its end."""
        messages = tuple(messages)
        senders = tuple(senders) or tuple(dict.fromkeys(m.sender for m in messages))
        if len(senders) > 1 and not messages:
            raise ValueError("several senders: pass messages= to turn_start so each body keeps its sender")
        chain = tuple(self.unit_chain if unit_chain is None else unit_chain)
        ask = ask or "\n".join(m.body for m in messages)
        role = role or self.role
        started = datetime.now(UTC)
        response = await self.prefetch.BuildTurnContext(
            prefetch_pb.BuildTurnContextRequest(
                company=self.company,
                seat=self.seat,
                role=role,
                turn_id=turn_id,
                ask=ask,
                requires_recon=requires_recon,
                senders=[_counterparty(s) for s in senders],
                unit_chain=list(chain),
            ),
            **self._kw(),
        )
        offered = tuple(i for b in response.blocks if b.block == prefetch_pb.BLOCK_SKILLS for i in b.ids)
        self._turns[turn_id] = _Turn(ask, role, started, messages, senders, chain, offered)
        return TurnContext(turn_id, response.markdown, offered, response.summary.line, response)

    async def tools(self, role: str | None = None) -> list[dict[str, Any]]:
        """The builtins for the role as OpenAI-style function tools (hand them to the model)."""
        listed = await self.prefetch.ListTools(
            prefetch_pb.ListToolsRequest(company=self.company, role=role or self.role, seat=self.seat), **self._kw()
        )
        return [json.loads(t.openai_tool_json) for t in listed.tools]

    # ------------------------------------------------------------------ mid-turn

    async def call_tool(
        self, turn_id: str, name: str, arguments: dict[str, Any] | str | None = None, *, request_id: str | None = None
    ) -> ToolResult:
        """Forward one model tool call (CallTool). Refusals raise ``grpc.aio.AioRpcError`` with a
        rich status (``agentlearn_client.error_details``). ``request_id`` defaults to a fresh key,
        so gRPC's retry of this call writes once."""
        turn = self._turns.get(turn_id)
        text = arguments if isinstance(arguments, str) else json.dumps(arguments or {})
        answer = await self.builtins.CallTool(
            prefetch_pb.CallToolRequest(
                name=name,
                arguments_json=text,
                company=self.company,
                seat=self.seat,
                role=turn.role if turn else self.role,
                turn_id=turn_id,
                senders=[_counterparty(s) for s in (turn.senders if turn else ())],
                unit_chain=list(turn.unit_chain if turn else self.unit_chain),
                request_id=request_id or uuid.uuid4().hex,
            ),
            **self._kw(),
        )
        if turn is not None:
            turn.tools_called.append(name)
            turn.self_persisted |= name == "reflect_and_persist"
        return ToolResult(answer.text, json.loads(answer.result_json or "{}"), answer.result_type)

    def record_tool_call(self, turn_id: str, name: str) -> None:
        """A tool the engine ran itself (not a builtin): it belongs in the turn's tools_called."""
        self._turns[turn_id].tools_called.append(name)

    # ------------------------------------------------------------------ turn end

    async def turn_end(
        self,
        turn_id: str,
        *,
        outcome: Outcome | int,
        what_it_did: str,
        label: str = "",
        tool_sequence: Sequence[str] | None = None,
        tools_called: Sequence[str] | None = None,
        review_outcome: str = "",
        conversation_id: str = "",
        work_key: str = "",
        work_item: str = "",
        trigger_kind: int = reflector_pb.TRIGGER_KIND_UNSPECIFIED,
        learning_enabled: bool | None = None,
    ) -> reflector_pb.SubmitTurnResponse:
        """SubmitTurn: the turn as the reflector needs it. ``tools_called`` defaults to every tool
        the turn called through this client (with record_tool_call); ``tool_sequence`` (the final
        round's tools, in order) defaults to the same. Resubmitting a run id is a no-op.

        The turn is forgotten only once SubmitTurn succeeded with a settled outcome: after an error
        (UNAVAILABLE past the retries, DEADLINE_EXCEEDED, a refusal) call turn_end again, and after
        ``Outcome.SELF_ITERATE`` send the settling event with turn_end under the same ``turn_id``."""
        turn = self._turns[turn_id]
        called = list(turn.tools_called if tools_called is None else tools_called)
        if turn.messages:
            interactions = [
                reflector_pb.InboundInteraction(
                    sender=_sender(m.sender), body=m.body, send_time=_ts(m.send_time) if m.send_time else None
                )
                for m in turn.messages
            ]
        else:  # at most one sender: turn_start refused several without messages
            interactions = [reflector_pb.InboundInteraction(sender=_sender(s), body=turn.ask) for s in turn.senders]
        completed = reflector_pb.TurnCompleted(
            turn_id=turn_id,
            work_key=work_key,
            company=self.company,
            seat=self.seat,
            role=turn.role,
            label=label,
            ask="" if interactions else turn.ask,
            what_it_did=what_it_did,
            outcome=int(outcome),
            review_outcome=review_outcome,
            tool_sequence=list(called if tool_sequence is None else tool_sequence),
            tools_called=called,
            offered_skills=[reflector_pb.OfferedSkill(id=i) for i in turn.offered_skill_ids],
            interactions=interactions,
            self_persisted=turn.self_persisted,
            trigger_kind=trigger_kind,
            start_time=_ts(turn.start_time),
            end_time=_ts(datetime.now(UTC)),
            conversation_id=conversation_id,
            work_item=work_item,
        )
        if learning_enabled is not None:
            completed.learning_enabled = learning_enabled
        submitted = await self.reflector.SubmitTurn(reflector_pb.SubmitTurnRequest(turn=completed), **self._kw())
        if int(outcome) != Outcome.SELF_ITERATE:
            self._turns.pop(turn_id, None)
        return submitted
