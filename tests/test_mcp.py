"""``./run mcp`` (``python -m services.mcp``) driven by the official MCP SDK's own client, over
stdio and over streamable HTTP, against a real agentlearn on a loopback port: the tools are what
ListTools offers, a note written by reflect_and_persist is found by refresh_memory and is in the
turn-context resource and the turn_start prompt, a refusal is a tool result the model can read,
tool calls are charged to the turn whose context was read (or the one ``_meta`` names; a read that
was refused starts no turn), and a token's scopes hold through the MCP server."""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from mcp import Client, StdioServerParameters
from mcp.shared.exceptions import MCPError

from services.mcp.server import REFUSED, TURN_META_KEY
from tests.support.app import open_app
from tests.test_prefetch_support import SERVICES, default_settings, open_env

ROOT = Path(__file__).resolve().parents[1]
SEAT = ["--company", "acme", "--seat", "ana", "--role", "swe", "--unit-chain", "platform,engineering"]
NOTE = "Dana approves prod deploys in #releases."


@pytest.fixture
async def env(make_settings, dsn, clock, local_embedder, edge_index):
    async with open_env(default_settings(make_settings), dsn, clock, embedder=local_embedder, index=edge_index) as e:
        yield e


def stdio(port: int, *extra: str) -> Client:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "services.mcp", "--address", f"127.0.0.1:{port}", *SEAT, *extra],
        cwd=str(ROOT),
    )
    return Client(params, read_timeout_seconds=60)


@contextlib.asynccontextmanager
async def http_server(port: int, *extra: str) -> AsyncIterator[str]:
    """``python -m services.mcp --transport http --port 0`` as a subprocess; yields its URL."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "services.mcp",
        "--transport",
        "http",
        "--port",
        "0",
        "--address",
        f"127.0.0.1:{port}",
        *SEAT,
        *extra,
        cwd=str(ROOT),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stderr is not None
    said: list[str] = []
    try:
        async with asyncio.timeout(60):
            while not (match := re.search(r"on (http://\S+) for", said[-1] if said else "")):
                line = await process.stderr.readline()
                assert line, f"the MCP server exited: {''.join(said)}"
                said.append(line.decode())
        drain = asyncio.create_task(process.stderr.read())
        yield match.group(1)
    finally:
        if process.returncode is None:
            process.terminate()
            await process.wait()
        with contextlib.suppress(NameError):
            await drain


async def a_life(client: Client) -> None:
    """What any MCP client can do with the seat's memory, asserted on real answers."""
    names = {t.name for t in (await client.list_tools()).tools}
    assert {"refresh_memory", "query_episodes", "reflect_and_persist", "use_skill", "search_knowledge"} <= names
    assert "mark_onboarded" in names and "refine_skill" in names

    wrote = await client.call_tool("reflect_and_persist", {"content": NOTE})
    assert not wrote.is_error, wrote.content
    note_id = wrote.structured_content["note_id"]
    assert "Saved to your diary" in wrote.content[0].text

    found = await client.call_tool("refresh_memory", {"context_hint": "who approves prod deploys"})
    assert not found.is_error and found.structured_content["note_ids"] == [note_id]
    assert NOTE in found.content[0].text

    refused = await client.call_tool("reflect_and_persist", {"tier": "forever"})
    assert refused.is_error
    text = refused.content[0].text
    assert text.startswith("INVALID_ARGUMENT") and "- arguments_json.content: content is required" in text
    assert "reason: TOOL_ARGUMENTS_INVALID (prefetch.agentlearn.dev)" in text

    uri = "agentlearn://turn-context/turn-ctx-1?ask=When%20can%20I%20deploy%20to%20prod%3F"
    context = await client.read_resource(uri)
    assert "## Personal memory" in context.contents[0].text and NOTE in context.contents[0].text
    templates = (await client.list_resource_templates()).resource_templates
    assert [t.uri_template for t in templates] == ["agentlearn://turn-context/{turn_id}{?ask}"]

    prompt = await client.get_prompt("turn_start", {"ask": "Who approves prod deploys?", "turn_id": "turn-p-1"})
    assert NOTE in prompt.messages[0].content.text and "Who approves prod deploys?" in prompt.messages[0].content.text

    guidance = await client.read_resource("agentlearn://guidance")
    assert "reflect_and_persist" in guidance.contents[0].text


async def test_mcp_over_stdio_with_the_sdks_client(env):
    async with stdio(env.app.port) as client:
        await a_life(client)


async def test_mcp_over_streamable_http_with_the_sdks_client(env):
    async with http_server(env.app.port) as url, Client(url, read_timeout_seconds=60) as client:
        await a_life(client)


INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
}


async def initialize(url: str, **headers: str) -> int:
    """The status of one raw ``initialize`` POST to ``url`` with ``headers`` added."""
    import httpx

    accept = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
    async with httpx.AsyncClient(timeout=60) as http:
        return (await http.post(url, json=INITIALIZE, headers={**accept, **headers})).status_code


async def test_http_on_loopback_answers_only_its_own_host_and_origin(env):
    """Bound to a loopback address the SDK does not know (127.0.0.2), a page that rebinds its own
    name to it (``Host: attacker.example``), or any page of another origin, is refused before the
    MCP session starts; on 127.0.0.1 a page on another local port is another origin too. The
    server's own URL, with or without its own Origin, is served."""
    async with http_server(env.app.port, "--host", "127.0.0.2") as url:
        authority = url.split("/")[2]
        port = authority.rsplit(":", 1)[1]
        assert authority == f"127.0.0.2:{port}"
        for host in (f"attacker.example:{port}", f"localhost:{port}", f"127.0.0.1:{port}", "127.0.0.2"):
            assert await initialize(url, host=host) == 421, host
        for origin in (f"http://attacker.example:{port}", "http://127.0.0.2:3000", f"http://localhost:{port}", "null"):
            assert await initialize(url, origin=origin) == 403, origin
        assert await initialize(url) == 200
        assert await initialize(url, origin=f"http://{authority}") == 200
        async with Client(url, read_timeout_seconds=60) as client:
            assert "refresh_memory" in {t.name for t in (await client.list_tools()).tools}
    async with http_server(env.app.port) as url:
        port = url.split("/")[2].rsplit(":", 1)[1]
        assert await initialize(url, origin="http://localhost:3000") == 403
        assert await initialize(url, host=f"attacker.example:{port}") == 421
        for name in ("127.0.0.1", "localhost"):
            assert await initialize(url, host=f"{name}:{port}", origin=f"http://{name}:{port}") == 200, name


async def test_tool_calls_are_charged_to_the_turn_whose_context_was_read(env):
    async with stdio(env.app.port, "--turn-id", "turn-start") as client:

        async def spent(hint: str, **meta: str) -> int:
            answer = await client.call_tool(
                "refresh_memory", {"context_hint": hint}, meta={TURN_META_KEY: meta["turn"]} if meta else None
            )
            assert not answer.is_error, answer.content
            return answer.structured_content["refreshes_spent"]

        assert await spent("billing export") == 1  # the --turn-id turn
        await client.read_resource("agentlearn://turn-context/turn-a?ask=billing")
        assert [await spent("billing export"), await spent("deploys")] == [1, 2]  # turn-a, a fresh run
        assert await spent("holidays", turn="turn-b") == 1  # the turn _meta names
        assert await spent("holidays") == 3  # back on turn-a
        assert await spent("deploys", turn=" turn-b ") == 2  # the same turn-b, its padding stripped
        for bad in (5, "  "):  # names no turn: refused, not charged to turn-a (whose 3 are spent)
            answer = await client.call_tool("refresh_memory", {"context_hint": "x"}, meta={TURN_META_KEY: bad})
            assert answer.is_error and TURN_META_KEY in answer.content[0].text, answer.content
        with pytest.raises(MCPError) as no_ask:
            await client.get_prompt("turn_start", {})
        assert no_ask.value.code == -32602 and "ask" in no_ask.value.message


async def test_each_http_client_has_its_own_current_turn(make_settings, dsn, clock, local_embedder, edge_index):
    """One client's context read moves only its own turn: another client's calls are never charged
    to it (nor spend its refreshes). The modern protocol has no sessions: a client is its token."""
    from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

    async with open_app(
        default_settings(make_settings),
        dsn,
        names=SERVICES,
        clock=clock,
        embedder=local_embedder,
        index=edge_index,
        auth_mode="tokens",
    ) as app:
        first, _ = await app.infra.tokens.issue("acme", ["memory:read"], seat="ana")
        second, _ = await app.infra.tokens.issue("acme", ["memory:read"], seat="ana")
        async with (
            http_server(app.port) as url,
            create_mcp_http_client(headers={"authorization": f"Bearer {first}"}) as own_a,
            create_mcp_http_client(headers={"authorization": f"Bearer {second}"}) as own_b,
            Client(streamable_http_client(url, http_client=own_a), read_timeout_seconds=60) as a,
            Client(streamable_http_client(url, http_client=own_b), read_timeout_seconds=60) as b,
        ):
            await a.read_resource("agentlearn://turn-context/turn-of-a?ask=billing")
            for hint in ("deploys", "holidays", "oncall"):
                assert not (await b.call_tool("refresh_memory", {"context_hint": hint})).is_error
            mine = await a.call_tool("refresh_memory", {"context_hint": "billing export"})
            assert not mine.is_error, mine.content
            assert mine.structured_content["refreshes_spent"] == 1  # turn-of-a, untouched by b


async def test_a_context_read_that_is_refused_starts_no_turn(env):
    async with stdio(env.app.port, "--turn-id", "turn-start") as client:

        async def spent(hint: str) -> int:
            answer = await client.call_tool("refresh_memory", {"context_hint": hint})
            assert not answer.is_error, answer.content
            return answer.structured_content["refreshes_spent"]

        await client.read_resource("agentlearn://turn-context/turn-a?ask=billing")
        assert await spent("billing export") == 1  # turn-a
        # A turn id BuildTurnContext refuses (none, past 200 characters): the read fails and the
        # turn stays turn-a, so the next call without _meta is not refused on an id never sent.
        for uri, hint, count in (
            ("agentlearn://turn-context/?ask=x", "deploys", 2),
            (f"agentlearn://turn-context/{'t' * 300}?ask=x", "holidays", 3),
        ):
            with pytest.raises(Exception, match="INVALID_ARGUMENT"):
                await client.read_resource(uri)
            assert await spent(hint) == count  # still turn-a
        with pytest.raises(Exception, match="INVALID_ARGUMENT"):
            await client.get_prompt("turn_start", {"ask": "x", "turn_id": "t" * 300})
        capped = await client.call_tool("refresh_memory", {"context_hint": "oncall"})
        assert capped.is_error and capped.content[0].text.startswith("RESOURCE_EXHAUSTED")  # turn-a's 3 are spent


async def test_a_tokens_scopes_hold_through_the_mcp_server(make_settings, dsn, clock, local_embedder, edge_index):
    async with open_app(
        default_settings(make_settings),
        dsn,
        names=SERVICES,
        clock=clock,
        embedder=local_embedder,
        index=edge_index,
        auth_mode="tokens",
    ) as app:
        reader, _ = await app.infra.tokens.issue("acme", ["memory:read"], seat="ana")
        async with stdio(app.port, "--token", reader) as client:
            assert (await client.call_tool("refresh_memory", {"context_hint": "deploys"})).structured_content
            refused = await client.call_tool("reflect_and_persist", {"content": NOTE})
            assert refused.is_error and refused.content[0].text.startswith("PERMISSION_DENIED")
            assert "reason: SCOPE_MISSING" in refused.content[0].text
        async with stdio(app.port) as anonymous:
            with pytest.raises(MCPError) as refused_call:
                await anonymous.list_tools()
            # A refusal, not "Internal error": its own code, the status and reason as data, and
            # what an MCP client does about it.
            assert refused_call.value.code == REFUSED, refused_call.value.error
            assert refused_call.value.data["status"] == "UNAUTHENTICATED"
            assert refused_call.value.data["reason"]
            assert "Authorization: Bearer" in refused_call.value.message
            assert "metadata" not in refused_call.value.message


async def refused_to_start(port: int, *extra: str) -> str:
    """What ``python -m services.mcp --transport http --port 0 *extra`` said when it exited 2 without
    serving (fails, and stops it, when it serves)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "services.mcp",
        "--transport",
        "http",
        "--port",
        "0",
        "--address",
        f"127.0.0.1:{port}",
        *SEAT,
        *extra,
        cwd=str(ROOT),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stderr is not None
    said: list[str] = []
    try:
        async with asyncio.timeout(90):
            while line := (await process.stderr.readline()).decode():
                said.append(line)
                assert "serving MCP" not in line, f"it served: {''.join(said)}"
            assert await process.wait() == 2, "".join(said)
    finally:
        if process.returncode is None:
            process.terminate()
            await process.wait()
    return "".join(said)


async def test_http_on_a_public_address_in_front_of_local_mode_refuses_to_start(env):
    """agentlearn in local mode trusts a call with no token: an MCP server on 0.0.0.0 in front of it
    would hand the seat's memory to anyone who reaches its port."""
    said = await refused_to_start(env.app.port, "--host", "0.0.0.0")
    assert "refusing to serve 0.0.0.0" in said and "answers calls that carry no token" in said
    assert "--require-auth" in said
    said = await refused_to_start(env.app.port, "--host", "0.0.0.0", "--token", "agl_x")
    assert "refusing to serve 0.0.0.0" in said and "token would act for anyone" in said


async def test_http_on_a_public_address_serves_each_client_as_its_own_token(
    make_settings, dsn, clock, local_embedder, edge_index
):
    """In front of an agentlearn that requires tokens, a public MCP server forwards each client's own
    Authorization; a client without one is refused by agentlearn, never served as the server."""
    from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

    async with open_app(
        default_settings(make_settings),
        dsn,
        names=SERVICES,
        clock=clock,
        embedder=local_embedder,
        index=edge_index,
        auth_mode="tokens",
    ) as app:
        reader, _ = await app.infra.tokens.issue("acme", ["memory:read"], seat="ana")
        async with http_server(app.port, "--host", "0.0.0.0") as url:
            local = url.replace("://0.0.0.0:", "://127.0.0.1:")
            async with (
                create_mcp_http_client(headers={"authorization": f"Bearer {reader}"}) as own,
                Client(streamable_http_client(local, http_client=own), read_timeout_seconds=60) as client,
            ):
                assert "refresh_memory" in {t.name for t in (await client.list_tools()).tools}
            # One with no token is refused before the MCP exchange: it does not even learn whose
            # memory this is (initialize's instructions would name the company, seat and role).
            import httpx

            accept = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
            async with httpx.AsyncClient(timeout=60) as http:
                anonymous = await http.post(local, json=INITIALIZE, headers=accept)
                assert anonymous.status_code == 401, anonymous.text
                assert anonymous.headers["www-authenticate"].startswith("Bearer")
                assert "acme" not in anonymous.text and "ana" not in anonymous.text
                # Any bearer gets initialize (agentlearn judges the token call by call): no names in it.
                bogus = await http.post(local, json=INITIALIZE, headers={**accept, "authorization": "Bearer agl_x"})
                assert bogus.status_code == 200 and "instructions" in bogus.text, bogus.text
                assert "acme" not in bogus.text and "ana (" not in bogus.text and "swe" not in bogus.text
