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
- **a prompt** ``turn_start`` (arguments ``ask``, optional ``turn_id``): the same context as a
  message to start a task with.

The turn: tool calls are charged to a run id (refresh_memory's cap of refreshes is per run). It is
the ``agentlearn/turn_id`` a client puts in a request's ``_meta``, else the turn whose context was
read last (the resource or the prompt starts a turn), else one chosen when the server started.
"""

from __future__ import annotations

import json
import logging
import uuid
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

__all__ = ["CONTEXT_TEMPLATE", "GUIDANCE_URI", "TURN_META_KEY", "Seat", "build_server", "describe_rpc_error"]

_log = logging.getLogger(__name__)

CONTEXT_TEMPLATE = "agentlearn://turn-context/{turn_id}{?ask}"
"""The turn-start context of one turn, for the task ``ask``."""
GUIDANCE_URI = "agentlearn://guidance"
"""The conditional guidance blocks of the role's builtin tools."""
TURN_META_KEY = "agentlearn/turn_id"
"""A request ``_meta`` key naming the run id a tool call belongs to."""
_INVALID_PARAMS = -32602
_UNAVAILABLE = -32603


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
    """The current turn: set at start, moved by every context read that succeeds."""

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
    lines = [f"{err.code().name}: {err.details() or ''}".strip()]
    said = status_details(err)
    if said.info is not None:
        lines.append(f"reason: {said.info.reason} ({said.info.domain})")
    if said.bad is not None:
        lines.extend(f"- {v.field}: {v.description}" for v in said.bad.field_violations)
    return "\n".join(lines)


def _turn_of(seat: Seat, meta: Any) -> str:
    value = meta.get(TURN_META_KEY) if isinstance(meta, dict) else None
    return value if isinstance(value, str) and value.strip() else seat.turn_id


def build_server(seat: Seat) -> Server[Any]:
    """The MCP server for ``seat`` (serve it over stdio or streamable HTTP)."""
    prefetch = pb_grpc.PrefetchServiceStub(seat.channel)
    builtins = pb_grpc.BuiltinServiceStub(seat.channel)
    template = UriTemplate.parse(CONTEXT_TEMPLATE)

    async def rpc(ctx: ServerRequestContext[Any, Any] | None, method: Any, request: Any) -> Any:
        """One call to agentlearn; a failure to reach it or a refusal is an MCP error in words."""
        try:
            return await method(request, timeout=seat.timeout, metadata=seat.metadata(ctx))
        except grpc.aio.AioRpcError as err:
            code = _INVALID_PARAMS if err.code() == grpc.StatusCode.INVALID_ARGUMENT else _UNAVAILABLE
            raise MCPError(code, describe_rpc_error(err)) from None

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
        request = pb.CallToolRequest(
            name=params.name,
            arguments_json=json.dumps(params.arguments or {}),
            company=seat.company,
            seat=seat.seat,
            role=seat.role,
            turn_id=_turn_of(seat, params.meta),
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
        seat.turn_id = turn_id
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
            f"Memory of {seat.seat} ({seat.role}, {seat.company}): read the turn-context resource or the turn_start "
            "prompt at the start of a task, then use the tools as their descriptions say."
        ),
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_list_resources=list_resources,
        on_list_resource_templates=list_resource_templates,
        on_read_resource=read_resource,
        on_list_prompts=list_prompts,
        on_get_prompt=get_prompt,
    )
