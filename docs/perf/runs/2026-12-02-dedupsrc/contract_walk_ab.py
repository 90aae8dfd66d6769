"""In-process interleaved A/B of contract's walk: the base tree's plan compiler and _walk (their
source, taken from the base tree's contract.py and compiled into a copy of this module's namespace,
with plans of their own) against this tree's, on the same messages, rounds alternating. One process,
so load hits both arms alike."""

import ast
import itertools
import statistics
import sys
import timeit
from pathlib import Path

sys.path.insert(0, ".")
from libs.common import contract
from libs.common.gen.agentlearn.prefetch.v1 import prefetch_service_pb2 as pb

base_src = Path(sys.argv[1], "libs/common/contract.py").read_text()
tree = ast.parse(base_src)
WANTED = ("_walk", "plan_of", "_compile", "_compile_field")
fns = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in WANTED]
ns = dict(vars(contract))
ns["_PLANS"] = {}
exec(compile(ast.Module(body=fns, type_ignores=[]), "base_contract", "exec"), ns)
base_walk, base_plan_of = ns["_walk"], ns["plan_of"]
new_walk = contract._walk

msgs = {
    "rich (8 senders, 3 units)": pb.BuildTurnContextRequest(
        company="acme",
        seat="s1",
        role="eng",
        turn_id="t-1",
        ask="hello " * 40,
        senders=[pb.Counterparty(handle=f"h{i}", platform="slack", display_name="Bob") for i in range(8)],
        unit_chain=["u1", "u2", "u3"],
    ),
    "plain (scalars only)": pb.BuildTurnContextRequest(company="acme", seat="s1", role="eng", turn_id="t-1", ask="hi"),
    "bad (NUL + 1001 senders)": pb.BuildTurnContextRequest(
        company="acme\x00", seat="s1", senders=[pb.Counterparty(handle="h") for _ in range(1001)]
    ),
}
rounds = int(sys.argv[2])
for name, m in msgs.items():
    plan, bplan = contract.plan_of(m.DESCRIPTOR), base_plan_of(m.DESCRIPTOR)
    run = {
        "base": lambda m=m, p=bplan: list(itertools.islice(base_walk(m, p, ""), contract.MAX_COLLECTED)),
        "this": lambda m=m, p=plan: list(itertools.islice(new_walk(m, p, ""), contract.MAX_COLLECTED)),
    }
    assert run["base"]() == run["this"](), name
    t = {"base": [], "this": []}
    n = 20 if "1001" in name else 300
    for r in range(rounds):
        for arm in ("base", "this") if r % 2 == 0 else ("this", "base"):
            t[arm].append(min(timeit.repeat(run[arm], number=n, repeat=3)) / n * 1e6)
    mb, mt = statistics.median(t["base"]), statistics.median(t["this"])
    print(
        f"{name}: base median {mb:.2f} µs, this median {mt:.2f} µs, ratio {mt / mb:.3f} "
        f"(min {min(t['this']) / min(t['base']):.3f}; {rounds} rounds)"
    )
