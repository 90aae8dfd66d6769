"""What a deployment installs is what its code imports: requirements.lock is exactly the closure of
the distributions libs/ and services/ import (with their requirements and extras), and the tools
that build, lint and test it (requirements-dev.lock) are never in it — the image ships no pytest,
ruff, grpcio-tools or kubernetes-validate (issue 15)."""

from __future__ import annotations

import ast
import re
from importlib.metadata import PackageNotFoundError, distribution, packages_distributions

from packaging.markers import default_environment
from packaging.requirements import Requirement

from tests.support.sources import ROOT, our_sources


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _locked(name: str) -> set[str]:
    return {_norm(line.split("==")[0]) for line in (ROOT / name).read_text().split() if "==" in line}


def _imported_distributions() -> set[str]:
    modules: set[str] = set()
    for path in our_sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                modules.add(node.module.split(".")[0])
    by_module = packages_distributions()
    return {d for m in modules for d in by_module.get(m, [])}


def _closure(roots: set[str]) -> set[str]:
    env = default_environment()
    seen: set[str] = set()
    done: set[tuple[str, str]] = set()
    stack = [(d, "") for d in roots]
    while stack:
        name, extra = stack.pop()
        if (_norm(name), extra) in done:
            continue
        done.add((_norm(name), extra))
        seen.add(_norm(name))
        try:
            requires = distribution(name).requires or []
        except PackageNotFoundError:
            continue
        for line in requires:
            req = Requirement(line)
            if req.marker and not req.marker.evaluate({**env, "extra": extra}):
                continue
            stack.append((req.name, ""))
            stack += [(req.name, e) for e in req.extras]
    return seen


def test_the_runtime_lock_is_exactly_what_the_code_needs():
    needed = _closure(_imported_distributions())
    runtime = _locked("requirements.lock")
    assert needed - runtime == set(), "imported but not pinned in requirements.lock"
    assert runtime - needed == set(), "in requirements.lock, needed by no runtime code (requirements-dev.lock?)"


def test_development_tools_stay_out_of_the_runtime_lock():
    dev = _locked("requirements-dev.lock")
    assert dev & _locked("requirements.lock") == set()
    assert {"pytest", "ruff", "grpcio-tools", "kubernetes-validate"} <= dev
