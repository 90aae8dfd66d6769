"""What one internal gRPC hop, the server interceptors, a span and a proto conversion cost, each
in isolation (measurement only, issue 14).

    .venv/bin/python bench/experiments/rpc_overhead.py [--calls 3000]

1. A round trip on loopback IN ONE PROCESS (as the all-in-one's prefetch calls its siblings) to a
   servicer that does nothing (a scratch ``ProfileServiceServicer`` whose GetProfiles returns an
   empty response at once), with:
   a. a bare ``grpc.aio.server()`` and a bare channel;
   b. the product's server (``libs.common.grpcserver.bind_server``: call tracker, OpenTelemetry,
      auth in local mode, load shedding, contract check + error mapping) and the product's client
      channel (``ServiceChannels``: OpenTelemetry client interceptor, identity, retry config);
   c. b with a TracerProvider installed (what ``./run up`` does): every call is a recording span on
      both sides;
   d. the same servicer method awaited directly (what an in-process call behind the same client
      interface would cost).
2. One span (start_as_current_span with 4 attributes, end) with and without a TracerProvider; the
   db.py statement-span wrapper's own work (``TracedConnection._traced``).
3. Proto work of a BuildTurnContext: a RecallNotesResponse of 150 candidates serialised and parsed,
   ``MemoryNote.from_pb`` over them, an Embedding of 384 floats from numpy (``.tolist()``), and a
   ListSkillsResponse of 20 skills serialised and parsed.

4. The in-process path of the all-in-one (``InProcessChannel`` into ``LocalServer``: identity,
   auth, shedding, contract, span, metric), in CPU time of this process per call: with no
   provider, with the MeterProvider, and with the TracerProvider (as ``./run up``); and two of its
   parts alone: authenticating + authorizing a service call, and the contract check of a
   RecallNotesRequest carrying a 384-float query embedding.

Reports microseconds per call: the fastest of 10 windows (the least disturbed by the other work on
a shared machine) and their median.

    .venv/bin/python bench/experiments/rpc_overhead.py --ab /tmp/base-tree [--rounds 5] [--in-process]

A/B: runs the whole measurement in a fresh process per tree — this script's own code, importing
``libs``/``services``/``agentlearn`` from the tree measured (``--tree``) — alternating the trees'
order round by round, and prints each row's median (over rounds) of its per-run median, base then
this tree, and base/this (above 1: this tree is faster). The base tree needs its stubs generated
(``libs/common/gen``) and runs on this tree's virtualenv.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _tree() -> Path:
    """The tree whose code is measured (``--tree``; this script's own by default), read before
    anything of the product is imported."""
    for i, arg in enumerate(sys.argv):
        if arg == "--tree" and i + 1 < len(sys.argv):
            return Path(sys.argv[i + 1]).resolve()
        if arg.startswith("--tree="):
            return Path(arg.split("=", 1)[1]).resolve()
    return ROOT


TREE = _tree()
# The tree's stubs and code before this virtualenv's .pth entries (which name the worktree it serves).
sys.path[:0] = [str(TREE), str(TREE / "libs" / "common" / "gen")]

import grpc  # noqa: E402
import numpy as np  # noqa: E402

from agentlearn.common.v1 import embedding_pb2  # noqa: E402
from agentlearn.diary.v1 import diary_service_pb2 as diary_pb  # noqa: E402
from agentlearn.profiles.v1 import profile_service_pb2 as prof_pb  # noqa: E402
from agentlearn.profiles.v1 import profile_service_pb2_grpc as prof_grpc  # noqa: E402
from agentlearn.skills.v1 import skill_service_pb2 as skill_pb  # noqa: E402


class Nothing(prof_grpc.ProfileServiceServicer):
    async def GetProfiles(self, request, context):  # type: ignore[no-untyped-def,override]
        return prof_pb.GetProfilesResponse()


REQ = prof_pb.GetProfilesRequest(
    company="acme", observer="seat-1", subjects=[prof_pb.Subject(handle="bob", platform="slack")]
)


async def per_call_us(fn, calls: int, clock=time.perf_counter) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    for _ in range(200):
        await fn()
    windows = []
    for _ in range(10):
        t0 = clock()
        for _ in range(calls // 10):
            await fn()
        windows.append((clock() - t0) / (calls // 10) * 1e6)
    return min(windows), statistics.median(windows)


def sync_us(fn, calls: int, clock=time.perf_counter) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    for _ in range(100):
        fn()
    windows = []
    for _ in range(10):
        t0 = clock()
        for _ in range(calls // 10):
            fn()
        windows.append((clock() - t0) / (calls // 10) * 1e6)
    return min(windows), statistics.median(windows)


CPU = time.process_time
"""The in-process rows' clock: this process's CPU time, which another process's work on the
shared cores disturbs less than the wall clock (nothing here waits on I/O)."""
SECRET = "s3cret"


class InProcess:
    """A product server in tokens mode knowing the deployment's secret, reached in-process through
    the product's ServiceChannels, as the all-in-one's prefetch reaches its siblings."""

    async def start(self) -> InProcess:
        from libs.common.auth import Authenticator
        from libs.common.channels import ServiceChannels
        from libs.common.config import ServiceAddresses
        from libs.common.grpcserver import Registration, bind_server, start_server

        self.bound = bind_server(
            "127.0.0.1:0", authenticator=Authenticator(None, None, mode="tokens", internal_secret=SECRET)
        )
        await start_server(
            self.bound,
            [Registration("agentlearn.profiles.v1.ProfileService", prof_grpc.add_ProfileServiceServicer_to_server,
                          Nothing())],
        )  # fmt: skip
        self.channels = ServiceChannels(ServiceAddresses(), internal_secret=SECRET, caller="agentlearn-prefetch")
        self.channels.in_process = True
        self.channels.serve_locally(["profiles"], f"127.0.0.1:{self.bound.port}")
        self.stub = prof_grpc.ProfileServiceStub(self.channels.channel("profiles"))
        return self

    async def row(self, label: str, calls: int) -> tuple[str, tuple[float, float]]:
        return label, await per_call_us(lambda: self.stub.GetProfiles(REQ, timeout=5), calls, CPU)

    async def stop(self) -> None:
        await self.channels.close()
        await self.bound.server.stop(None)


async def parts(calls: int) -> list[tuple[str, tuple[float, float]]]:
    """Two parts of an in-process call alone: auth of a service call, and a contract check."""
    from agentlearn.common.v1 import embedding_pb2 as emb_pb
    from libs.common.auth import INTERNAL_HEADER, SERVICE_HEADER, Authenticator, authorize
    from libs.common.contract import check_request

    auth = Authenticator(None, None, mode="tokens", internal_secret=SECRET)
    metadata = {INTERNAL_HEADER: SECRET, SERVICE_HEADER: "agentlearn-prefetch"}
    method = "/agentlearn.profiles.v1.ProfileService/GetProfiles"

    async def admit() -> None:
        authorize(await auth.authenticate(metadata, ()), method, REQ)

    vector = np.random.default_rng(1).normal(size=384).astype(np.float32).tolist()
    recall = diary_pb.RecallNotesRequest(
        company="acme", seat="seat-1", query="what did Caroline do at the support group",
        query_embedding=emb_pb.Embedding(values=vector, model="all-MiniLM-L6-v2", dimensions=384),
    )  # fmt: skip
    return [
        ("auth: authenticate + authorize a service call (internal secret) [CPU]", await per_call_us(admit, calls, CPU)),
        ("contract check: RecallNotesRequest with a 384-float query embedding [CPU]",
         sync_us(lambda: check_request(recall, domain="diary.agentlearn.dev"), calls, CPU)),
    ]  # fmt: skip


async def in_process_only(calls: int) -> list[tuple[str, tuple[float, float]]]:
    """``--in-process``: the in-process rows and their parts alone, and a control row whose code
    is the same in every tree (its ratio in an A/B is the noise)."""
    from libs.common import telemetry
    from libs.common.config import TelemetryConfig

    out = await parts(calls)
    local = await InProcess().start()
    out.append(await local.row("in-process call, no provider [CPU]", calls))
    telemetry.configure_metrics(TelemetryConfig())
    out.append(await local.row("in-process call, MeterProvider installed [CPU]", calls))
    telemetry.configure_tracing(TelemetryConfig())
    out.append(await local.row("in-process call, TracerProvider installed (./run up) [CPU]", calls))
    await local.stop()
    blob = prof_pb.GetProfilesRequest(company="acme", observer="seat-1", subjects=[REQ.subjects[0]] * 50)
    data = blob.SerializeToString()
    out.append(("control (same code both trees): parse a 50-subject GetProfilesRequest [CPU]",
                sync_us(lambda: prof_pb.GetProfilesRequest.FromString(data), calls, CPU)))  # fmt: skip
    return out


async def hops(calls: int) -> list[tuple[str, tuple[float, float]]]:
    from libs.common.channels import ServiceChannels
    from libs.common.config import ServiceAddresses
    from libs.common.grpcserver import Registration, bind_server, start_server

    out = []
    local = await InProcess().start()
    out.append(await local.row("in-process call, no provider [CPU]", calls))
    # a. bare
    server = grpc.aio.server()
    prof_grpc.add_ProfileServiceServicer_to_server(Nothing(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    chan = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    stub = prof_grpc.ProfileServiceStub(chan)
    out.append(("loopback hop, bare server and channel", await per_call_us(lambda: stub.GetProfiles(REQ), calls)))
    await chan.close()
    await server.stop(None)

    # b. the product's server and client channel
    bound = bind_server("127.0.0.1:0")
    await start_server(
        bound,
        [Registration("agentlearn.profiles.v1.ProfileService", prof_grpc.add_ProfileServiceServicer_to_server,
                      Nothing())],
    )  # fmt: skip

    async def product_hop(label: str) -> None:
        """``calls`` loopback calls to the bound server through the product's client channel, timed per call."""
        channels = ServiceChannels(ServiceAddresses(), internal_secret="s3cret", caller="prefetch")
        channels.in_process = False  # measure the loopback hop (the all-in-one now calls in-process)
        channels.serve_locally(["profiles"], f"127.0.0.1:{bound.port}")
        pstub = prof_grpc.ProfileServiceStub(channels.channel("profiles"))
        out.append((label, await per_call_us(lambda: pstub.GetProfiles(REQ, timeout=5), calls)))
        await channels.close()

    await product_hop("loopback hop, product server (5 interceptors) + product channel, no tracer provider")
    from libs.common import telemetry
    from libs.common.config import TelemetryConfig

    telemetry.configure_metrics(TelemetryConfig())  # what configure_tracing installs first
    out.append(await local.row("in-process call, MeterProvider installed [CPU]", calls))
    # c. the same with a TracerProvider (as ./run up): spans on both sides
    telemetry.configure_tracing(TelemetryConfig())
    await product_hop("loopback hop, product server + channel, TracerProvider installed (./run up)")
    out.append(await local.row("in-process call, TracerProvider installed (./run up) [CPU]", calls))
    await local.stop()
    await bound.server.stop(None)
    servicer = Nothing()
    out.append(("in-process: the servicer method awaited directly", await per_call_us(
        lambda: servicer.GetProfiles(REQ, None), calls)))  # fmt: skip
    return out


def spans(calls: int) -> list[tuple[str, tuple[float, float]]]:
    from opentelemetry import trace

    from libs.common.db import _span_name

    out = []
    tracer = trace.get_tracer("x")

    def one() -> None:
        with tracer.start_as_current_span("db select agent_diary", kind=trace.SpanKind.CLIENT,
                                          attributes={"a": "b", "c": "d", "e": "f", "g": "h"}):  # fmt: skip
            pass

    out.append(("one span, 4 attributes (provider as configured above)", sync_us(one, calls)))
    q = "SELECT id, content FROM agent_diary d WHERE d.company = $1 AND d.seat = $2 ORDER BY create_time DESC LIMIT $3"
    out.append(("db.py _span_name(query) (regexes per statement)", sync_us(lambda: _span_name(q), calls)))
    return out


def protos(calls: int) -> list[tuple[str, tuple[float, float]]]:
    from google.protobuf.timestamp_pb2 import Timestamp

    from services.prefetch.memory import MemoryNote

    ts = Timestamp()
    ts.GetCurrentTime()
    resp = diary_pb.RecallNotesResponse()
    for i in range(150):
        c = resp.candidates.add()
        c.note.id = str(uuid.uuid4())
        c.note.company, c.note.seat = "acme", "seat-1"
        c.note.content = f"[8 May 2023] Caroline: I went to the LGBTQ support group yesterday, it was so powerful {i}."
        c.note.tier = diary_pb.NOTE_TIER_LONG
        c.note.create_time.CopyFrom(ts)
        c.similarity, c.lexical_rank = 0.5, 3.2
    blob = resp.SerializeToString()
    vec = np.random.default_rng(1).normal(size=384).astype(np.float32)
    skills = skill_pb.ListSkillsResponse()
    for i in range(20):
        s = skills.skills.add()
        s.id, s.name, s.summary = str(uuid.uuid4()), f"skill-{i}", "How to rotate the staging credentials"
    sblob = skills.SerializeToString()
    return [
        (f"RecallNotesResponse, 150 candidates ({len(blob)} bytes): serialise", sync_us(resp.SerializeToString, calls)),
        ("RecallNotesResponse, 150 candidates: parse",
         sync_us(lambda: diary_pb.RecallNotesResponse.FromString(blob), calls)),
        ("MemoryNote.from_pb over 150 candidates",
         sync_us(lambda: [MemoryNote.from_pb(c.note) for c in resp.candidates], calls // 10)),
        ("Embedding(values=vec.tolist()) for 384 floats", sync_us(
            lambda: embedding_pb2.Embedding(values=vec.tolist(), model="m", dimensions=384), calls)),
        (f"ListSkillsResponse, 20 skills ({len(sblob)} bytes): serialise + parse", sync_us(
            lambda: skill_pb.ListSkillsResponse.FromString(skills.SerializeToString()), calls)),
    ]  # fmt: skip


def _load() -> str:
    return f"load {Path('/proc/loadavg').read_text().split()[:3]} (2 shared cores)"


def ab(base: Path, rounds: int, calls: int, extra: list[str]) -> int:
    """Both trees, ``rounds`` fresh processes each, interleaved (the order alternates)."""
    trees = {"base": base.resolve(), "this": TREE}
    runs: dict[str, list[dict[str, list[float]]]] = {"base": [], "this": []}
    print(_load())
    print(f"base {trees['base']}\nthis {trees['this']}\nrounds {rounds}, calls {calls} {' '.join(extra)}", flush=True)
    for r in range(rounds):
        for name in ("base", "this") if r % 2 == 0 else ("this", "base"):
            done = subprocess.run(
                [sys.executable, __file__, "--tree", str(trees[name]), "--calls", str(calls), "--json", *extra],
                capture_output=True,
                text=True,
                check=True,
            )
            [line] = [x for x in done.stdout.splitlines() if x.startswith("JSON ")]
            # A row's name may carry a size that varies run to run (a timestamp's varint): not its key.
            runs[name].append({re.sub(r"\(\d+ bytes\)", "(N bytes)", k): v for k, v in json.loads(line[5:]).items()})
            print(f"round {r + 1} {name} done ({_load()})", flush=True)
    print(f"\n{'base us':>10} {'this us':>10} {'base/this':>9}  row (median over rounds of each run's median)")
    for row in runs["this"][0]:  # the same rows both ways: the measuring code is this script's
        before = statistics.median(run[row][1] for run in runs["base"])
        after = statistics.median(run[row][1] for run in runs["this"])
        print(f"{before:10.1f} {after:10.1f} {before / after:8.2f}x  {row}")
    return 0


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--tree", type=Path, default=ROOT, help="the tree whose code is measured (default: this one)")
    ap.add_argument("--json", action="store_true", help="also print the rows as one JSON line (for --ab)")
    ap.add_argument("--ab", type=Path, metavar="BASE_TREE", help="A/B this tree against BASE_TREE, interleaved")
    ap.add_argument("--rounds", type=int, default=5, help="--ab: processes per tree")
    ap.add_argument("--in-process", action="store_true", help="only the in-process rows (and a control row)")
    a = ap.parse_args()
    if a.ab is not None:
        return ab(a.ab, a.rounds, a.calls, ["--in-process"] if a.in_process else [])
    print(_load())
    if a.in_process:
        return _report(await in_process_only(a.calls), a.json)
    rows = spans(a.calls)
    rows = [(f"{n} [no provider]", v) for n, v in rows[:1]] + rows[1:]
    rows += await parts(a.calls)
    rows += await hops(a.calls)  # installs the MeterProvider, then the TracerProvider, part-way
    rows += [(f"{n} [TracerProvider]", v) for n, v in spans(a.calls)[:1]]
    rows += protos(a.calls)
    return _report(rows, a.json)


def _report(rows: list[tuple[str, tuple[float, float]]], as_json: bool) -> int:
    print(f"{'min us':>10} {'median us':>10}")
    for name, (lo, med) in rows:
        print(f"{lo:10.1f} {med:10.1f}  {name}")
    if as_json:
        print("JSON " + json.dumps(dict(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
