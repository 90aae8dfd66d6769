"""The runner as an operator starts it, for tests: ``python -m services.runner <args>`` in a
separate process with a clean environment, read up to its one ready line.

Every process binds an HTTP port too (default 8080); tests always ask for a free one (``--http-port
0``) unless they name one, so parallel runs never collide.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ROOT", "Running", "clean_env", "free_port", "run_once", "start", "start_with_config"]

ROOT = Path(__file__).resolve().parents[2]
_INHERITED = ("AGENTLEARN_", "DATABASE_URL", "QDRANT_", "OPENAI_")


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without anything that configures agentlearn, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_INHERITED)}
    env.update(extra or {})
    return env


def free_port() -> int:
    """A loopback port nothing listens on (yet): one a process under test is told to bind."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_once(
    *args: str,
    data_dir: str | Path,
    env: Mapping[str, str],
    entry: Sequence[str] = ("-m", "services.runner"),
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """``python -m services.runner *args --data-dir DATA_DIR`` (a one-shot command: a pass, a
    migration) run to its end, its output captured. ``entry``: how Python is told to run the runner
    (``("-c", SCRIPT)`` for a script that wraps it)."""
    return subprocess.run(
        [sys.executable, *entry, *args, "--data-dir", str(data_dir)],
        cwd=ROOT,
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@dataclass
class Running:
    proc: asyncio.subprocess.Process
    line: str
    """The ready line, e.g. ``agentlearn ready on 127.0.0.1:41234 services=... http=127.0.0.1:39001``."""
    log: Any = None
    """The anonymous file its stderr goes to when the caller did not ask for it (closed with the object)."""

    @property
    def port(self) -> int:
        return int(self.line.split()[3].rsplit(":", 1)[1])

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def http(self) -> str:
        return self.line.split("http=")[1].split()[0]

    async def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.proc.returncode is None:
            self.proc.send_signal(sig)
        async with asyncio.timeout(timeout):
            return await self.proc.wait()


async def start(
    *args: str,
    env: Mapping[str, str] | None = None,
    ready: str = "agentlearn ready",
    timeout: float = 90,
    stderr: Any = "log",
    **kwargs: Any,
) -> Running:
    """Start ``python -m services.runner *args`` and wait for its ready line (``ready`` prefix).

    ``stderr`` as for ``create_subprocess_exec`` (``None``: this process's). Left out, it goes to
    an anonymous file whose tail a start that never gets ready puts in its failure: a process that
    dies at start says why (the flag-less ``''`` of issue 14's CI said nothing)."""
    argv = list(args)
    log = tempfile.TemporaryFile() if stderr == "log" else None
    if args and args[0] in ("up", "serve", "passes") and "--http-port" not in argv:
        argv += ["--http-port", "0"]
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "services.runner",
        *argv,
        cwd=ROOT,
        env=dict(env) if env is not None else clean_env(),
        stdout=asyncio.subprocess.PIPE,
        stderr=log if log is not None else stderr,
        **kwargs,
    )
    assert proc.stdout is not None
    try:
        async with asyncio.timeout(timeout):
            line = (await proc.stdout.readline()).decode()
    except TimeoutError:
        line = f"(no ready line within {timeout:g} s)"  # the process is stopped below, not left running
    if not line.startswith(ready):
        proc.kill()
        await proc.wait()
        said = ""
        if log is not None:
            log.seek(0)
            said = "; its stderr ended:\n" + log.read().decode(errors="replace")[-4000:]
            log.close()
        raise AssertionError(f"{' '.join(argv)} did not get ready: {line!r}{said}")
    return Running(proc, line, log)


async def start_with_config(*args: str, config: Path, data_dir: Path, **kwargs: Any) -> Running:
    """``start(*args)`` with its own config file and data directory, logging warnings only."""
    return await start(*args, "--config", str(config), "--data-dir", str(data_dir), "--log-level", "WARNING", **kwargs)
