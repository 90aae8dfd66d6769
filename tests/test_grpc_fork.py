"""A child forked while gRPC is busy reaches its ``exec`` (libs/common/grpc_fork.py).

gRPC's fork handlers aborted such a child when another thread was inside gRPC at the fork: the
embedded PostgreSQL's ``pg_ctl`` (started as another user, so Python forks rather than vforks)
died with SIGABRT and ``./run up`` with it. Our processes turn the handlers off before gRPC is
imported.
"""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support.runner import ROOT, clean_env

# A gRPC server answering a busy client on four tasks, while a thread starts /bin/true N times as
# this same user (``user=`` makes Python fork instead of vfork, as for pg_ctl): prints how many
# children did not exit 0.
_BUSY_FORKS = """
import libs.common.grpc_fork  # what every entry point imports before gRPC
import asyncio, os, subprocess, sys
import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc


async def main(n):
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    stop = False
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)

        async def busy():
            while not stop:
                await stub.Check(health_pb2.HealthCheckRequest())

        tasks = [asyncio.create_task(busy()) for _ in range(4)]

        def forks():
            return sum(subprocess.run(["/bin/true"], user=os.getuid()).returncode != 0 for _ in range(n))

        failed = await asyncio.to_thread(forks)
        stop = True
        await asyncio.gather(*tasks)
    await server.stop(0)
    print(failed)


asyncio.run(main(int(sys.argv[1])))
"""


def test_children_forked_while_grpc_serves_all_reach_exec() -> None:
    # Without the module's default the same run lost about 40% of its children (SIGABRT).
    env = {k: v for k, v in clean_env().items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    env["GRPC_VERBOSITY"] = "NONE"
    done = subprocess.run(
        [sys.executable, "-c", _BUSY_FORKS, "300"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["0"]


def test_the_runner_turns_the_handlers_off_before_it_imports_grpc() -> None:
    env = {k: v for k, v in clean_env().items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "services.runner", "--help"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    imported = [line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")]
    assert "libs.common.grpc_fork" in imported
    first_grpc = next(i for i, name in enumerate(imported) if name == "grpc" or name.startswith("grpc."))
    assert imported.index("libs.common.grpc_fork") < first_grpc
    assert os.environ.get("GRPC_ENABLE_FORK_SUPPORT") == "0"  # and this test process (conftest) too
