"""``./run mcp``: flags (each with an environment default), the gRPC channel, and the transport.

    ./run mcp --company acme --seat ana --role swe                  # stdio (an IDE spawns it)
    ./run mcp --transport http --port 8765 --company acme ...       # streamable HTTP on /mcp

Over stdio, stdout is the protocol: everything this process says goes to stderr.

Over HTTP on an address other than loopback, whoever reaches the port is a client, so the server
lends nothing: it refuses to start with a ``--token`` (every client would act with it), and it
refuses to start in front of an agentlearn that answers a call carrying no token (local mode),
which would trust whoever reaches the port. It starts only when a call with no credential is
refused UNAUTHENTICATED: each client then acts as its own ``Authorization: Bearer``. A request that
sends none is answered 401 with ``WWW-Authenticate: Bearer`` before any MCP exchange (so an
anonymous caller learns nothing, not even whose memory this is), and ``initialize``'s instructions
name no company, seat or role.

Over HTTP on a loopback address, whoever reaches the port is this machine, and a web page its
browser opens must not be: a page that rebinds its own name to the bound address would send
``Host: attacker.example``, a page on another local port an ``Origin`` of its own. So the server
answers only a ``Host`` that names the bound address (or ``localhost``, when that is 127.0.0.1 or
::1) with the bound port, and only an ``Origin`` of that same http origin (or none). The SDK turns
such checks on by itself only for ``--host`` spelled 127.0.0.1, localhost or ::1, and then lets
any loopback name and port through; here they hold for every loopback address (127.0.0.2 too).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from agentlearn.prefetch.v1 import prefetch_service_pb2 as pb
from agentlearn.prefetch.v1 import prefetch_service_pb2_grpc as pb_grpc
from libs.common.auth import is_loopback
from services.mcp.server import REFUSED, Seat, build_server

if TYPE_CHECKING:
    from mcp.server import Server
    from mcp.server.transport_security import TransportSecuritySettings

__all__ = ["main", "parse_args"]


def _env(flag: str) -> str:
    """The environment variable a flag defaults to: ``unit_chain`` reads ``AGENTLEARN_UNIT_CHAIN``."""
    return f"AGENTLEARN_{flag.upper()}"


def parse_args(argv: list[str], env: dict[str, str] | None = None) -> argparse.Namespace:
    env = dict(os.environ) if env is None else env
    p = argparse.ArgumentParser(
        prog="./run mcp",
        description="An MCP server exposing one seat's agentlearn memory (tools, turn-start context) to any "
        "MCP client. Each flag defaults to the environment variable named in its help.",
    )
    p.add_argument(
        "--address",
        default=env.get(_env("address"), "127.0.0.1:50051"),
        help="agentlearn's gRPC address (AGENTLEARN_ADDRESS; default %(default)s)",
    )
    p.add_argument(
        "--token",
        default=env.get(_env("token"), ""),
        help="bearer token for agentlearn "
        "(AGENTLEARN_TOKEN; not needed in local mode). Over HTTP a client's own Authorization header wins; "
        "refused with --transport http on a non-loopback --host",
    )
    p.add_argument("--company", default=env.get(_env("company"), ""), help="the company (AGENTLEARN_COMPANY)")
    p.add_argument("--seat", default=env.get(_env("seat"), ""), help="the seat whose memory this is (AGENTLEARN_SEAT)")
    p.add_argument("--role", default=env.get(_env("role"), ""), help="the seat's role (AGENTLEARN_ROLE)")
    p.add_argument(
        "--unit-chain",
        default=env.get(_env("unit_chain"), ""),
        help="the seat's units from its own up, comma-separated (AGENTLEARN_UNIT_CHAIN; for onboarding)",
    )
    p.add_argument("--tls", action="store_true", help="reach agentlearn over TLS with the system's roots")
    p.add_argument(
        "--tls-ca",
        default=env.get(_env("tls_ca"), ""),
        help="reach agentlearn over TLS trusting this CA bundle (AGENTLEARN_TLS_CA)",
    )
    p.add_argument("--turn-id", default="", help="the run id tool calls belong to until a context read starts another")
    p.add_argument("--timeout", type=float, default=60.0, help="deadline of each call to agentlearn, seconds")
    p.add_argument("--transport", choices=["stdio", "http"], default="stdio", help="stdio (default) or streamable HTTP")
    p.add_argument("--host", default="127.0.0.1", help="HTTP: the address to bind (default %(default)s)")
    p.add_argument("--port", type=int, default=8765, help="HTTP: the port (0: any free one; default %(default)s)")
    p.add_argument("--path", default="/mcp", help="HTTP: the endpoint path (default %(default)s)")
    args = p.parse_args(argv)
    missing = [f"--{n}" for n in ("company", "seat", "role") if not getattr(args, n).strip()]
    if missing:
        p.error(f"{', '.join(missing)} required (or {', '.join(_env(m[2:]) for m in missing)})")
    return args


def _channel(args: argparse.Namespace) -> grpc.aio.Channel:
    if args.tls or args.tls_ca:
        roots = Path(args.tls_ca).read_bytes() if args.tls_ca else None
        return grpc.aio.secure_channel(args.address, grpc.ssl_channel_credentials(root_certificates=roots))
    return grpc.aio.insecure_channel(args.address)


def _say(text: str) -> None:
    print(f"agentlearn-mcp: {text}", file=sys.stderr, flush=True)


_NOT_ANSWERED = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED)
"""Codes of a probe that learned nothing about agentlearn's authentication."""


async def _open_to_anyone(channel: grpc.aio.Channel, args: argparse.Namespace) -> str | None:
    """Why serving ``args.host`` would let whoever reaches it use agentlearn, or None: agentlearn
    must refuse a call that carries no credential (ListTools of this seat, sent without one)."""
    request = pb.ListToolsRequest(company=args.company.strip(), role=args.role.strip(), seat=args.seat.strip())
    try:
        await pb_grpc.PrefetchServiceStub(channel).ListTools(request, timeout=args.timeout, wait_for_ready=True)
    except grpc.aio.AioRpcError as err:
        if err.code() == grpc.StatusCode.UNAUTHENTICATED:
            return None
        if err.code() in _NOT_ANSWERED:
            return (
                f"refusing to serve {args.host}: cannot confirm that agentlearn at {args.address} requires tokens "
                f"({err.code().name}: {err.details()}); start it first, with --require-auth"
            )
    return (
        f"refusing to serve {args.host}: agentlearn at {args.address} answers calls that carry no token "
        f"(local mode), so anyone who reaches this port would read and write {args.company}/{args.seat}'s memory. "
        "Bind loopback (--host 127.0.0.1), or run agentlearn with --require-auth so each MCP client sends "
        "its own 'Authorization: Bearer'."
    )


async def main(argv: list[str]) -> int:
    args = parse_args(argv)
    public = args.transport == "http" and not is_loopback(args.host)
    if public and args.token:
        _say(
            f"refusing to serve {args.host}: this server's token would act for anyone who reaches the port. "
            "Bind loopback, or start without --token in front of an agentlearn that requires tokens "
            "(--require-auth), so each MCP client sends its own 'Authorization: Bearer'."
        )
        return 2
    channel = _channel(args)
    if public and (refusal := await _open_to_anyone(channel, args)) is not None:
        await channel.close()
        _say(refusal)
        return 2
    seat = Seat(
        channel=channel,
        company=args.company.strip(),
        seat=args.seat.strip(),
        role=args.role.strip(),
        token=args.token.strip(),
        unit_chain=[u.strip() for u in args.unit_chain.split(",") if u.strip()],
        timeout=args.timeout,
    )
    if args.turn_id:
        seat.turn_id = args.turn_id
    server = build_server(seat, public=public)
    who = f"{seat.company}/{seat.seat} ({seat.role}) via {args.address}"
    try:
        if args.transport == "stdio":
            from mcp.server.stdio import stdio_server

            _say(f"serving MCP on stdio for {who}")
            async with stdio_server() as (read, write):
                await server.run(read, write, server.create_initialization_options())
        else:
            await _serve_http(server, args, who)
    finally:
        await channel.close()
    return 0


def _loopback_security(host: str, bound: str, port: int) -> TransportSecuritySettings | None:
    """The SDK's Host/Origin (DNS rebinding) checks for a server bound to loopback address ``bound``
    (``host`` as the flag spelled it) on ``port``: this origin's names only. None off loopback,
    where each client brings its own token (see the module's docstring) and the SDK checks neither."""
    from mcp.server.transport_security import TransportSecuritySettings

    if not is_loopback(host):
        return None
    names = {host.strip("[]").lower(), bound}
    if bound in ("127.0.0.1", "::1"):
        names.add("localhost")  # a browser reaches 127.0.0.1 and ::1 as localhost too
    authorities = sorted(f"[{n}]" if ":" in n else n for n in names)
    hosts = [f"{a}:{port}" for a in authorities] + (authorities if port == 80 else [])
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=hosts,
        # The server speaks plain HTTP, so its pages' origin is http:// (the port unsaid when 80).
        allowed_origins=[f"http://{h}" for h in hosts],
    )


_UNAUTHORIZED = json.dumps(
    {
        "jsonrpc": "2.0",
        "id": None,
        "error": {
            "code": REFUSED,
            "message": "UNAUTHENTICATED: send 'Authorization: Bearer <token>' on the MCP HTTP request",
            "data": {"status": "UNAUTHENTICATED"},
        },
    }
).encode()


def _require_bearer(app: Any) -> Any:
    """``app`` (ASGI) answering an HTTP request with no ``Authorization: Bearer`` 401 before the MCP
    exchange starts: on a public address agentlearn would refuse it anyway, and ``initialize``
    would otherwise answer it. Whether the token is valid is agentlearn's to say, call by call."""

    async def guarded(scope: Any, receive: Any, send: Any) -> None:
        if scope.get("type") == "http":
            header = dict(scope.get("headers") or ()).get(b"authorization", b"")
            if not header.lower().startswith(b"bearer ") or not header[7:].strip():
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [
                            (b"www-authenticate", b'Bearer realm="agentlearn"'),
                            (b"content-type", b"application/json"),
                            (b"content-length", str(len(_UNAUTHORIZED)).encode()),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": _UNAUTHORIZED})
                return
        await app(scope, receive, send)

    return guarded


async def _serve_http(server: Server[Any], args: argparse.Namespace, who: str) -> None:
    import uvicorn

    family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.bind((args.host, args.port))
    except OSError as err:
        sock.close()
        _say(f"cannot bind {args.host}:{args.port}: {err.strerror}")
        raise SystemExit(2) from None
    sock.listen(128)
    bound, port = sock.getsockname()[:2]
    # Built once the port is known (``--port 0``): the checks name it.
    app = server.streamable_http_app(
        streamable_http_path=args.path,
        host=args.host,
        transport_security=_loopback_security(args.host, bound, port),
    )
    served: Any = _require_bearer(app) if not is_loopback(args.host) else app
    host = f"[{args.host}]" if family == socket.AF_INET6 else args.host
    # The socket already queues connections, so the line is true as soon as it is printed.
    _say(f"serving MCP (streamable HTTP) on http://{host}:{port}{args.path} for {who}")
    config = uvicorn.Config(served, log_level="warning", lifespan="on")
    await uvicorn.Server(config).serve(sockets=[sock])
