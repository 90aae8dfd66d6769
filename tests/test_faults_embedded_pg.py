"""The embedded PostgreSQL does not outlive a SIGKILLed ``./run up``, and a server left behind by
a process that died before this fix (its dead pid still registered) is adopted and stopped by the
next clean start and stop. Real processes, the real wheel."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import tempfile
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from tests.support.runner import start


@pytest.fixture
def data_dir():
    """Outside pytest's temporary tree, like the session's server (see conftest.pg_uri)."""
    root = Path(tempfile.mkdtemp(prefix="agentlearn-test-killed-up-"))
    root.chmod(0o755)
    yield root / "data"
    shutil.rmtree(root, ignore_errors=True)


async def _up(data: Path) -> asyncio.subprocess.Process:
    return (await start("up", "--port", "0", "--data-dir", str(data), ready="agentlearn ready on")).proc


def _postmaster(data: Path) -> int:
    return int((data / "postgres" / "postmaster.pid").read_text().split()[0])


def _handles(data: Path) -> list[int]:
    return json.loads((data / "postgres" / ".handle_pids.json").read_text())


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _watchdog(runner: int) -> psutil.Process:
    [dog] = [c for c in psutil.Process(runner).children() if "libs.common.embedded_pg" in " ".join(c.cmdline())]
    return dog


async def _until(condition: Callable[[], bool], seconds: float = 60) -> None:
    async with asyncio.timeout(seconds):
        while not condition():
            await asyncio.sleep(0.1)


async def test_the_embedded_postgres_does_not_outlive_a_sigkilled_up(data_dir):
    proc = await _up(data_dir)
    postmaster = _postmaster(data_dir)
    assert _running(postmaster) and proc.pid in _handles(data_dir)
    proc.send_signal(signal.SIGKILL)
    await proc.wait()
    await _until(lambda: not _running(postmaster))  # the watchdog stopped it
    assert proc.pid not in _handles(data_dir)


async def test_a_server_left_behind_is_adopted_and_stopped_by_the_next_clean_stop(data_dir):
    """Runner and watchdog both SIGKILLed: the server is orphaned with a dead pid registered (the
    state every SIGKILL left before the watchdog). The next start prunes the dead pid and reuses
    the server; its clean SIGTERM stops it."""
    first = await _up(data_dir)
    orphan = _postmaster(data_dir)
    dog = _watchdog(first.pid)
    dog.kill()
    first.send_signal(signal.SIGKILL)
    await first.wait()
    await _until(lambda: not _running(dog.pid))
    assert _running(orphan) and first.pid in _handles(data_dir)  # left behind

    second = await _up(data_dir)
    try:
        assert _postmaster(data_dir) == orphan  # adopted, not a second server on the same data
        assert _handles(data_dir) == [second.pid]  # the dead pid is gone
    finally:
        second.send_signal(signal.SIGTERM)
        async with asyncio.timeout(60):
            assert await second.wait() == 0
    await _until(lambda: not _running(orphan))
    assert _handles(data_dir) == []
