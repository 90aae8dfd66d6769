"""The Kubernetes manifests in deploy/k8s: schema-valid offline (kubernetes-validate --strict), and
the properties the deployment relies on, read from the YAML itself."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from libs.common.config import ServiceAddresses, load_settings
from services.runner.registry import ORDER

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "deploy" / "k8s"
# The oldest release with every field used here GA (podFailurePolicy, CronJob timeZone), and the newest
# the validator ships schemas for.
KUBERNETES_VERSIONS = ["1.31.0", "1.37.0"]
PASS_SA = "agentlearn-passes"


def _manifest_files() -> list[Path]:
    return sorted(p for p in K8S.rglob("*.yaml") if p.name != "kustomization.yaml")


def _docs() -> list[dict[str, Any]]:
    docs = []
    for path in _manifest_files():
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


DOCS = _docs()
KUSTOMIZATION = yaml.safe_load((K8S / "kustomization.yaml").read_text())
NAMESPACE = KUSTOMIZATION["namespace"]


def of_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in DOCS if d["kind"] == kind}


DEPLOYMENTS = of_kind("Deployment")
CRONJOBS = of_kind("CronJob")
CONFIG_MAP = next(iter(of_kind("ConfigMap").values()))
CONFIG_KEY = "agentlearn.yaml"


def pass_names_in_code() -> set[str]:
    """Every ``PassSpec("<name>", ...)`` a service declares: each must have its CronJob."""
    names: set[str] = set()
    for path in (ROOT / "services").rglob("*.py"):
        names |= set(re.findall(r'PassSpec\(\s*"([a-z0-9-]+)"', path.read_text()))
    return names


def grpc_services_declared(service: str) -> set[str]:
    """The full names of the gRPC services the service's protos declare (none before its contract)."""
    names: set[str] = set()
    for proto in (ROOT / "protos" / "agentlearn" / service / "v1").glob("*.proto"):
        text = proto.read_text()
        package = re.search(r"^package\s+([\w.]+);", text, re.M)
        if package:
            names |= {f"{package.group(1)}.{s}" for s in re.findall(r"^service\s+(\w+)\s*\{", text, re.M)}
    return names


def pod_spec(doc: dict) -> dict:
    if doc["kind"] == "CronJob":
        return doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return doc["spec"]["template"]["spec"]


def env_of(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env", [])}


def workloads() -> list[tuple[str, dict]]:
    return [*DEPLOYMENTS.items(), *CRONJOBS.items()]


# ------------------------------------------------------------------ schema and layout


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_manifest_validates_strictly_offline(version: str) -> None:
    files = [str(p) for p in _manifest_files()]
    out = subprocess.run(
        [sys.executable, "-m", "kubernetes_validate", "--strict", "--quiet", "-k", version, *files],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_kustomization_applies_every_manifest_in_one_namespace() -> None:
    listed = {(K8S / r).resolve() for r in KUSTOMIZATION["resources"]}
    assert listed == {p.resolve() for p in _manifest_files()}
    for doc in DOCS:
        if doc["kind"] == "Namespace":
            assert doc["metadata"]["name"] == NAMESPACE
        else:
            assert doc["metadata"].get("namespace") == NAMESPACE, doc["metadata"]["name"]
    assert not [d for d in DOCS if d["kind"] in ("ClusterRole", "ClusterRoleBinding")]


# ------------------------------------------------------------------ services


def test_one_deployment_per_service() -> None:
    assert set(DEPLOYMENTS) == set(ORDER)


@pytest.mark.parametrize("name", ORDER)
def test_deployment_probes_ports_and_args(name: str) -> None:
    spec = pod_spec(DEPLOYMENTS[name])
    (container,) = spec["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    port = ports["grpc"]
    assert port == int(getattr(ServiceAddresses(), name).rsplit(":", 1)[1])
    assert container["args"] == ["serve", name, "--port", str(port)]
    readiness = container["readinessProbe"]["grpc"]
    assert readiness["port"] == port
    declared = grpc_services_declared(name)
    assert not declared or readiness["service"] in declared
    assert re.fullmatch(rf"agentlearn\.{name}\.v1\.[A-Z]\w*Service", readiness["service"])
    liveness = container["livenessProbe"]["grpc"]
    assert liveness["port"] == port and liveness.get("service", "") == ""
    assert container["startupProbe"]["grpc"]["port"] == port


@pytest.mark.parametrize("name", ORDER)
def test_each_service_has_its_own_service_account_without_a_token(name: str) -> None:
    spec = pod_spec(DEPLOYMENTS[name])
    assert spec["serviceAccountName"] == name
    assert name in of_kind("ServiceAccount")
    assert spec["automountServiceAccountToken"] is False
    others = [n for n, d in DEPLOYMENTS.items() if n != name and pod_spec(d)["serviceAccountName"] == name]
    assert not others
    bound = [s["name"] for rb in of_kind("RoleBinding").values() for s in rb["subjects"]]
    assert name not in bound


@pytest.mark.parametrize("name", [n for n, _ in workloads()])
def test_pods_are_locked_down(name: str) -> None:
    doc = DEPLOYMENTS.get(name) or CRONJOBS[name]
    spec = pod_spec(doc)
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] > 0
    assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    for container in spec["containers"]:
        sc = container["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"]["drop"] == ["ALL"]
        assert "add" not in sc["capabilities"]
        for bound in ("requests", "limits"):
            assert set(container["resources"][bound]) >= {"cpu", "memory"}
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert "emptyDir" in volumes[mounts["/tmp"]]


@pytest.mark.parametrize("name", [n for n, _ in workloads()])
def test_pods_read_the_shared_config_and_the_secret(name: str) -> None:
    doc = DEPLOYMENTS.get(name) or CRONJOBS[name]
    spec = pod_spec(doc)
    (container,) = spec["containers"]
    env = env_of(container)
    config_path = Path(env["AGENTLEARN_CONFIG"]["value"])
    assert config_path.name == CONFIG_KEY
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes[mounts[str(config_path.parent)]]["configMap"]["name"] == CONFIG_MAP["metadata"]["name"]
    for key in ("DATABASE_URL", "QDRANT_URL"):
        ref = env[key]["valueFrom"]["secretKeyRef"]
        assert ref["key"] == key and not ref.get("optional", False)
    for key in ("QDRANT_API_KEY", "OPENAI_BASE_URL", "OPENAI_API_KEY"):
        assert env[key]["valueFrom"]["secretKeyRef"]["optional"] is True
    secrets = {e["valueFrom"]["secretKeyRef"]["name"] for e in env.values() if "valueFrom" in e}
    assert len(secrets) == 1
    assert "value" not in env["DATABASE_URL"]


@pytest.mark.parametrize("name", ORDER)
def test_service_port_is_named_grpc_and_selects_its_pods(name: str) -> None:
    service = of_kind("Service")[name]
    deployment = DEPLOYMENTS[name]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (port,) = service["spec"]["ports"]
    assert port["name"] == "grpc"
    assert port["targetPort"] == "grpc"
    (container,) = pod_spec(deployment)["containers"]
    assert port["port"] == container["ports"][0]["containerPort"]


def test_one_cpu_autoscaler_per_deployment() -> None:
    hpas = of_kind("HorizontalPodAutoscaler")
    targets = {h["spec"]["scaleTargetRef"]["name"] for h in hpas.values()}
    assert targets == set(DEPLOYMENTS) and len(hpas) == len(DEPLOYMENTS)
    for hpa in hpas.values():
        assert hpa["apiVersion"] == "autoscaling/v2"
        assert hpa["spec"]["scaleTargetRef"]["kind"] == "Deployment"
        assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
        (metric,) = hpa["spec"]["metrics"]
        assert metric["resource"]["name"] == "cpu"
        assert metric["resource"]["target"]["type"] == "Utilization"
    for deployment in DEPLOYMENTS.values():
        assert "replicas" not in deployment["spec"]  # the autoscaler owns the count


# ------------------------------------------------------------------ the shared config


def config_settings(tmp_path: Path):  # type: ignore[no-untyped-def]
    path = tmp_path / CONFIG_KEY
    path.write_text(CONFIG_MAP["data"][CONFIG_KEY])
    return load_settings(path, env={})


def test_the_config_map_loads_and_points_at_the_cluster(tmp_path: Path) -> None:
    assert len(of_kind("ConfigMap")) == 1
    settings = config_settings(tmp_path)
    assert settings.leases.backend == "kubernetes"
    assert "kubernetes_namespace" not in settings.leases.model_fields_set  # the pod's own namespace
    assert settings.services_local_for_passes is False
    assert settings.telemetry.otlp_endpoint
    assert settings.server.host == "0.0.0.0"
    assert settings.vector_index == "qdrant"
    assert settings.database_url is None and settings.qdrant_url is None  # secrets are not in it
    for name, deployment in DEPLOYMENTS.items():
        port = pod_spec(deployment)["containers"][0]["ports"][0]["containerPort"]
        assert getattr(settings.services, name) == f"{name}.{NAMESPACE}.svc.cluster.local:{port}"


# ------------------------------------------------------------------ passes and their leases


def test_one_cronjob_per_singleton_pass() -> None:
    assert set(CRONJOBS) == pass_names_in_code()


@pytest.mark.parametrize("name", sorted(CRONJOBS))
def test_cronjob_runs_the_pass_once_at_a_time(name: str, tmp_path: Path) -> None:
    cron = CRONJOBS[name]
    spec = cron["spec"]
    assert spec["concurrencyPolicy"] == "Forbid"
    assert isinstance(spec["startingDeadlineSeconds"], int) and spec["startingDeadlineSeconds"] >= 10
    job = spec["jobTemplate"]["spec"]
    pod = pod_spec(cron)
    (container,) = pod["containers"]
    assert container["args"] == ["pass", name]
    assert pod["restartPolicy"] == "Never"
    assert pod["serviceAccountName"] == PASS_SA
    assert pod["automountServiceAccountToken"] is True
    # The claim is not renewed during a run: the run must be over (killed at the deadline, after
    # the grace period) before its Lease can expire and a second runner take over.
    ttl = int(env_of(container).get("AGENTLEARN_LEASES__TTL_SECONDS", {}).get("value", 0)) or (
        config_settings(tmp_path).leases.ttl_seconds
    )
    assert job["activeDeadlineSeconds"] + pod["terminationGracePeriodSeconds"] < ttl
    refused = [r for r in job["podFailurePolicy"]["rules"] if r["action"] == "FailJob"]
    assert any(3 in r["onExitCodes"]["values"] for r in refused)  # a refused claim is not retried


def test_skill_synthesis_is_suspended_like_its_scheduler_switch(tmp_path: Path) -> None:
    enabled = config_settings(tmp_path).learning.skill_synthesis.scheduler_enabled
    assert CRONJOBS["skill-synthesis"]["spec"]["suspend"] is (not enabled)


def test_the_role_grants_only_get_create_update_on_the_pass_leases() -> None:
    (role,) = of_kind("Role").values()
    verbs: set[str] = set()
    for rule in role["rules"]:
        assert rule["apiGroups"] == ["coordination.k8s.io"]
        assert rule["resources"] == ["leases"]
        assert set(rule["verbs"]) <= {"get", "create", "update"}
        verbs |= set(rule["verbs"])
        if "create" in rule["verbs"]:
            # create cannot be limited by name; it must not widen any other verb.
            assert rule["verbs"] == ["create"] and "resourceNames" not in rule
        else:
            assert set(rule["resourceNames"]) == set(CRONJOBS)
    assert verbs == {"get", "create", "update"}
    (binding,) = of_kind("RoleBinding").values()
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": PASS_SA, "namespace": NAMESPACE}]
    assert PASS_SA in of_kind("ServiceAccount")


# ------------------------------------------------------------------ the image


def test_the_image_user_is_the_pods_user() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    users = re.findall(r"^USER\s+(\d+)(?::(\d+))?\s*$", dockerfile, re.M)
    assert users, "the image must run as a numeric non-root user (runAsNonRoot checks the UID)"
    uid, gid = users[-1]
    for _, doc in workloads():
        ctx = pod_spec(doc)["securityContext"]
        assert ctx["runAsUser"] == int(uid)
        if gid:
            assert ctx["runAsGroup"] == int(gid)
    assert re.search(r'^ENTRYPOINT\s+\["python",\s*"-m",\s*"services\.runner"\]', dockerfile, re.M)
