"""The relevance floor of an embedding model, measured on LoCoMo: the cosine similarity below which a
hit is no evidence that a past turn or note bears on the ask.

    ./run bench relevance_floor [--data PATH] [--seat-rows 500] [--with-date] [--no-caption]

What is measured. Every LoCoMo question is a query; every dialog turn of every conversation is a
passage, written as a note would be (``speaker: text [shares caption]``; ``--with-date`` adds the
session date the way ``bench/locomo.py`` does). Two distributions of cosine similarity are taken
with the configured model (the local MiniLM unless ``--model`` names another the environment
configures):

* related pairs: a question and each turn its LoCoMo evidence names (the turn that answers it);
* unrelated pairs: a question and every turn of the OTHER conversations (other people, other
  lives: nothing there bears on it).

The principle. The floor's job is to stop an unrelated row being shown as similar, so that an empty
answer can say "this is new work". A seat holds at most about ``--seat-rows`` rows of each kind
(500: ``max_raw_episodes_per_agent``, when the lifecycle folds, and ``long_cap_per_seat``, the
diary's LONG cap), so a floor that lets a fraction ``f`` of unrelated rows through shows about
``500 f`` of them on an ask that resembles nothing the seat did. The floor is the smallest cosine
with ``f <= 1 / seat_rows``: the ``1 - 1/500`` (99.8th) percentile of the unrelated distribution —
fewer than one unrelated row expected above it for a full seat. The related pairs are not used to
choose it; they say what it costs (the share of evidence turns that still clear it). The dev data
chooses nothing else: no threshold is tried against the demo or the tests.

Printed: both distributions' percentiles, the floor, the related share above it, and for comparison
the thresholds two other principles would pick (equal error rate; Youden's J). Set the result as
``learning.relevance.floors.<model>``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np

from bench.harness.locomo import evidence_ids, note_text, turns_of

warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")

DEFAULT_DATA = Path("/work/shared/data/locomo-dev.json")


def percentile(values: np.ndarray, q: float) -> float:
    return float(np.quantile(values, q))


def equal_error(related: np.ndarray, unrelated: np.ndarray) -> float:
    """The threshold where the share of related pairs below it equals the share of unrelated above."""
    grid = np.linspace(-0.2, 1.0, 1201)
    miss = np.searchsorted(np.sort(related), grid) / len(related)
    false = 1 - np.searchsorted(np.sort(unrelated), grid) / len(unrelated)
    return float(grid[int(np.argmin(np.abs(miss - false)))])


def youden(related: np.ndarray, unrelated: np.ndarray) -> float:
    grid = np.linspace(-0.2, 1.0, 1201)
    tpr = 1 - np.searchsorted(np.sort(related), grid) / len(related)
    fpr = 1 - np.searchsorted(np.sort(unrelated), grid) / len(unrelated)
    return float(grid[int(np.argmax(tpr - fpr))])


async def embed_all(embedder, texts: list[str], batch: int = 64) -> np.ndarray:  # type: ignore[no-untyped-def]
    out = []
    for i in range(0, len(texts), batch):
        vecs = await embedder.embed(texts[i : i + batch])
        for v in vecs:
            if v is None:
                raise SystemExit("the embedder returned no vector for a LoCoMo text")
            arr = np.asarray(v.values, dtype=np.float64)
            out.append(arr / np.linalg.norm(arr))
    return np.vstack(out)


async def main(args: argparse.Namespace) -> None:
    from libs.common.config import load_settings
    from libs.common.embeddings import build_embedder

    settings = load_settings(args.config, {}, env=None)
    embedder = build_embedder(settings.providers.embeddings)
    if embedder is None:
        raise SystemExit("no embedder configured (providers.embeddings.kind is none)")
    load = getattr(embedder, "load", None)
    if load is not None:
        await asyncio.to_thread(load)
    data = json.loads(await asyncio.to_thread(Path(args.data).read_text))
    started = time.perf_counter()

    texts: list[str] = []
    owner: list[int] = []  # conversation index of each passage
    index: dict[tuple[int, str], int] = {}
    for c, conv in enumerate(data):
        for date, turn in turns_of(conv["conversation"]):
            index[(c, turn["dia_id"])] = len(texts)
            texts.append(note_text(turn, date, args.with_date, not args.no_caption))
            owner.append(c)
    questions: list[tuple[int, str, list[int]]] = []
    for c, conv in enumerate(data):
        for qa in conv["qa"]:
            kept = [index[(c, e)] for e in evidence_ids(qa.get("evidence") or []) if (c, e) in index]
            if kept:
                questions.append((c, qa["question"], kept))

    P = await embed_all(embedder, texts)
    Q = await embed_all(embedder, [q for _, q, _ in questions])
    sims = Q @ P.T  # cosine: every vector is unit length
    owners = np.asarray(owner)
    related, unrelated, same_conv = [], [], []
    for i, (c, _q, ev) in enumerate(questions):
        related.extend(sims[i, ev].tolist())
        unrelated.append(sims[i, owners != c])
        mask = owners == c
        mask[ev] = False
        same_conv.append(sims[i, mask])
    rel = np.asarray(related)
    unrel = np.concatenate(unrelated)
    same = np.concatenate(same_conv)
    q = 1 - 1 / args.seat_rows
    floor = percentile(unrel, q)

    close = getattr(embedder, "close", None)
    if close is not None:
        await close()

    print(f"relevance floor of {embedder.model} on {Path(args.data).name}")
    print(
        f"passages {len(texts)} in {len(data)} conversations (format: "
        f"{'[date] ' if args.with_date else ''}speaker: text{'' if args.no_caption else ' [shares caption]'}), "
        f"questions {len(questions)}; pairs: related {len(rel)}, unrelated {len(unrel)}, "
        f"same conversation not evidence {len(same)}; {time.perf_counter() - started:.0f}s"
    )
    print()
    cuts = [0.5, 0.75, 0.9, 0.95, 0.99, 0.998, 0.999]
    head = "pairs".ljust(34) + "".join(f"p{c * 100:g}".rjust(8) for c in cuts) + "    mean"
    print(head)
    print("-" * len(head))
    for name, arr in (
        ("related (question, evidence)", rel),
        ("unrelated (other conversations)", unrel),
        ("same conversation, not evidence", same),
    ):
        row = "".join(f"{percentile(arr, c):8.3f}" for c in cuts)
        print(f"{name.ljust(34)}{row}{statistics.fmean(arr.tolist()):8.3f}")
    print()
    print(f"floor = p{q * 100:g} of unrelated (at most 1 in {args.seat_rows} unrelated rows above it) = {floor:.3f}")
    print(f"  related pairs at or above it: {100 * float(np.mean(rel >= floor)):.1f}%")
    print(f"  unrelated pairs at or above it: {100 * float(np.mean(unrel >= floor)):.2f}%")
    for name, value in (("equal error rate", equal_error(rel, unrel)), ("Youden's J", youden(rel, unrel))):
        print(
            f"  for comparison, {name}: {value:.3f} (related above {100 * float(np.mean(rel >= value)):.1f}%, "
            f"unrelated above {100 * float(np.mean(unrel >= value)):.2f}%)"
        )
    print(f"\nset: learning.relevance.floors.{embedder.model}: {floor:.2f}")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=str(DEFAULT_DATA))
    p.add_argument("--config", default=None, help="a config file naming providers.embeddings (default: local MiniLM)")
    p.add_argument("--seat-rows", type=int, default=500, help="rows of one kind a seat holds (the floor's N)")
    p.add_argument("--with-date", action="store_true", help="prefix each passage with its session date")
    p.add_argument("--no-caption", action="store_true", help="omit the shared image's caption")
    asyncio.run(main(p.parse_args()))
    sys.exit(0)
