"""The Docker build context holds every file the Dockerfile copies from it.

There is no Docker daemon in the test environment, so this reads ``.dockerignore`` the way Docker
does (patterns in order, the last match wins, ``!`` re-includes, a matched directory takes its
contents with it) and checks each ``COPY``/``ADD`` source of the build context against it. A source
left out of the context fails ``docker build`` ("not found"), which nothing else here would catch.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    """Docker's pattern syntax (Go's filepath.Match plus ``**``) as an anchored regex."""
    out = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**", i):
            # "**/" matches any number of directories (including none); a bare "**" anything.
            if pattern.startswith("**/", i):
                out.append("(?:.*/)?")
                i += 3
            else:
                out.append(".*")
                i += 2
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out) + r"\Z")


def _rules(text: str) -> list[tuple[bool, re.Pattern[str]]]:
    rules = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        include = line.startswith("!")
        pattern = line[1:].strip() if include else line
        pattern = pattern.strip("/")  # Docker cleans the pattern: "protos/" is "protos"
        rules.append((include, _pattern_regex(pattern)))
    return rules


def in_context(path: str, rules: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Whether ``path`` (relative, "/"-separated) is sent to the builder: the last rule matching
    the path or one of its parent directories decides."""
    parts = path.strip("/").split("/")
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    included = True
    for include, regex in rules:
        if any(regex.match(p) for p in prefixes):
            included = include
    return included


def copy_sources(dockerfile: str) -> list[str]:
    """The build-context sources of every COPY/ADD (not ``--from=`` a stage)."""
    joined = re.sub(r"\\\n", " ", dockerfile)
    sources: list[str] = []
    for line in joined.splitlines():
        words = shlex.split(line, comments=False) if line.strip() and not line.lstrip().startswith("#") else []
        if not words or words[0].upper() not in {"COPY", "ADD"}:
            continue
        args = words[1:]
        if any(a.startswith("--from") for a in args):
            continue
        args = [a for a in args if not a.startswith("--")]
        sources.extend(args[:-1])
    return sources


def test_the_parser_reads_dockerignore_as_docker_does() -> None:
    rules = _rules("*\n!libs/\n**/__pycache__\nlibs/common/gen\n")
    assert not in_context("requirements.lock", rules)
    assert in_context("libs/common/db.py", rules)
    assert not in_context("libs/common/__pycache__/db.cpython-311.pyc", rules)
    assert not in_context("libs/common/gen/x_pb2.py", rules)
    assert copy_sources("COPY a b /tmp/\nCOPY --from=build /x /y\nCOPY --chown=1:1 c/ \\\n  d/\n") == [
        "a",
        "b",
        "c/",
    ]


def test_every_copy_source_is_in_the_build_context() -> None:
    rules = _rules((ROOT / ".dockerignore").read_text())
    sources = copy_sources((ROOT / "Dockerfile").read_text())
    assert sources, "the Dockerfile copies nothing from the context?"
    missing = []
    for source in sources:
        path = ROOT / source
        assert path.exists(), f"the Dockerfile copies {source}, which is not in the repository"
        if path.is_dir():
            files = [p for p in path.rglob("*") if p.is_file()]
            if not any(in_context(str(p.relative_to(ROOT)), rules) for p in files):
                missing.append(source)
        elif not in_context(source, rules):
            missing.append(source)
    assert not missing, f".dockerignore leaves out what the Dockerfile copies: {missing}"
