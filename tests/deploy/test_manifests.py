"""The Kubernetes manifests in deploy/ validate against the API schemas.

The official `kubernetes` client's models are generated from the API's OpenAPI schema and
forbid unknown fields, wrong types and missing required fields, so validating each document
with its model is a schema check that needs no network."""

from __future__ import annotations

from pathlib import Path

import kubernetes.client as k8s
import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
MANIFESTS = sorted((DEPLOY / "k8s").glob("*.yaml"))


def _documents() -> list[tuple[str, int, dict]]:
    docs = []
    for path in MANIFESTS:
        for i, doc in enumerate(yaml.safe_load_all(path.read_text())):
            if doc:
                docs.append((path.name, i, doc))
    return docs


def _model_for(api_version: str, kind: str) -> type:
    version = api_version.rsplit("/", 1)[-1]
    name = version[0].upper() + version[1:] + kind
    model = getattr(k8s, name, None)
    if model is None:
        raise AssertionError(f"no schema for {api_version} {kind} in the kubernetes client")
    return model


def test_there_are_manifests_for_the_agent_and_the_control_plane():
    kinds = {(doc["kind"], doc["metadata"]["name"]) for _, _, doc in _documents()}
    assert ("DaemonSet", "vgpu-agent") in kinds
    assert {("Deployment", "vgpu-ledger-web"), ("Deployment", "vgpu-ledger-worker"),
            ("Deployment", "vgpu-ledger-beat"), ("Service", "vgpu-ledger-web")} <= kinds


@pytest.mark.parametrize(("name", "index", "doc"), _documents(), ids=lambda v: str(v) if not isinstance(v, dict) else "")
def test_each_manifest_document_validates_against_its_kubernetes_schema(name, index, doc):
    model = _model_for(doc["apiVersion"], doc["kind"])
    model.model_validate(doc)


def test_agent_rbac_is_least_privilege():
    role = next(d for _, _, d in _documents() if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "vgpu-agent")
    granted = {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    assert all(v in {"get", "list", "watch", "create", "patch"} for _, _, v in granted)
    writes = {(r, v) for _, r, v in granted if v in {"create", "patch"}}
    assert writes <= {("pods/eviction", "create"), ("events", "create"), ("events", "patch")}


def test_validation_rejects_a_field_the_schema_does_not_have():
    doc = next(d for _, _, d in _documents() if d["kind"] == "DaemonSet")
    broken = yaml.safe_load(yaml.safe_dump(doc))
    broken["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(ValueError, match="imagePullPolicyy"):
        _model_for(broken["apiVersion"], broken["kind"]).model_validate(broken)


def test_compose_file_runs_every_process_of_the_product():
    compose = yaml.safe_load((DEPLOY.parent / "docker-compose.yml").read_text())
    assert {"postgres", "redis", "web", "worker", "beat", "agent"} <= set(compose["services"])
