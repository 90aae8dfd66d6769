"""Query construction for the vector half, on LoCoMo dev (measurement only): the raw question
(what the diary embeds today) against the question's content words only (the prefetch's own
``content_words``, unstemmed: no question words, no stop words). Exact cosine over each seat's
notes (the notes as ``bench locomo`` writes them), MiniLM as the product runs it.

    .venv/bin/python bench/experiments/query_locomo.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.harness import script  # noqa: E402


def main() -> int:
    from services.prefetch.text import content_words

    ml = script("experiments/models_locomo", "models_locomo")
    lm = ml.bench_module("locomo")
    data = json.loads(Path("/work/shared/data/locomo-dev.json").read_text())
    model = ml.MiniLM()

    def embed(texts: list[str]) -> np.ndarray:
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out: dict[int, np.ndarray] = {}
        for s in range(0, len(order), 4):
            idx = order[s : s + 4]
            for i, v in zip(idx, model.embed([texts[i] for i in idx]), strict=True):
                out[i] = v
        return np.stack([out[i] for i in range(len(texts))])

    variants = {
        "raw question (today)": lambda q: q,
        "content words only": lambda q: " ".join(content_words(q, stem=False)) or q,
    }
    hits = {v: [0, 0] for v in variants}
    items = 0
    for conv in data:
        notes = [(t["dia_id"], lm.note_text(t, d, True, True)) for d, t in lm.turns_of(conv["conversation"])]
        ids = [d for d, _ in notes]
        vec = embed([t for _, t in notes])
        qs = []
        for qa in conv["qa"]:
            ev = [e for e in lm.evidence_ids(qa.get("evidence") or []) if e in set(ids)]
            if ev:
                qs.append((qa["question"], ev))
        items += sum(len(ev) for _, ev in qs)
        for name, make in variants.items():
            qv = embed([make(q) for q, _ in qs])
            for (_, ev), v in zip(qs, qv, strict=True):
                top = np.argsort(-(vec @ v))
                s50, s10 = {ids[i] for i in top[:50]}, {ids[i] for i in top[:10]}
                hits[name][0] += sum(e in s50 for e in ev)
                hits[name][1] += sum(e in s10 for e in ev)
    print(f"LoCoMo dev, vector half only (exact cosine, MiniLM), {items} evidence items")
    print(f"{'query':<28} {'top-50 micro %':>14} {'top-10 micro %':>14}")
    for name, (h50, h10) in hits.items():
        print(f"{name:<28} {100 * h50 / items:14.1f} {100 * h10 / items:14.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
