"""Command line of ``./run``: ``up``, ``serve``, ``pass``, ``rebuild-index``, ``token``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from libs.common import telemetry, text_caches
from libs.common.auth import Authenticator, is_loopback
from libs.common.config import ConfigError, Settings, TelemetryConfig, load_settings
from libs.common.db import COMMON_MIGRATIONS, MigrationBlocked, migrate
from libs.common.embedded_pg import EmbeddedPostgresFailed
from libs.common.grpcserver import BindError, bind_server, create_server, drain, start_server
from libs.common.infra import Infra, SchemaBehind, open_infra, resolve_dsn
from libs.common.passrunner import LEASE_LOST, holder_identity, log_failure, run_pass, tick_forever
from libs.common.vectorindex.qdrant_edge_index import EdgeIndexInUse, exclusive_edge_index
from services.runner import security
from services.runner.registry import PASSES, SERVICES, embedder_mode, migrations_of

if TYPE_CHECKING:  # only for annotations: starlette and the component type load when used
    from starlette.applications import Starlette

    from libs.common.component import Component

_log = logging.getLogger("agentlearn")


def _passes_epilog() -> str:
    """The passes of this build, for ``--help`` (an operator should not read the code to find one)."""
    width = max(len(name) for name in PASSES)
    lines = [
        f"  {name:<{width}}  {home.service}" + (f" (calls {', '.join(home.calls)})" if home.calls else "")
        for name, home in sorted(PASSES.items())
    ]
    return "passes (name, the service it belongs to):\n" + "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="./run", description="agentlearn runner")
    sub = p.add_subparsers(dest="command", required=True)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--config", help="YAML config file (default: $AGENTLEARN_CONFIG)")
        sp.add_argument("--data-dir", help="where embedded PostgreSQL and Qdrant keep their data")
        sp.add_argument("--log-level", default="INFO")
        sp.add_argument(
            "--log-format", choices=["text", "json"], help="log lines for a terminal (text) or a pipeline (json)"
        )

    def serving(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--port", type=int, help="gRPC port (default 50051)")
        sp.add_argument(
            "--http-port", type=int, help="HTTP port: the session-learning API, /metrics (default 8080; 0 picks one)"
        )
        sp.add_argument("--host", help="bind address (default 127.0.0.1; any other address needs tokens)")
        sp.add_argument(
            "--require-auth", action="store_true", help="require bearer tokens on loopback too (auth.mode: tokens)"
        )
        sp.add_argument("--tls-cert", help="PEM certificate chain: serve the public port over TLS")
        sp.add_argument("--tls-key", help="PEM private key of --tls-cert")

    up = sub.add_parser("up", help="all-in-one: every service on one gRPC server")
    common(up)
    serving(up)
    up.add_argument(
        "--split",
        action="store_true",
        help="each service in its own process on its configured address (services.<name>), as on Kubernetes",
    )

    serve = sub.add_parser("serve", help="one service alone")
    common(serve)
    serve.add_argument("service", choices=sorted(SERVICES))
    serving(serve)

    def pass_parser(name: str, help: str) -> argparse.ArgumentParser:
        """A command that runs passes: the common options, and the passes listed after its help."""
        sp = sub.add_parser(
            name, help=help, epilog=_passes_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter
        )
        common(sp)
        return sp

    run_pass_p = pass_parser("pass", "run one background pass once (lease-claimed)")
    run_pass_p.add_argument("name", help="the pass to run (listed below)")

    passes_p = pass_parser(
        "passes", "a long-running worker ticking the named passes on their clocks (lease-claimed each tick)"
    )
    passes_p.add_argument("names", nargs="+", metavar="NAME")
    passes_p.add_argument("--http-port", type=int, help="HTTP port of /healthz and /metrics (default 8080)")

    rebuild = sub.add_parser("rebuild-index", help="restore the vector index from Postgres")
    common(rebuild)

    migrate_p = sub.add_parser(
        "migrate",
        help="apply every service's pending migrations, then exit (a Kubernetes Job: services need no DDL rights)",
    )
    common(migrate_p)

    sub.add_parser("demo", help="a scripted agent life against a running ./run up", add_help=False)
    security.add_token_parser(sub, common)
    return p


def _settings(args: argparse.Namespace) -> Settings:
    overrides: dict[str, Any] = {}
    if getattr(args, "data_dir", None):
        overrides["data_dir"] = args.data_dir
    server: dict[str, Any] = {}
    if getattr(args, "port", None) is not None:
        server["port"] = args.port
    if getattr(args, "host", None):
        server["host"] = args.host
    if getattr(args, "http_port", None) is not None:
        server["http_port"] = args.http_port
    for flag in ("tls_cert", "tls_key"):
        if getattr(args, flag, None):
            server[flag] = getattr(args, flag)
    if server:
        overrides["server"] = server
    if getattr(args, "log_format", None):
        overrides["telemetry"] = {"log_format": args.log_format}
    if getattr(args, "require_auth", False):
        overrides["auth"] = {"mode": "tokens"}
    settings = load_settings(args.config, overrides)
    # Resolved once, so every log line and the ready line name the same directory.
    return settings.model_copy(update={"data_dir": Path(os.path.abspath(settings.data_dir))})


async def _open(
    settings: Settings, stack: contextlib.AsyncExitStack, names: list[str], *, warm: bool = True
) -> tuple[Infra, list[Component]]:
    """Open the infrastructure and components of ``names`` only (their bootstraps, their
    migrations). The embedding model is loaded at start only where a service embeds inline and
    ``warm`` (a server: its first write must not pay the load); otherwise it loads on the first
    embed, and a process none of whose services embeds builds no embedder at all. A server (``warm``)
    also opens its services' vector collections before it serves (``prepare_collections``)."""
    mode = embedder_mode(names)
    infra = await open_infra(settings, stack, migrations_of(names), embeds=mode != "none")
    load = getattr(infra.embedder, "load", None)
    if load is not None and warm and mode == "warm":
        await asyncio.to_thread(load)
    components = [SERVICES[n].component(infra) for n in names]
    if warm:
        from libs.common.component import prepare_collections

        await prepare_collections(components, infra.index, infra.embedder.dimensions if infra.embedder else None)
    _log.info("opened %s: %s", ",".join(names), opened(infra))
    return infra, components


def opened(infra: Infra) -> str:
    """What this process built that costs memory: the embedder and whether its model is loaded
    (an operator's check that a pass or a profiles server did not load the model)."""
    embedder = infra.embedder
    if embedder is None:
        state = "none"
    else:
        loaded = getattr(embedder, "loaded", None)
        state = "remote" if loaded is None else ("loaded" if loaded else "not loaded")
    imported = ",".join(m for m in ("onnxruntime", "openai") if m in sys.modules) or "neither"
    return f"embedder={state} imported(onnxruntime,openai)={imported}"


# The young generation's collection threshold once start-up is over (Python's default is 700).
# After the freeze a collection walks only what requests made. At 700 a turn start paid about one
# young collection, every tenth an older one too (~2 ms of CPU a call, measured with gc.callbacks);
# at 10,000 one young collection every ~25 calls finds the same cycles (~0.5 ms a call); the cost
# is at most that many more container objects alive a little longer (docs/perf/after.md, wip/loop
# wave 10).
GC_YOUNG_THRESHOLD = 10_000


def _settled(*, collect: bool = True) -> None:
    """Start-up is over: what exists now lives as long as the process, so the cyclic GC stops
    walking it (a collection's cost is a tail latency on a server; docs/perf/analysis.md §4 #10),
    and collects the young generation less often (:data:`GC_YOUNG_THRESHOLD`). A long-lived
    process first collects start-up's garbage; a one-shot pass does not bother. A pass process
    starts with the collector off (``services.runner.__main__``): it is on again from here, for
    the pass's own work."""
    if collect:
        gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)
    gc.enable()


PUBLIC_HTTP_PATHS = ("/metrics", "/metrics/", "/healthz", "/api/openapi.json")
"""What any caller may read without a credential: aggregate metrics, liveness, the API's schema.
``/metrics/`` is served too (a scraper configured with the slash gets the same text, not a 401)."""


def http_app(components: list[Component], authenticator: Authenticator) -> Starlette:
    """Every component's HTTP routes plus ``/metrics`` and ``/healthz``, behind the same
    authentication as the gRPC port."""
    from starlette.middleware import Middleware
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    from libs.common.auth import HttpAuthMiddleware
    from libs.common.httpserver import build_app
    from libs.common.metrics import prometheus_app

    async def healthz(_request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok\n")

    class _Metrics:
        """The Prometheus ASGI app as a Route's endpoint (a plain function would be taken for a
        request handler)."""

        def __init__(self) -> None:
            self.app = prometheus_app()

        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            await self.app(scope, receive, send)

    metrics = _Metrics()

    routes = [
        *[r for c in components for r in c.http_routes],
        Route("/healthz", healthz, methods=["GET"]),
        # Routes, not a Mount: a Mount answers /metrics with a 307 to /metrics/, a path the token
        # check does not know as public, so every scrape in token mode ended in a 401.
        Route("/metrics", metrics),
        Route("/metrics/", metrics),
    ]
    auth = Middleware(
        HttpAuthMiddleware,
        authenticator=authenticator,
        public=PUBLIC_HTTP_PATHS,
        cookies=True,
        optional=[p for c in components for p in c.http_open_paths],
    )
    return build_app(routes, [auth])


def _http_tls(settings: Settings) -> tuple[str, str] | None:
    """The HTTP port serves over the public port's certificate when there is one: the sessions API
    takes ``Authorization: Bearer`` and the inspector's sign-in posts the raw token, so neither may
    go in clear beside a TLS gRPC port (and the inspector's cookie gets Secure: it sees https)."""
    cert, key = settings.server.tls_cert, settings.server.tls_key
    # Both or neither: security.listeners refused one without the other before this runs.
    return (str(cert), str(key)) if cert is not None and key is not None else None


PARENT_PIPE_ENV = "AGL_SPLIT_PARENT_PIPE"  # not AGENTLEARN_*: that prefix is the config's
"""Split mode: the fd of a pipe whose write end only the parent holds (EOF: the parent is gone)."""


def _stop_with_parent(loop: asyncio.AbstractEventLoop, stop: asyncio.Event) -> None:
    raw = os.environ.get(PARENT_PIPE_ENV)
    if not raw:
        return
    fd = int(raw)

    def parent_gone() -> None:
        loop.remove_reader(fd)
        _log.warning("the split-mode parent is gone; draining")
        stop.set()

    loop.add_reader(fd, parent_gone)


async def serve(settings: Settings, names: list[str], *, ready_line: bool = True) -> int:
    default_name = TelemetryConfig.model_fields["service_name"].default
    if len(names) == 1 and settings.telemetry.service_name == default_name:
        # One service per process: its spans say which (a name configured for the pod, as the
        # Kubernetes manifests set, is taken as it is rather than doubled).
        name = f"{default_name}-{names[0]}"
        settings = settings.model_copy(
            update={"telemetry": settings.telemetry.model_copy(update={"service_name": name})}
        )
    # Decided and bound before anything is opened: a refused address or a taken port fails in a
    # second with one line, never after Postgres started.
    # The HTTP server (uvicorn, starlette) is imported by the processes that serve it, not by a pass.
    from libs.common.httpserver import bind_http, start_http

    mode = security.auth_mode(settings)
    settings = security.with_internal_secret(settings)
    authenticator = security.authenticator(settings, mode)
    bound = bind_server(security.listeners(settings), authenticator=authenticator, config=settings.server)
    http_socket = bind_http(settings.server.host, settings.server.http_port)
    telemetry.configure_tracing(settings.telemetry)
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(bound.server.stop, 0)
        infra, components = await _open(settings, stack, names)
        authenticator.attach_store(infra.tokens)
        await start_server(bound, [r for c in components for r in c.registrations])
        port = bound.port
        infra.channels.serve_locally([c.name for c in components], f"{settings.server.host}:{port}")
        http = await start_http(
            http_app(components, authenticator), settings.server.host, 0, sock=http_socket, tls=_http_tls(settings)
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        _stop_with_parent(loop, stop)
        holder = holder_identity()
        ttl = settings.leases.ttl_seconds
        tasks = [
            asyncio.create_task(tick_forever(p, infra.leases, holder, ttl), name=p.name)
            for c in components
            for p in c.passes
            if p.enabled and settings.run_passes_in_process
        ]
        tasks += [asyncio.create_task(bg(), name=f"{c.name}-background") for c in components for bg in c.background]
        # An erasure another replica ran empties this process's caches of people's text too.
        text_caches.announce_through(infra.pool)
        stack.callback(text_caches.announce_through, None)
        follow = text_caches.follow(infra.listen_dsn, infra.pool, settings.privacy.cache_poll_seconds)
        tasks.append(asyncio.create_task(follow, name="text-caches"))
        for task in tasks:
            task.add_done_callback(log_failure)
        _settled()
        if ready_line:
            auth = (
                "auth=local (no tokens: loopback only; --require-auth to require them)"
                if mode == "local"
                else "auth=tokens"
            )
            # What each public port speaks: with a certificate both are TLS (grpcs, https).
            tls = " tls=on(grpc,http)" if settings.server.tls_cert else ""
            internal = f" internal={bound.ports[1]}" if len(bound.ports) > 1 else ""
            print(
                f"agentlearn ready on {settings.server.host}:{port} "
                f"services={','.join(c.name for c in components)} data_dir={settings.data_dir} "
                f"http={http.address} {auth}{tls}{internal}",
                flush=True,
            )
        await stop.wait()
        _log.info("shutting down: NOT_SERVING, draining for %ss", settings.server.grace_seconds)
        # HTTP and gRPC drain together, within one grace.
        await asyncio.gather(http.stop(settings.server.grace_seconds), drain(bound, settings.server.grace_seconds))
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    _log.info("stopped")
    return 0


async def serve_split(settings: Settings, args: argparse.Namespace) -> int:
    """One process per service, each on ``services.<name>``, sharing one PostgreSQL (the embedded one
    is started here and handed to the children by URL) and one data directory. Prints one ready line
    when every child is ready; SIGTERM is passed on to every child, which drains on its own."""
    mode = security.auth_mode(settings)  # refuse before starting anything
    settings = security.with_internal_secret(settings)
    dsn = await resolve_dsn(settings)
    secret = settings.auth.internal_secret
    assert secret is not None
    env = {**os.environ, "DATABASE_URL": dsn, "AGENTLEARN_AUTH__INTERNAL_SECRET": secret.get_secret_value()}
    if mode == "tokens":
        env["AGENTLEARN_AUTH__MODE"] = "tokens"
    children: dict[str, asyncio.subprocess.Process] = {}
    addresses: dict[str, str] = {}
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # The children run in their own sessions (a terminal's Ctrl-C reaches only this process, which
    # passes SIGTERM on); the write end of this pipe lives only here, so when this process dies,
    # however it dies, every child reads EOF and drains itself.
    lifeline_read, lifeline_write = os.pipe()
    try:
        for name in SERVICES:
            host, port = getattr(settings.services, name).rsplit(":", 1)
            argv = [
                sys.executable,
                "-m",
                "services.runner",
                "serve",
                name,
                "--host",
                host,
                "--port",
                port,
                # One HTTP port per process: the sessions API keeps the configured one; the others
                # serve only /metrics, on a port of their own (the ready line names it).
                "--http-port",
                str(settings.server.http_port if name == "sessions" else 0),
                "--data-dir",
                str(settings.data_dir),
                "--log-level",
                args.log_level,
            ]
            if args.config:
                argv += ["--config", args.config]
            children[name] = await asyncio.create_subprocess_exec(
                *argv,
                env={**env, PARENT_PIPE_ENV: str(lifeline_read)},
                stdout=asyncio.subprocess.PIPE,
                start_new_session=True,
                pass_fds=(lifeline_read,),
            )
        for name, proc in children.items():
            async with asyncio.timeout(120):
                assert proc.stdout is not None  # spawned with stdout=PIPE
                line = (await proc.stdout.readline()).decode()
            if not line.startswith("agentlearn ready on "):
                raise security.StartRefused(f"service {name} did not start (see its log above)")
            addresses[name] = line.split()[3]
        print(
            "agentlearn ready (split) "
            + " ".join(f"{n}={a}" for n, a in addresses.items())
            + f" data_dir={settings.data_dir} auth={mode}",
            flush=True,
        )
        waiters = {asyncio.create_task(p.wait()): n for n, p in children.items()}
        stopper = asyncio.create_task(stop.wait())
        done, _ = await asyncio.wait([stopper, *waiters], return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if task in waiters:
                _log.error("service %s exited (%s); stopping the others", waiters[task], task.result())
        stopper.cancel()
    finally:
        for proc in children.values():
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
        for proc in children.values():
            try:
                async with asyncio.timeout(settings.server.grace_seconds + 15):
                    await proc.wait()
            except TimeoutError:
                proc.kill()
        os.close(lifeline_read)
        os.close(lifeline_write)
    return 0


def _pass_services(settings: Settings, names: list[str]) -> list[str]:
    """The services a process running the passes ``names`` opens: each pass's own, plus the
    siblings it calls when they are served from this process (outside a cluster)."""
    wanted: list[str] = []
    for n in names:
        home = PASSES[n]
        for service in (home.service, *(home.calls if settings.services_local_for_passes else ())):
            if service in SERVICES and service not in wanted:
                wanted.append(service)
    return wanted


async def _serve_siblings(
    infra: Infra, stack: contextlib.AsyncExitStack, components: list[Component], names: list[str]
) -> None:
    """A pass may call sibling services (skill synthesis reads episodes); outside a cluster they are
    served from this process on a private port for the pass's lifetime — only when one of its
    passes calls one."""
    if not any(PASSES[n].calls for n in names):
        return
    registrations = [r for c in components for r in c.registrations]
    server, port, _ = await create_server(registrations, "127.0.0.1:0")
    stack.push_async_callback(server.stop, None)
    infra.channels.serve_locally([c.name for c in components], f"127.0.0.1:{port}")


async def one_pass(settings: Settings, name: str) -> int:
    if name not in PASSES:
        print(f"unknown pass {name!r}; known: {', '.join(sorted(PASSES))}", file=sys.stderr)
        return 2
    # A pass serves no /metrics and continues no caller's trace: its telemetry leaves only by OTLP.
    telemetry.configure_export_only(settings.telemetry)
    async with contextlib.AsyncExitStack() as stack:
        infra, components = await _open(settings, stack, _pass_services(settings, [name]), warm=False)
        specs = {p.name: p for c in components for p in c.passes}
        if name not in specs:
            print(f"pass {name!r} is not built by its service", file=sys.stderr)
            return 2
        if not specs[name].enabled:
            # A resumed CronJob of a pass its config turns off (skill-synthesis without
            # scheduler_enabled) does nothing, successfully.
            print(f"pass {name}: disabled by configuration; nothing to do")
            return 0
        if settings.services_local_for_passes:
            await _serve_siblings(infra, stack, components, [name])
        _settled(collect=False)
        ran, result = await run_pass(specs[name], infra.leases, holder_identity(), settings.leases.ttl_seconds)
        _log.info("pass %s finished: opened %s; %s", name, ",".join(c.name for c in components), opened(infra))
        if not ran and result == LEASE_LOST:
            print(f"pass {name}: stopped partway (its lease could not be renewed; a peer may hold it now)")
            return 3
        if not ran:
            print(f"pass {name}: not run (its lease is held elsewhere or could not be read)")
            return 3
        print(f"pass {name}: {result}")
        return 0


async def pass_worker(settings: Settings, names: list[str]) -> int:
    """``./run passes NAME...``: a long-running process that ticks the named passes on their own
    clocks, each claiming its lease every tick as a CronJob would (Kubernetes: the fills, every
    minute, without a pod start per minute). Serves /healthz and /metrics on the HTTP port; SIGTERM
    cancels the ticks, and a pass cut short releases its lease."""
    unknown = [n for n in names if n not in PASSES]
    if unknown:
        print(f"unknown passes {', '.join(unknown)}; known: {', '.join(sorted(PASSES))}", file=sys.stderr)
        return 2
    from libs.common.httpserver import bind_http, start_http

    http_socket = bind_http(settings.server.host, settings.server.http_port)
    telemetry.configure_tracing(settings.telemetry)
    async with contextlib.AsyncExitStack() as stack:
        infra, components = await _open(settings, stack, _pass_services(settings, names), warm=False)
        specs = {p.name: p for c in components for p in c.passes}
        if settings.services_local_for_passes:
            await _serve_siblings(infra, stack, components, names)
        authenticator = security.authenticator(settings, "local" if is_loopback(settings.server.host) else "tokens")
        authenticator.attach_store(infra.tokens)
        http = await start_http(http_app([], authenticator), settings.server.host, 0, sock=http_socket)
        holder = holder_identity()
        tasks = [
            asyncio.create_task(tick_forever(specs[n], infra.leases, holder, settings.leases.ttl_seconds), name=n)
            for n in names
            if specs[n].enabled
        ]
        for task in tasks:
            task.add_done_callback(log_failure)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        _settled()
        print(f"agentlearn passes ready: {' '.join(names)} http={http.address}", flush=True)
        await stop.wait()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await http.stop(settings.server.grace_seconds)
    return 0


async def migrate_all(settings: Settings) -> int:
    """Apply every service's migrations (the common ones first), under the advisory lock, once."""
    dsn = await resolve_dsn(settings)
    try:
        applied = await migrate(dsn, [COMMON_MIGRATIONS, *migrations_of(list(SERVICES))])
    except MigrationBlocked as err:
        # Exit 1, not 2: the sessions in the way end, so the Job's backoffLimit retry can succeed.
        print(f"agentlearn: {err}", file=sys.stderr)
        return 1
    print(f"migrate: {len(applied)} applied" + (": " + ", ".join(applied) if applied else " (the schema is current)"))
    return 0


async def rebuild_index(settings: Settings) -> int:
    async with contextlib.AsyncExitStack() as stack:
        if settings.vector_index == "edge" or (settings.vector_index == "auto" and not settings.qdrant_url):
            # The embedded index is a directory a running server has open: emptying it under that
            # server desyncs both, so it is rebuilt only with no other process on it.
            stack.enter_context(exclusive_edge_index(settings.data_dir / "qdrant-edge"))
        _, components = await _open(settings, stack, list(SERVICES), warm=False)
        for c in components:
            if c.rebuild_index is not None:
                count = await c.rebuild_index()
                print(f"{c.name}: {count} vectors restored from Postgres")
    return 0


def quick_exit(code: int) -> None:
    """End a one-shot process (a pass: a CronJob pod's whole life) without the interpreter's
    teardown — a last collection over every object it ever made, most of a second
    (docs/perf/analysis.md §2.5). The exit hooks still run first: the span exporter's flush, the
    embedded PostgreSQL's last-handle stop, the log handlers' flush."""
    import atexit

    sys.stdout.flush()
    sys.stderr.flush()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


async def main(argv: list[str]) -> int:
    if argv[:1] == ["demo"]:
        from services.runner import demo

        return await demo.main(argv[1:])
    args = _parser().parse_args(argv)
    try:
        settings = _settings(args)
    except ConfigError as err:
        print(f"agentlearn: {err}", file=sys.stderr)
        return 2
    telemetry.configure_logging(args.log_level, settings.telemetry.log_format)
    commands = {
        "up": lambda: serve_split(settings, args) if args.split else serve(settings, list(SERVICES)),
        "serve": lambda: serve(settings, [args.service]),
        "token": lambda: security.run_token(settings, args),
        "pass": lambda: one_pass(settings, args.name),
        "passes": lambda: pass_worker(settings, args.names),
        "rebuild-index": lambda: rebuild_index(settings),
        "migrate": lambda: migrate_all(settings),
    }
    try:
        return await commands[args.command]()
    except (
        security.StartRefused,
        BindError,
        SchemaBehind,
        EmbeddedPostgresFailed,
        MigrationBlocked,
        EdgeIndexInUse,
    ) as err:
        # What an operator can act on, in one line (the cause first), not a traceback.
        print(f"agentlearn: {err}", file=sys.stderr)
        return 2
