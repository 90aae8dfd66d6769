"""A background task is never started without a reference kept (issue 13).

The event loop holds only a weak reference to a task: one whose result is discarded can be
garbage-collected mid-flight, and its exception is never seen. Every ``create_task`` /
``ensure_future`` in libs/ and services/ keeps its task (a set with a done-callback discard, a
variable awaited or cancelled later, or a TaskGroup, which owns its tasks and raises their errors).
This scans the tree's syntax, so a new bare call fails here before it loses work in production."""

from __future__ import annotations

import ast

from tests.support.sources import ROOT, our_sources

SPAWNERS = {"create_task", "ensure_future"}


def _owner(func: ast.expr) -> str:
    """The text of what a spawning call is made on (``asyncio``, ``loop``, ``group``...)."""
    if isinstance(func, ast.Attribute):
        return ast.unparse(func.value)
    return ""


def _is_loop_spawn(call: ast.Call) -> bool:
    """``asyncio.create_task(...)``, ``asyncio.ensure_future(...)``, ``loop.create_task(...)``, a
    bare imported ``create_task(...)``: a spawn the loop holds only weakly. A TaskGroup's
    ``create_task`` keeps its task (the group awaits it), so it is not one."""
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    if name not in SPAWNERS:
        return False
    owner = _owner(func)
    return owner == "" or owner == "asyncio" or "loop" in owner.lower()


def discarded_spawns(source: str) -> list[int]:
    """Line numbers of spawning calls whose task is dropped on the floor (an expression statement)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and _is_loop_spawn(node.value):
            out.append(node.lineno)
    return out


def test_no_background_task_is_started_without_a_reference_kept() -> None:
    bad = [
        f"{path.relative_to(ROOT).as_posix()}:{line}"
        for path in our_sources()
        for line in discarded_spawns(path.read_text())
    ]
    assert not bad, "a task whose reference is discarded can be collected mid-flight:\n" + "\n".join(bad)


def test_the_scan_finds_a_discarded_task_and_accepts_kept_ones() -> None:
    src = "\n".join(
        [
            "import asyncio",
            "async def f(group, loop):",
            "    asyncio.create_task(g())",  # 3: discarded
            "    asyncio.ensure_future(g())",  # 4: discarded
            "    loop.create_task(g())",  # 5: discarded
            "    asyncio.get_running_loop().create_task(g())",  # 6: discarded
            "    t = asyncio.create_task(g())",  # kept in a variable
            "    TASKS.add(asyncio.create_task(g()))",  # kept in a set
            "    group.create_task(g())",  # a TaskGroup owns it
            "    tasks = [asyncio.create_task(g()) for _ in range(2)]",  # kept in a list
        ]
    )
    assert discarded_spawns(src) == [3, 4, 5, 6]
