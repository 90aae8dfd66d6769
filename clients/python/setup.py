"""Generates the gRPC stubs from agentlearn's protos into the wheel at build time.

The stubs (``agentlearn.<service>.v1.*_pb2``, ``*_pb2_grpc`` and ``.pyi`` type stubs) are never
committed: ``build_py`` runs ``grpc_tools.protoc`` over every ``.proto`` under the protos
directory (``$AGENTLEARN_PROTOS``, else ``../../protos`` from here) straight into the build tree.
The runtime floor of grpcio and protobuf is the one the generator's own code needs, read from the
installed grpcio-tools, so a wheel never installs next to a runtime its stubs refuse.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


def protos_dir() -> Path:
    found = Path(os.environ.get("AGENTLEARN_PROTOS") or HERE.parent.parent / "protos")
    if not (found / "agentlearn").is_dir():
        raise SystemExit(f"agentlearn-client: no protos at {found} (set AGENTLEARN_PROTOS to the protos/ directory)")
    return found


def requirements() -> list[str]:
    """grpcio and protobuf as grpcio-tools requires them (what its generated code checks at import)."""
    pinned = {}
    for requirement in importlib.metadata.requires("grpcio-tools") or []:
        name = re.match(r"[A-Za-z0-9_.-]+", requirement).group(0)
        if name in ("grpcio", "protobuf") and ";" not in requirement:
            pinned[name] = requirement
    pinned.setdefault("grpcio", f"grpcio>={importlib.metadata.version('grpcio-tools')}")
    return [*pinned.values(), "grpcio-status>=1.60", "googleapis-common-protos>=1.60"]


class GenerateStubs(build_py):
    def run(self) -> None:
        super().run()
        import grpc_tools
        from grpc_tools import protoc

        protos = protos_dir()
        out = Path(self.build_lib)
        files = sorted(str(p.relative_to(protos)) for p in protos.rglob("*.proto"))
        include = Path(grpc_tools.__file__).parent / "_proto"
        args = [
            "protoc",
            f"-I{protos}",
            f"-I{include}",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            f"--pyi_out={out}",
            *files,
        ]
        if protoc.main(args) != 0:
            raise SystemExit("agentlearn-client: protoc failed")
        for directory in (out / "agentlearn").rglob("*"):
            if directory.is_dir():
                (directory / "__init__.py").touch()
        (out / "agentlearn" / "__init__.py").touch()
        (out / "agentlearn" / "py.typed").touch()


setup(install_requires=requirements(), cmdclass={"build_py": GenerateStubs})
