"""Command line of ``./run``: ``up``, ``serve``, ``pass``, ``rebuild-index``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from pathlib import Path

from libs.common import telemetry
from libs.common.config import Settings, load_settings
from libs.common.grpcserver import create_server, drain
from libs.common.httpserver import start_http
from libs.common.infra import Infra, open_infra, resolve_dsn
from libs.common.passrunner import holder_identity, run_pass, tick_forever
from services.runner.registry import SERVICES, migrations_of

_log = logging.getLogger("agentlearn")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="./run", description="agentlearn runner")
    sub = p.add_subparsers(dest="command", required=True)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--config", help="YAML config file (default: $AGENTLEARN_CONFIG)")
        sp.add_argument("--data-dir", help="where embedded PostgreSQL and Qdrant keep their data")
        sp.add_argument("--log-level", default="INFO")

    up = sub.add_parser("up", help="all-in-one: every service on one gRPC server")
    common(up)
    up.add_argument("--port", type=int, help="gRPC port (default 50051)")
    up.add_argument("--host", help="bind address (default 127.0.0.1)")
    up.add_argument("--http-port", type=int, help="HTTP port of the sessions API (default 8080; 0 picks one)")
    up.add_argument(
        "--split",
        action="store_true",
        help="each service in its own process on its configured address (services.<name>), as on Kubernetes",
    )

    serve = sub.add_parser("serve", help="one service alone")
    common(serve)
    serve.add_argument("service", choices=sorted(SERVICES))
    serve.add_argument("--port", type=int)
    serve.add_argument("--host")
    serve.add_argument("--http-port", type=int)

    run_pass_p = sub.add_parser("pass", help="run one background pass once (lease-claimed)")
    common(run_pass_p)
    run_pass_p.add_argument("name")

    rebuild = sub.add_parser("rebuild-index", help="restore the vector index from Postgres")
    common(rebuild)

    sub.add_parser("demo", help="a scripted agent life against a running ./run up", add_help=False)
    return p


def _settings(args: argparse.Namespace) -> Settings:
    overrides: dict = {}
    if getattr(args, "data_dir", None):
        overrides["data_dir"] = args.data_dir
    server: dict = {}
    if getattr(args, "port", None) is not None:
        server["port"] = args.port
    if getattr(args, "host", None):
        server["host"] = args.host
    if getattr(args, "http_port", None) is not None:
        server["http_port"] = args.http_port
    if server:
        overrides["server"] = server
    settings = load_settings(args.config, overrides)
    # Resolved once, so every log line and the ready line name the same directory.
    return settings.model_copy(update={"data_dir": Path(os.path.abspath(settings.data_dir))})


async def _open(settings: Settings, stack: contextlib.AsyncExitStack, names: list[str]) -> tuple[Infra, list]:
    infra = await open_infra(settings, stack, migrations_of(names))
    load = getattr(infra.embedder, "load", None)
    if load is not None:
        await asyncio.to_thread(load)  # the first write must not pay the model's load time
    components = [SERVICES[n].component(infra) for n in names]
    return infra, components


async def serve(settings: Settings, names: list[str], *, ready_line: bool = True) -> int:
    if len(names) == 1:  # one service per process: its spans say which
        name = f"{settings.telemetry.service_name}-{names[0]}"
        settings = settings.model_copy(
            update={"telemetry": settings.telemetry.model_copy(update={"service_name": name})}
        )
    telemetry.configure_tracing(settings.telemetry)
    async with contextlib.AsyncExitStack() as stack:
        infra, components = await _open(settings, stack, names)
        registrations = [r for c in components for r in c.registrations]
        address = f"{settings.server.host}:{settings.server.port}"
        server, port, health = await create_server(registrations, address)
        infra.channels.serve_locally([c.name for c in components], f"{settings.server.host}:{port}")
        routes = [r for c in components for r in c.http_routes]
        http = await start_http(routes, settings.server.host, settings.server.http_port) if routes else None
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        holder = holder_identity()
        ttl = settings.leases.ttl_seconds
        tasks = [
            asyncio.create_task(tick_forever(p, infra.leases, holder, ttl), name=p.name)
            for c in components
            for p in c.passes
            if p.enabled and settings.run_passes_in_process
        ]
        tasks += [asyncio.create_task(bg(), name=f"{c.name}-background") for c in components for bg in c.background]
        if ready_line:
            print(
                f"agentlearn ready on {settings.server.host}:{port} "
                f"services={','.join(c.name for c in components)} data_dir={settings.data_dir}"
                + (f" http={http.address}" if http else ""),
                flush=True,
            )
        await stop.wait()
        _log.info("shutting down: NOT_SERVING, draining for %ss", settings.server.grace_seconds)
        if http is not None:
            await http.stop(settings.server.grace_seconds)
        await drain(server, health, settings.server.grace_seconds)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    _log.info("stopped")
    return 0


async def serve_split(settings: Settings, args: argparse.Namespace) -> int:
    """One process per service, each on ``services.<name>``, sharing one PostgreSQL (the embedded one
    is started here and handed to the children by URL) and one data directory. Prints one ready line
    when every child is ready; SIGTERM is passed on to every child, which drains on its own."""
    dsn = await resolve_dsn(settings)
    env = {**os.environ, "DATABASE_URL": dsn}
    children: dict[str, asyncio.subprocess.Process] = {}
    addresses: dict[str, str] = {}
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
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
                "--http-port",  # only a service with HTTP routes (sessions) binds it
                str(settings.server.http_port),
                "--data-dir",
                str(settings.data_dir),
                "--log-level",
                args.log_level,
            ]
            if args.config:
                argv += ["--config", args.config]
            children[name] = await asyncio.create_subprocess_exec(
                *argv, env=env, stdout=asyncio.subprocess.PIPE, start_new_session=True
            )
        for name, proc in children.items():
            async with asyncio.timeout(120):
                line = (await proc.stdout.readline()).decode()
            if not line.startswith("agentlearn ready on "):
                raise RuntimeError(f"service {name} did not start (see its log above)")
            addresses[name] = line.split()[3]
        print(
            "agentlearn ready (split) "
            + " ".join(f"{n}={a}" for n, a in addresses.items())
            + f" data_dir={settings.data_dir}",
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
    return 0


async def one_pass(settings: Settings, name: str) -> int:
    telemetry.configure_tracing(settings.telemetry)
    async with contextlib.AsyncExitStack() as stack:
        infra, components = await _open(settings, stack, list(SERVICES))
        specs = {p.name: p for c in components for p in c.passes}
        if name not in specs:
            print(f"unknown pass {name!r}; known: {', '.join(sorted(specs))}", file=sys.stderr)
            return 2
        if not specs[name].enabled:
            # A resumed CronJob of a pass its config turns off (skill-synthesis without
            # scheduler_enabled) does nothing, successfully.
            print(f"pass {name}: disabled by configuration; nothing to do")
            return 0
        if settings.services_local_for_passes:
            # A pass may call sibling services (skill synthesis reads episodes); outside a cluster
            # they are served from this process on a private port for the pass's lifetime.
            registrations = [r for c in components for r in c.registrations]
            server, port, _ = await create_server(registrations, "127.0.0.1:0")
            stack.push_async_callback(server.stop, None)
            infra.channels.serve_locally([c.name for c in components], f"127.0.0.1:{port}")
        ran, result = await run_pass(specs[name], infra.leases, holder_identity(), settings.leases.ttl_seconds)
        if not ran:
            print(f"pass {name}: not run (its lease is held elsewhere or could not be read)")
            return 3
        print(f"pass {name}: {result}")
        return 0


async def rebuild_index(settings: Settings) -> int:
    async with contextlib.AsyncExitStack() as stack:
        _, components = await _open(settings, stack, list(SERVICES))
        for c in components:
            if c.rebuild_index is not None:
                count = await c.rebuild_index()
                print(f"{c.name}: {count} vectors restored from Postgres")
    return 0


async def main(argv: list[str]) -> int:
    if argv[:1] == ["demo"]:
        from services.runner import demo

        return await demo.main(argv[1:])
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
    settings = _settings(args)
    if args.command == "up":
        if args.split:
            return await serve_split(settings, args)
        return await serve(settings, list(SERVICES))
    if args.command == "serve":
        return await serve(settings, [args.service])
    if args.command == "pass":
        return await one_pass(settings, args.name)
    if args.command == "rebuild-index":
        return await rebuild_index(settings)
    return 2
