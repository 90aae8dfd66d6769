r"""The offline memory path's Python on a recall pool: 150 candidates converted, then ranked (wip/perfread).

    cd <tree> && PYTHONPATH=<tree> .venv/bin/python bench/experiments/memory_python.py

Run it in two trees (e.g. this one and a \`git archive\` of main) one after the other, twice: 20 seats'
pools of 150 LoCoMo turns, each converted (\`MemoryNote.from_candidate\`) and ranked
(\`memory_filter_rule\`, a sender named so the content words are read) 30 times, as turn after turn
of the same seats does. Medians per pool.
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from pathlib import Path

from google.protobuf import timestamp_pb2

from agentlearn.diary.v1 import diary_service_pb2 as d
from services.prefetch import memory

sys.path.insert(0, "bench")
from diary import locomo

texts, _ = locomo(Path("/work/shared/data/locomo-dev.json"))
rng = random.Random(1)


def pool(seed):
    r = random.Random(seed)
    return [
        d.RecallCandidate(
            note=d.Note(
                id=f"id{i}",
                content=r.choice(texts),
                tier=d.NOTE_TIER_LONG,
                create_time=timestamp_pb2.Timestamp(
                    seconds=1_760_000_000 + r.randrange(10**6), nanos=r.randrange(10**9)
                ),
            ),
            similarity=r.random(),
            lexical_rank=r.random() * 5,
            found_by=[d.RECALL_HALF_VECTOR, d.RECALL_HALF_LEXICAL],
        )
        for i in range(150)
    ]


pools = [pool(s) for s in range(20)]  # 20 seats' pools, each asked again and again
conv, rule = [], []
for _ in range(30):
    for p in pools:
        t = time.perf_counter()
        notes = [memory.MemoryNote.from_candidate(c) for c in p]
        conv.append(time.perf_counter() - t)
        data = {
            "query": "q",
            "senders": [["Caroline", "caroline"]],
            "max_selected": 10,
            "candidates": [
                {
                    "id": f"n{i}",
                    "content": n.content,
                    "similarity": n.similarity,
                    "lexical_rank": n.lexical_rank,
                    "found_by": sorted(n.found_by),
                    "create_time": n.create_time,
                }
                for i, n in enumerate(notes)
            ],
        }
        t = time.perf_counter()
        memory.memory_filter_rule(data)
        rule.append(time.perf_counter() - t)
print(
    f"convert 150: median {statistics.median(conv) * 1e3:.3f} ms; "
    f"offline rule over 150: median {statistics.median(rule) * 1e3:.3f} ms"
)
