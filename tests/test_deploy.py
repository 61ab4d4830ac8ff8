"""The Kubernetes manifests: every overlay rendered by `kubectl kustomize`, every object checked
against the Kubernetes schemas (kubernetes-validate), and the wiring an operator would otherwise
find broken only on a cluster (probes on the health port, selectors, secrets, the fleet config,
network policies, alerts pointing at runbook entries)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from provisioner.config import FLEET_FILE, load_fleet

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "deploy" / "kubernetes"
REGIONS = ["us-central1", "europe-west4", "asia-east1"]
OVERLAYS = [*REGIONS, "front"]
KUBERNETES_VERSION = kubernetes_validate.latest_version()


def kustomize(directory: Path, *flags: str) -> list[dict]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        if os.environ.get("PROVISIONER_REQUIRE_KUBECTL"):
            pytest.fail("kubectl is not on the PATH, and PROVISIONER_REQUIRE_KUBECTL is set (CI must run this test)")
        pytest.skip("kubectl is not on the PATH: cannot render the kustomize overlays (install kubectl to run this)")
    out = subprocess.run([kubectl, "kustomize", *flags, str(directory)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def one(objects: list[dict], kind: str) -> dict:
    found = [o for o in objects if o["kind"] == kind]
    assert len(found) == 1, f"{len(found)} {kind} objects"
    return found[0]


@pytest.fixture(scope="module", params=OVERLAYS)
def overlay(request) -> tuple[str, list[dict]]:
    return request.param, kustomize(K8S / "overlays" / request.param)


def test_every_object_is_valid_for_kubernetes(overlay):
    _, objects = overlay
    for obj in objects:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def test_workload_wiring(overlay, tmp_path):
    name, objects = overlay
    component = "front" if name == "front" else "cluster"
    namespace = f"provisioner-{name}"
    ns = one(objects, "Namespace")
    assert ns["metadata"]["name"] == namespace
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert all(o["metadata"].get("namespace") == namespace for o in objects if o["kind"] != "Namespace")

    deployment = one(objects, "Deployment")
    pod = deployment["spec"]["template"]
    labels = pod["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    service = one(objects, "Service")
    assert service["spec"]["selector"].items() <= labels.items()
    for kind in ("PodDisruptionBudget", "NetworkPolicy"):
        selector = one(objects, kind)["spec"]["selector" if kind == "PodDisruptionBudget" else "podSelector"]
        assert selector["matchLabels"].items() <= labels.items(), kind

    spec = pod["spec"]
    account = one(objects, "ServiceAccount")
    assert spec["serviceAccountName"] == account["metadata"]["name"]
    assert account["metadata"]["annotations"]["iam.gke.io/gcp-service-account"].endswith(".iam.gserviceaccount.com")

    container, = spec["containers"]
    args = container["args"]
    assert args[:2] == ["serve", component]
    flags = dict(a.removeprefix("--").split("=", 1) for a in args[2:] if a.startswith("--") and "=" in a)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert int(flags["health-address"].rsplit(":", 1)[1]) == ports["health"]
    assert int(flags["metrics-address"].rsplit(":", 1)[1]) == ports["metrics"]
    assert int(flags["address"].rsplit(":", 1)[1]) == ports["grpc"]
    # Native gRPC probes, on the plaintext health port: ready mirrors the server, live is the process.
    assert container["readinessProbe"]["grpc"] == {"port": ports["health"], "service": ""}
    assert container["livenessProbe"]["grpc"] == {"port": ports["health"], "service": "liveness"}
    assert {"cpu", "memory"} <= container["resources"]["requests"].keys()
    assert {"cpu", "memory"} <= container["resources"]["limits"].keys()

    # The restricted Pod Security Standard.
    pod_sc, sc = spec["securityContext"], container["securityContext"]
    assert pod_sc["runAsNonRoot"] is True and pod_sc["runAsUser"] != 0
    assert pod_sc["seccompProfile"]["type"] == "RuntimeDefault"
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"]
    assert sc["readOnlyRootFilesystem"] is True

    env = {e["name"]: e for e in container["env"]}
    assert env["PROVISIONER_DATABASE_URL"]["valueFrom"]["secretKeyRef"]["name"] == "provisioner-database"
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    for var in ("PROVISIONER_TLS_CA", "PROVISIONER_TLS_CERT", "PROVISIONER_TLS_KEY"):
        path = Path(env[var]["value"])
        assert "secret" in volumes[mounts[str(path.parent)]], var

    # The fleet config: a ConfigMap with every file of clusters/, mounted where the lookup finds it.
    config_map = one(objects, "ConfigMap")
    assert volumes[mounts[env["PROVISIONER_CLUSTERS"]["value"]]]["configMap"]["name"] == \
        config_map["metadata"]["name"]
    shipped = {p.name for p in (ROOT / "clusters").glob("*.yaml")}
    assert set(config_map["data"]) == shipped
    for file, text in config_map["data"].items():
        (tmp_path / file).write_text(text)
    fleet = load_fleet(tmp_path)

    if component == "cluster":
        assert deployment["spec"]["replicas"] == 2
        assert env["CLUSTER_NAME"]["value"] == name and "--name=$(CLUSTER_NAME)" in args
        assert name in fleet.cluster_names
        # Only the front's pods reach the ClusterService port; metrics only from monitoring.
        policy = one(objects, "NetworkPolicy")["spec"]
        assert policy["policyTypes"] == ["Ingress"]
        by_port = {rule["ports"][0]["port"]: rule["from"] for rule in policy["ingress"]}
        assert by_port.keys() == {"grpc", "metrics"}
        front, = by_port["grpc"]
        assert front["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "provisioner-front"}
        assert front["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "provisioner-front"}
        assert by_port["metrics"] == [{"namespaceSelector": {"matchLabels": {
            "kubernetes.io/metadata.name": "monitoring"}}}]
    else:
        hpa = one(objects, "HorizontalPodAutoscaler")
        assert hpa["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
        assert hpa["spec"]["minReplicas"] >= 2 and "replicas" not in deployment["spec"]
        # One --cluster per cluster of the fleet, at that cluster's Service.
        clusters = dict(a.removeprefix("--cluster=").split("=", 1) for a in args if a.startswith("--cluster="))
        assert clusters.keys() == set(fleet.cluster_names)
        for cluster, address in clusters.items():
            assert address == f"provisioner-cluster.provisioner-{cluster}.svc.cluster.local:50061"


def test_the_fleet_config_map_lists_every_file():
    listed = yaml.safe_load((ROOT / "clusters" / "Kustomization").read_text())["configMapGenerator"][0]["files"]
    assert sorted(listed) == sorted(p.name for p in (ROOT / "clusters").glob("*.yaml"))
    assert FLEET_FILE in listed


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors."""
    out = set()
    for line in markdown.splitlines():
        if m := re.match(r"^#{1,6}\s+(.*)$", line):
            out.add(re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-"))
    return out


def metric_sources() -> str:
    """Where metric families are named: the registry's and the collectors' modules."""
    return "".join((ROOT / "provisioner" / "observability" / name).read_text() for name in ("metrics.py", "collectors.py"))


def test_alerts_point_at_runbook_entries_and_real_metrics():
    objects = kustomize(K8S / "monitoring")
    rule = one(objects, "PrometheusRule")
    runbook = (ROOT / "deploy" / "runbook.md").read_text()
    anchors = _anchors(runbook)
    source = metric_sources()
    alerts = [r for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r]
    assert {a["alert"] for a in alerts} >= {"ProvisionerClusterUnhealthy", "ProvisionerFastStartRatioLow",
                                            "ProvisionerQueueGrowing", "ProvisionerStockouts",
                                            "ProvisionerCloudErrorRate", "ProvisionerLeaderFlapping"}
    for alert in alerts:
        url = alert["annotations"]["runbook_url"]
        path, _, anchor = url.partition("#")
        assert path == "deploy/runbook.md" and anchor in anchors, (alert["alert"], url)
        metrics = {re.sub(r"_(bucket|count|sum|total)$", "", m)
                   for m in re.findall(r"\bprovisioner_[a-z_]+", alert["expr"])}
        assert metrics, alert["alert"]
        for metric in metrics:
            assert f'"{metric}' in source, (alert["alert"], metric)
        # The runbook entry names the metric behind the symptom.
        entry = next(s for s in runbook.split("\n## ") if _anchors("## " + s.splitlines()[0]) == {anchor})
        assert any(m in entry for m in metrics), alert["alert"]


def test_the_dashboard_reads_real_metrics():
    dashboard = json.loads((ROOT / "deploy" / "grafana" / "provisioner.json").read_text())
    source = metric_sources()
    rules = (K8S / "monitoring" / "prometheusrule.yaml").read_text()
    assert dashboard["panels"]
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            metrics = re.findall(r"\bprovisioner[_:][a-z_:0-9]+", target["expr"])
            assert metrics, panel["title"]
            for metric in metrics:
                if ":" in metric:  # a recording rule
                    assert f"record: {metric}" in rules, metric
                else:
                    assert f'"{re.sub(r"_(bucket|count|sum|total)$", "", metric)}' in source, metric


def test_certificates_for_a_first_deployment(tmp_path, capsys):
    from cryptography import x509

    from provisioner.cli import main

    assert main(["certificates", "--out", str(tmp_path)]) == 0
    fleet = load_fleet(ROOT / "clusters")
    security = fleet.settings.security
    ca = x509.load_pem_x509_certificate((tmp_path / "ca.pem").read_bytes())
    for name, dns in [("front", security.front_tls_name),
                      *((f"cluster-{c}", security.cluster_name(c)) for c in fleet.cluster_names)]:
        cert = x509.load_pem_x509_certificate((tmp_path / f"{name}.pem").read_bytes())
        assert cert.issuer == ca.subject
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert dns in names.get_values_for_type(x509.DNSName)
        assert (tmp_path / f"{name}-key.pem").exists()
    assert "front.provisioner.internal" in capsys.readouterr().out
