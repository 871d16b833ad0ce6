"""The fleet files hold together: the Kubernetes manifests validate offline against the Kubernetes
schemas (strict: no unknown field) and agree with dfine-serve's own options, and every metric the
Grafana dashboard queries is one the server exports."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from fake_detector import RedSquareDetector

from dfine_deploy.serve.cli import get_args_parser
from dfine_deploy.serve.metrics import ServeMetrics
from dfine_deploy.serve.settings import load_streams_file
from dfine_deploy.serve.shard import parse_shard

SERVE = Path(__file__).parents[2] / "serve"
KUBERNETES = ["1.28.0", "1.37.0"]  # pod-index labels came with 1.28; the newest schemas the package has


def _documents() -> dict[str, dict]:
    found = {}
    for path in sorted((SERVE / "k8s").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            found[f"{path.name}:{doc['kind']}"] = doc
    return found


@pytest.mark.parametrize("version", KUBERNETES)
def test_the_manifests_validate_against_the_kubernetes_schemas(version):
    documents = _documents()
    assert {key.split(":")[1] for key in documents} == {"ConfigMap", "Service", "StatefulSet"}
    for name, doc in documents.items():
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"serve/k8s/{name} against Kubernetes {version}: {exc}")
    broken = json.loads(json.dumps(documents["statefulset.yaml:StatefulSet"]))
    broken["spec"]["replicas"] = "three"
    with pytest.raises(kubernetes_validate.ValidationError):  # the check can fail
        kubernetes_validate.validate(broken, version, strict=True)


def _pod_args(sts: dict, ordinal: int, namespace: str) -> list[str]:
    """The container arguments of pod `ordinal` as Kubernetes hands them over: each `$(VAR)` replaced by
    the container's env value, or by the pod field its downward-API reference names."""
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    fields = {
        "metadata.name": f"{sts['metadata']['name']}-{ordinal}",
        "metadata.namespace": namespace,
        "metadata.labels['apps.kubernetes.io/pod-index']": str(ordinal),
    }
    env = {
        e["name"]: e["value"] if "value" in e else fields[e["valueFrom"]["fieldRef"]["fieldPath"]]
        for e in container["env"]
        if "value" in e or "fieldRef" in e.get("valueFrom", {})
    }
    expanded = [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in container["args"]]
    assert not any("$(" in a for a in expanded), expanded
    return expanded


def test_the_statefulset_runs_one_shard_per_pod_with_our_own_options(tmp_path):
    docs = _documents()
    sts = docs["statefulset.yaml:StatefulSet"]
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.labels['apps.kubernetes.io/pod-index']"
    )
    shards = int(env["SHARDS"]["value"])
    assert shards == sts["spec"]["replicas"]  # one worker per shard, none missing
    for ordinal in range(shards):  # what Kubernetes hands each pod, read by our own parser
        parsed = get_args_parser().parse_args(_pod_args(sts, ordinal, "default"))
        assert parse_shard(parsed.shard) == (ordinal, shards)
    service = docs["service.yaml:Service"]
    pod_labels = sts["spec"]["template"]["metadata"]["labels"]
    assert (
        service["spec"]["selector"].items() <= pod_labels.items()
        and sts["spec"]["serviceName"] == "dfine-serve"
    )
    assert {p["name"] for p in container["ports"]} >= {p["targetPort"] for p in service["spec"]["ports"]}

    streams = tmp_path / "streams.yaml"  # the ConfigMap's list is one dfine-serve reads, every entry named
    streams.write_text(docs["configmap.yaml:ConfigMap"]["data"]["streams.yaml"])
    specs = load_streams_file(streams)
    assert specs and all(spec.name for spec in specs)

    prometheus = yaml.safe_load(docs["prometheus.yaml:ConfigMap"]["data"]["prometheus.yml"])
    (job,) = prometheus["scrape_configs"]
    keep = {
        tuple(r["source_labels"]): r["regex"] for r in job["relabel_configs"] if r.get("action") == "keep"
    }
    assert (
        keep[("__meta_kubernetes_pod_label_app_kubernetes_io_name",)] == pod_labels["app.kubernetes.io/name"]
    )


def _cluster_names(pod: str, service: str, namespace: str, domain: str = "cluster.local") -> list[str]:
    """The names cluster DNS answers for a pod of a headless Service and for the Service: the FQDN
    and the shorter forms the pods' resolver completes through its search path
    (https://kubernetes.io/docs/concepts/services-networking/dns-pod-service/)."""
    names = []
    for base in (f"{pod}.{service}", service):
        names += [base, f"{base}.{namespace}", f"{base}.{namespace}.svc", f"{base}.{namespace}.svc.{domain}"]
    return names


@pytest.mark.parametrize("ordinal", [0, 2])
def test_a_pod_answers_to_the_names_kubernetes_gives_it(serve, tmp_path, ordinal):
    """A server started with the StatefulSet's arguments (the volumes' paths moved into tmp_path, the
    model a fake, no cameras) answers every Host the cluster's DNS names lead to it, with and without
    the port, and still refuses a foreign one."""
    docs = _documents()
    sts = docs["statefulset.yaml:StatefulSet"]
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    args = _pod_args(sts, ordinal, namespace="vision")
    for mount in container["volumeMounts"]:  # the pod's volumes, here
        local = tmp_path / mount["name"]
        local.mkdir()
        args = [a.replace(mount["mountPath"], str(local)) for a in args]
    (tmp_path / "streams" / "streams.yaml").write_text("streams: []\n")  # no camera to reach here
    from dfine_deploy.serve.cli import _settings

    settings = _settings(get_args_parser().parse_args(args))
    server = serve(RedSquareDetector(), **dataclasses.asdict(settings))
    pod = f"{sts['metadata']['name']}-{ordinal}"
    service = docs["service.yaml:Service"]["metadata"]["name"]
    assert service == sts["spec"]["serviceName"]
    port = container["ports"][0]["containerPort"]
    for name in _cluster_names(pod, service, "vision"):
        for host in (name, f"{name}:{port}"):
            reply = server.client.get("/healthz", headers={"Host": host})
            assert reply.status_code == 200, (host, reply.text)
    for foreign in ("attacker.example", f"{pod}.{service}.other-namespace", "dfine-serve-9.dfine-serve"):
        reply = server.client.get("/healthz", headers={"Host": f"{foreign}:{port}"})
        assert reply.status_code == 400 and "--allowed-host" in reply.text


def _exported_names() -> set[str]:
    """Every series name /metrics can show, from the server's own registry."""
    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"], "gauge": [""]}
    names = set()
    for family in ServeMetrics().registry.collect():
        names |= {family.name + suffix for suffix in suffixes[family.type]}
    return names


def test_every_metric_the_grafana_dashboard_queries_exists():
    dashboard = json.loads((SERVE / "grafana" / "dfine-serve.json").read_text())
    queried = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"\bdfine_serve_[a-z_]+", target["expr"])
    }
    exported = _exported_names()
    assert len(queried) >= 15 and queried <= exported, f"not exported: {sorted(queried - exported)}"
    assert "dfine_serve_nonexistent_total" not in exported  # the comparison can fail
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
