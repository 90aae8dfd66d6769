"""A PgBouncer in transaction mode in front of the session's embedded PostgreSQL, as production runs
(deploy/k8s/overlays/production), for tests of what a pooler that moves a client between server
connections breaks. The project does not install PgBouncer: with no ``pgbouncer`` on the PATH the
test is skipped, saying so."""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import asyncpg
import pytest

__all__ = ["pgbouncer"]

_PORT = 6432  # only names the Unix socket (.s.PGSQL.6432) in the bouncer's own directory
_READY_SECONDS = 10.0


@contextlib.asynccontextmanager
async def pgbouncer(dsn: str, *, server_pool_size: int = 4) -> AsyncIterator[str]:
    """A PgBouncer (``pool_mode = transaction``, ``server_pool_size`` server connections per
    database) in front of ``dsn``'s server, listening on a Unix socket of its own; yields the DSN
    of ``dsn``'s database through it, and stops it when the block ends."""
    binary = shutil.which("pgbouncer")
    if binary is None:
        pytest.skip("pgbouncer is not installed (the project does not install it; apt package 'pgbouncer')")
    parts = urlsplit(dsn)
    server_socket_dir = parse_qs(parts.query)["host"][0]  # the embedded server listens on a socket only
    database, user = parts.path.lstrip("/"), parts.username or "postgres"
    root = Path(tempfile.mkdtemp(prefix="agentlearn-pgbouncer-"))
    command = [binary, str(root / "pgbouncer.ini")]
    if os.geteuid() == 0:  # PgBouncer refuses root: run it as the server's own user, who reaches its socket
        owner = pwd.getpwuid(os.stat(server_socket_dir).st_uid).pw_name
        shutil.chown(root, owner)
        command[1:1] = ["-u", owner]
    (root / "users.txt").write_text(f'"{user}" ""\n')
    (root / "pgbouncer.ini").write_text(
        f"[databases]\n{database} = host={server_socket_dir} dbname={database} user={user}\n"
        "[pgbouncer]\n"
        "listen_addr =\n"
        f"listen_port = {_PORT}\n"
        f"unix_socket_dir = {root}\n"
        "auth_type = trust\n"
        f"auth_file = {root / 'users.txt'}\n"
        "pool_mode = transaction\n"
        f"default_pool_size = {server_pool_size}\n"
    )
    log = (root / "pgbouncer.log").open("w")  # not a pipe: a full pipe would stall the bouncer
    proc = await asyncio.create_subprocess_exec(*command, stdout=subprocess.DEVNULL, stderr=log)
    through = f"postgresql://{user}@/{database}?host={root}&port={_PORT}"
    try:
        deadline = time.monotonic() + _READY_SECONDS
        while True:  # bounded wait for its socket to answer (start-up, not a race in the test)
            if proc.returncode is not None:
                raise RuntimeError(f"pgbouncer exited at start: {(root / 'pgbouncer.log').read_text()}")
            try:
                conn = await asyncpg.connect(through, statement_cache_size=0)
            except (OSError, asyncpg.PostgresError):
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.05)
                continue
            await conn.close()
            break
        yield through
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 5)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        log.close()
        shutil.rmtree(root, ignore_errors=True)
