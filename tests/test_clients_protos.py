"""The contracts as other languages read them: every proto file carries go_package, java_package
and csharp_namespace by one convention (buf's breaking check leaves these three to this test,
see buf.yaml), every RPC declares its scope, buf.gen.yaml names every file option's language,
and the vendored google.rpc protos are the ones the Python runtime decodes with."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
PROTOS = sorted((ROOT / "protos" / "agentlearn").rglob("*.proto"))  # ours, not the vendored ones


def option(text: str, name: str) -> str | None:
    found = re.search(rf'^option {name} = "([^"]*)";$', text, flags=re.M)
    return found.group(1) if found else None


def test_every_proto_file_names_its_package_in_go_java_and_csharp():
    assert PROTOS
    for path in PROTOS:
        text = path.read_text()
        package = re.search(r"^package (agentlearn\.(\w+)\.v1);$", text, flags=re.M)
        assert package, path
        service = package.group(2)
        assert option(text, "go_package") == f"agentlearn.dev/gen/go/agentlearn/{service}/v1;{service}v1", path
        assert option(text, "java_package") == f"dev.agentlearn.{service}.v1", path
        assert option(text, "csharp_namespace") == f"AgentLearn.{service.capitalize()}.V1", path


def test_buf_gen_yaml_generates_the_languages_the_options_name():
    config = yaml.safe_load((ROOT / "buf.gen.yaml").read_text())
    assert config["version"] == "v2" and config["inputs"] == [{"directory": "protos"}]
    plugins = {p["remote"].split("/")[-1] for p in config["plugins"]}
    assert {"go", "java", "csharp", "python"} <= plugins
    for plugin in config["plugins"]:
        assert plugin["out"].startswith("gen/"), plugin


def test_the_vendored_google_rpc_protos_are_the_runtimes_own():
    from google.rpc import status_pb2

    runtime = Path(status_pb2.__file__).parent
    vendored = ROOT / "clients" / "vendor" / "googleapis" / "google" / "rpc"
    for name in ("status.proto", "error_details.proto", "code.proto"):
        assert (vendored / name).read_text() == (runtime / name).read_text(), name
