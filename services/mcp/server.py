"""An MCP server in front of a running agentlearn: one seat's memory for any MCP client.

It is a gRPC client of agentlearn (no database, no model of its own) and exposes, for the company,
seat and role it was started for:

- **tools**: exactly what ``PrefetchService.ListTools`` offers the role (refresh_memory,
  query_episodes, reflect_and_persist, use_skill, refine_skill, search_knowledge, mark_onboarded),
  each with its JSON schema, each call forwarded to ``BuiltinService.CallTool`` — so the list and
  the validation follow the server's configuration with no code here per tool. A refusal comes
  back as a tool result with ``isError`` set and the status in words (code, message, each bad
  argument), so the model can correct itself.
- **a resource template** ``agentlearn://turn-context/{turn_id}{?ask}``: the turn-start context
  (``BuildTurnContext``'s markdown: similar prior work, personal memory, skills, knowledge,
  onboarding) for a task; and a static resource ``agentlearn://guidance``, the guidance that goes
  with the tools.
- **a prompt** ``turn_start`` (arguments ``ask``, required, and optional ``turn_id``): the same
  context as a message to start a task with.

The turn: tool calls are charged to a run id (refresh_memory's cap of refreshes is per run). It is
the ``agentlearn/turn_id`` a client puts in a request's ``_meta``, else the turn whose context that
client's MCP session read last (the resource or the prompt starts a turn; each HTTP client has its
own session, stdio has one), else one chosen when the server started.

A call agentlearn refuses is a JSON-RPC error: -32602 for INVALID_ARGUMENT, -32001 ("refused") for a
refusal the caller can act on (no or a bad token, no scope, not found, a cap spent, a precondition),
with the gRPC status and the ErrorInfo reason in the error's ``data``; -32603 only when agentlearn
could not answer (UNAVAILABLE, INTERNAL, UNKNOWN, DEADLINE_EXCEEDED).
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import mcp_types as types
from mcp.server import Server
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp.shared.uri_template import UriTemplate

from agentlearn.prefetch.v1 import prefetch_service_pb2 as pb
from agentlearn.prefetch.v1 import prefetch_service_pb2_grpc as pb_grpc
from libs.common.status_details import status_details

__all__ = ["CONTEXT_TEMPLATE", "GUIDANCE_URI", "REFUSED", "TURN_META_KEY", "Seat", "build_server", "describe_rpc_error"]

_log = logging.getLogger(__name__)

CONTEXT_TEMPLATE = "agentlearn://turn-context/{turn_id}{?ask}"
"""The turn-start context of one turn, for the task ``ask``."""
GUIDANCE_URI = "agentlearn://guidance"
"""The conditional guidance blocks of the role's builtin tools."""
TURN_META_KEY = "agentlearn/turn_id"
"""A request ``_meta`` key naming the run id a tool call belongs to."""
_INVALID_PARAMS = -32602
_UNAVAILABLE = -32603
_SESSIONS_KEPT = 1024
REFUSED = -32001
"""The JSON-RPC error code of a refusal the caller can act on (JSON-RPC leaves -32000..-32099 to
servers); the gRPC status and ErrorInfo reason are in the error's ``data``."""
_REFUSALS = frozenset(
    {
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.ABORTED,
    }
)


@dataclass
class Seat:
    """Who this server acts for, and how it reaches agentlearn."""

    channel: grpc.aio.Channel
    company: str
    seat: str
    role: str
    token: str = ""
    unit_chain: Sequence[str] = ()
    timeout: float = 60.0
    turn_id: str = field(default_factory=lambda: f"mcp-{uuid.uuid4().hex[:16]}")
    """The turn a session starts on (each session then moves its own with the context it reads)."""

    def metadata(self, ctx: ServerRequestContext[Any, Any] | None = None) -> tuple[tuple[str, str], ...]:
        """The bearer token: the MCP HTTP request's own ``Authorization`` header when it has one (each
        client then acts as itself), else the token this server was started with."""
        request = getattr(ctx, "request", None) if ctx is not None else None
        headers = getattr(request, "headers", None)
        header = headers.get("authorization", "") if headers is not None else ""
        if header:
            return (("authorization", header),)
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()


def describe_rpc_error(err: grpc.aio.AioRpcError) -> str:
    """A refusal in words: the code, the message, and each violated field (google.rpc.BadRequest),
    with the ErrorInfo reason."""
    if err.code() == grpc.StatusCode.UNAUTHENTICATED:
        # agentlearn's words speak of gRPC call metadata; an MCP client fixes this on its request
        # (the ErrorInfo reason below still says which: missing, unknown, expired).
        lines = [
            "UNAUTHENTICATED: agentlearn needs a valid bearer token: send 'Authorization: Bearer <token>' on "
            "the MCP HTTP request (a stdio server is started with --token)"
        ]
    else:
        lines = [f"{err.code().name}: {err.details() or ''}".strip()]
    said = status_details(err)
    if said.info is not None:
        lines.append(f"reason: {said.info.reason} ({said.info.domain})")
    if said.bad is not None:
        lines.extend(f"- {v.field}: {v.description}" for v in said.bad.field_violations)
    return "\n".join(lines)


def rpc_error(err: grpc.aio.AioRpcError) -> MCPError:
    """A gRPC failure as a JSON-RPC error whose code says whose it is: the caller's arguments
    (-32602), a refusal the caller can act on (REFUSED, status and reason in ``data``), or
    agentlearn not answering (-32603)."""
    code = err.code()
    said = status_details(err)
    data: dict[str, Any] = {"status": code.name}
    if said.info is not None:
        data["reason"] = said.info.reason
        data["domain"] = said.info.domain
    if said.bad is not None:
        data["fields"] = [{"field": v.field, "description": v.description} for v in said.bad.field_violations]
    message = describe_rpc_error(err)
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return MCPError(_INVALID_PARAMS, message, data)
    if code in _REFUSALS:
        return MCPError(REFUSED, message, data)
    return MCPError(_UNAVAILABLE, message, data)


def build_server(seat: Seat, *, public: bool = False) -> Server[Any]:
    """The MCP server for ``seat`` (serve it over stdio or streamable HTTP). ``public``: served to
    whoever reaches a non-loopback port, so ``initialize`` (answered before any token is checked)
    names no company, seat or role."""
    prefetch = pb_grpc.PrefetchServiceStub(seat.channel)
    builtins = pb_grpc.BuiltinServiceStub(seat.channel)
    template = UriTemplate.parse(CONTEXT_TEMPLATE)
    # The current turn of each HTTP client (the latest few hundred), so one client's context read
    # never moves another's turn nor has its calls charged to it. A client is its MCP session when
    # the protocol has one, else its bearer token (who it acts as; the modern protocol has no
    # sessions); stdio is one client, its turn the seat's.
    turns: OrderedDict[str, str] = OrderedDict()

    def session_of(ctx: ServerRequestContext[Any, Any] | None) -> str | None:
        """Which HTTP client sent the request, None for stdio. Sessionless requests without a token
        (agentlearn in local mode, one user) are all one client, "anonymous"."""
        request = getattr(ctx, "request", None) if ctx is not None else None
        headers = getattr(request, "headers", None)
        if headers is None:
            return None
        if session := str(headers.get("mcp-session-id", "")):
            return f"session:{session}"
        if token := str(headers.get("authorization", "")):
            return f"token:{hashlib.sha256(token.encode()).hexdigest()}"
        return "anonymous"

    def current_turn(ctx: ServerRequestContext[Any, Any]) -> str:
        session = session_of(ctx)
        return seat.turn_id if session is None else turns.get(session, seat.turn_id)

    def start_turn(ctx: ServerRequestContext[Any, Any] | None, turn_id: str) -> None:
        session = session_of(ctx)
        if session is None:
            seat.turn_id = turn_id
        else:
            turns[session] = turn_id
            turns.move_to_end(session)
            while len(turns) > _SESSIONS_KEPT:
                turns.popitem(last=False)

    def turn_of(ctx: ServerRequestContext[Any, Any], meta: Any) -> str | None:
        """The run id a tool call is charged to; None when ``_meta`` names one that is no run id (a
        number, a blank): charging the call elsewhere would spend another turn's refreshes."""
        if not isinstance(meta, dict) or TURN_META_KEY not in meta:
            return current_turn(ctx)
        value = meta[TURN_META_KEY]
        return value.strip() if isinstance(value, str) and value.strip() else None

    async def rpc(ctx: ServerRequestContext[Any, Any] | None, method: Any, request: Any) -> Any:
        """One call to agentlearn; a failure to reach it or a refusal is an MCP error in words."""
        try:
            return await method(request, timeout=seat.timeout, metadata=seat.metadata(ctx))
        except grpc.aio.AioRpcError as err:
            raise rpc_error(err) from None

    async def list_tools(ctx: ServerRequestContext[Any, Any], params: Any) -> types.ListToolsResult:
        listed = await rpc(
            ctx, prefetch.ListTools, pb.ListToolsRequest(company=seat.company, role=seat.role, seat=seat.seat)
        )
        return types.ListToolsResult(
            tools=[
                types.Tool(name=t.name, description=t.description, input_schema=json.loads(t.parameters_json))
                for t in listed.tools
            ]
        )

    async def call_tool(
        ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        turn_id = turn_of(ctx, params.meta)
        if turn_id is None:
            said = f"INVALID_ARGUMENT: _meta {TURN_META_KEY} must be a non-empty string (the turn's run id)"
            return types.CallToolResult(content=[types.TextContent(text=said)], is_error=True)
        request = pb.CallToolRequest(
            name=params.name,
            arguments_json=json.dumps(params.arguments or {}),
            company=seat.company,
            seat=seat.seat,
            role=seat.role,
            turn_id=turn_id,
            unit_chain=list(seat.unit_chain),
            # One key per MCP call: a retry of this gRPC call (never of the model's call) writes once.
            request_id=f"mcp-{uuid.uuid4().hex}",
        )
        try:
            answer = await builtins.CallTool(request, timeout=seat.timeout, metadata=seat.metadata(ctx))
        except grpc.aio.AioRpcError as err:
            # A refusal is the model's to read and act on (a too-long note, a missing argument).
            return types.CallToolResult(content=[types.TextContent(text=describe_rpc_error(err))], is_error=True)
        return types.CallToolResult(
            content=[types.TextContent(text=answer.text)], structured_content=json.loads(answer.result_json)
        )

    async def context_markdown(ctx: ServerRequestContext[Any, Any] | None, turn_id: str, ask: str) -> str:
        built = await rpc(
            ctx,
            prefetch.BuildTurnContext,
            pb.BuildTurnContextRequest(
                company=seat.company,
                seat=seat.seat,
                role=seat.role,
                turn_id=turn_id,
                ask=ask,
                unit_chain=list(seat.unit_chain),
            ),
        )
        # Reading a turn's context starts that turn, once it is read: a read refused (no turn id,
        # one past its limit) or unanswered leaves the current turn as it was, so later tool calls
        # without _meta are never refused on a turn id the client did not send.
        start_turn(ctx, turn_id)
        return built.markdown or f"(No learned context for this task yet. {built.summary.line})"

    async def list_resource_templates(ctx: ServerRequestContext[Any, Any], params: Any) -> Any:
        return types.ListResourceTemplatesResult(
            resource_templates=[
                types.ResourceTemplate(
                    name="turn-context",
                    uri_template=CONTEXT_TEMPLATE,
                    description="What agentlearn learned that bears on a task (ask): similar prior work, personal "
                    "memory, skills, knowledge, onboarding. Reading it starts the turn turn_id.",
                    mime_type="text/markdown",
                )
            ]
        )

    async def list_resources(ctx: ServerRequestContext[Any, Any], params: Any) -> types.ListResourcesResult:
        return types.ListResourcesResult(
            resources=[
                types.Resource(
                    name="guidance",
                    uri=GUIDANCE_URI,
                    description="How to use the memory tools well (the guidance that goes with them).",
                    mime_type="text/markdown",
                )
            ]
        )

    async def read_resource(ctx: ServerRequestContext[Any, Any], params: types.ReadResourceRequestParams) -> Any:
        uri = str(params.uri)
        if uri == GUIDANCE_URI:
            tools = await rpc(
                ctx, prefetch.ListTools, pb.ListToolsRequest(company=seat.company, role=seat.role, seat=seat.seat)
            )
            guidance = await rpc(
                ctx,
                prefetch.GetGuidance,
                pb.GetGuidanceRequest(
                    company=seat.company, role=seat.role, registered_tools=[t.name for t in tools.tools]
                ),
            )
            text = "\n\n".join(b.markdown for b in guidance.blocks)
        else:
            matched = template.match(uri)
            if matched is None:
                raise MCPError(_INVALID_PARAMS, f"unknown resource {uri}; read {CONTEXT_TEMPLATE} or {GUIDANCE_URI}")
            turn_id, ask = str(matched.get("turn_id") or ""), str(matched.get("ask") or "")
            text = await context_markdown(ctx, turn_id, ask)
        return types.ReadResourceResult(
            contents=[types.TextResourceContents(uri=uri, mime_type="text/markdown", text=text)]
        )

    async def list_prompts(ctx: ServerRequestContext[Any, Any], params: Any) -> types.ListPromptsResult:
        return types.ListPromptsResult(
            prompts=[
                types.Prompt(
                    name="turn_start",
                    description="Start a task with what agentlearn learned that bears on it.",
                    arguments=[
                        types.PromptArgument(name="ask", description="The task, as it was asked.", required=True),
                        types.PromptArgument(name="turn_id", description="A run id for this turn (optional)."),
                    ],
                )
            ]
        )

    async def get_prompt(ctx: ServerRequestContext[Any, Any], params: types.GetPromptRequestParams) -> Any:
        if params.name != "turn_start":
            raise MCPError(_INVALID_PARAMS, f"unknown prompt {params.name}; the prompt is turn_start")
        arguments = params.arguments or {}
        ask = arguments.get("ask", "")
        if not ask.strip():
            raise MCPError(
                _INVALID_PARAMS,
                "turn_start needs ask: the task, as it was asked",
                {"status": "INVALID_ARGUMENT", "fields": [{"field": "ask", "description": "required"}]},
            )
        turn_id = arguments.get("turn_id") or f"mcp-{uuid.uuid4().hex[:16]}"
        markdown = await context_markdown(ctx, turn_id, ask)
        text = f"{markdown}\n\n---\n\nThe task (turn {turn_id}):\n{ask}"
        return types.GetPromptResult(
            description=f"Learned context for turn {turn_id}",
            messages=[types.PromptMessage(role="user", content=types.TextContent(text=text))],
        )

    return Server(
        "agentlearn",
        version="1",
        instructions=(
            ("A seat's memory" if public else f"Memory of {seat.seat} ({seat.role}, {seat.company})")
            + ": read the turn-context resource or the turn_start prompt at the start of a task, then use the "
            "tools as their descriptions say."
        ),
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_list_resources=list_resources,
        on_list_resource_templates=list_resource_templates,
        on_read_resource=read_resource,
        on_list_prompts=list_prompts,
        on_get_prompt=get_prompt,
    )
