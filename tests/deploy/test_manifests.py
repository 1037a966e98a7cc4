"""The Kubernetes manifests in deploy/ validate against the API schemas.

The official `kubernetes` client's models are generated from the API's OpenAPI schema and
forbid unknown fields, wrong types and missing required fields, so validating each document
with its model is a schema check that needs no network."""

from __future__ import annotations

import argparse
from pathlib import Path

import kubernetes.client as k8s
import pytest
import yaml
from pydantic import BaseModel

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
MANIFESTS = sorted((DEPLOY / "k8s").glob("*.yaml"))


def _documents() -> list[tuple[str, int, dict]]:
    docs = []
    for path in MANIFESTS:
        for i, doc in enumerate(yaml.safe_load_all(path.read_text())):
            if doc:
                docs.append((path.name, i, doc))
    return docs


def _model_for(api_version: str, kind: str) -> type[BaseModel]:
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


def _agent_role_grants() -> set[tuple[str, str, str]]:
    role = next(d for _, _, d in _documents() if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "vgpu-agent")
    return {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


def test_agent_rbac_is_least_privilege():
    granted = _agent_role_grants()
    assert all(v in {"get", "list", "watch", "create", "patch"} for _, _, v in granted)
    writes = {(r, v) for _, r, v in granted if v in {"create", "patch"}}
    assert writes <= {("pods/eviction", "create"), ("events", "create"), ("events", "patch")}


def test_agent_rbac_grants_exactly_what_the_agent_calls():
    # KubeClientPods: list/watch pods (own node) and namespaces; get a ResourceClaim by name;
    # get a pod's ReplicaSet or Job by name (its Deployment or CronJob, agents.owners);
    # create pods/eviction (watchdog, evict-best-effort); create Events on those pods.
    assert _agent_role_grants() == {
        ("", "pods", "get"), ("", "pods", "list"), ("", "pods", "watch"),
        ("", "namespaces", "list"), ("", "namespaces", "watch"),
        ("resource.k8s.io", "resourceclaims", "get"),
        ("apps", "replicasets", "get"), ("batch", "jobs", "get"),
        ("", "pods/eviction", "create"),
        ("", "events", "create"),
    }


def _agent_daemonset() -> dict:
    return next(d for _, _, d in _documents() if d["kind"] == "DaemonSet" and d["metadata"]["name"] == "vgpu-agent")


def test_agent_daemonset_sees_host_pids_proc_gpus_mps_and_its_config():
    pod = _agent_daemonset()["spec"]["template"]["spec"]
    assert pod["hostPID"] is True
    assert pod["runtimeClassName"] == "nvidia"
    volumes = {v["name"]: v for v in pod["volumes"]}
    (agent,) = pod["containers"]
    mounts = {m["name"]: m for m in agent["volumeMounts"]}
    assert volumes["host-proc"]["hostPath"]["path"] == "/proc"
    assert mounts["host-proc"]["readOnly"] is True
    assert agent["args"][agent["args"].index("--proc-root") + 1] == mounts["host-proc"]["mountPath"]
    assert volumes["mps-pipe"]["hostPath"]["path"] == "/tmp/nvidia-mps"  # noqa: S108 - the MPS daemon's documented default
    assert agent["args"][agent["args"].index("--mps-pipe-directory") + 1] == mounts["mps-pipe"]["mountPath"]
    assert agent["args"][agent["args"].index("--token-file") + 1] == mounts["token"]["mountPath"] + "/token"
    # Every $(VAR) in the arguments comes from the ConfigMap (or the downward API).
    env = {e["name"]: e for e in agent["env"]}
    config = next(d for _, _, d in _documents() if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "vgpu-agent-config")
    for arg in agent["args"]:
        if arg.startswith("$("):
            ref = env[arg[2:-1]]["valueFrom"]["configMapKeyRef"]
            assert ref["name"] == "vgpu-agent-config"
            assert ref["key"] in config["data"]


def test_agent_daemonset_arguments_parse_as_vgpu_agent_flags():
    from agents.__main__ import _parser

    pod = _agent_daemonset()["spec"]["template"]["spec"]
    (agent,) = pod["containers"]
    config = next(d for _, _, d in _documents() if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "vgpu-agent-config")
    env = {e["name"]: e for e in agent["env"]}
    args = [
        config["data"][env[a[2:-1]]["valueFrom"]["configMapKeyRef"]["key"]] if a.startswith("$(") else a
        for a in agent["args"]
    ]
    parsed = _parser().parse_args(args)
    assert parsed.backend == "nvml"
    assert parsed.enforcer == {"mps", "watchdog"}


def test_validation_rejects_a_field_the_schema_does_not_have():
    doc = next(d for _, _, d in _documents() if d["kind"] == "DaemonSet")
    broken = yaml.safe_load(yaml.safe_dump(doc))
    broken["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(ValueError, match="imagePullPolicyy"):
        _model_for(broken["apiVersion"], broken["kind"]).model_validate(broken)


def test_compose_file_runs_every_process_of_the_product():
    compose = yaml.safe_load((DEPLOY.parent / "docker-compose.yml").read_text())
    assert {"postgres", "redis", "web", "worker", "beat", "agent"} <= set(compose["services"])


def _apiserver_file(name: str) -> dict:
    return yaml.safe_load((DEPLOY / "apiserver" / name).read_text())


def test_the_api_server_presents_the_token_the_web_deployment_reads_to_the_admission_webhook():
    """Anonymous admission reviews answer 401, so the API server's admission configuration must
    name a credential for exactly the Service the webhook calls, and the web pods must read the
    matching token from the Secret."""
    webhook = next(d for _, _, d in _documents() if d["kind"] == "ValidatingWebhookConfiguration")
    (hook,) = webhook["webhooks"]
    service = hook["clientConfig"]["service"]
    config = _apiserver_file("admission-config.yaml")
    plugin = next(p for p in config["plugins"] if p["name"] == "ValidatingAdmissionWebhook")
    kubeconfig_path = plugin["configuration"]["kubeConfigFile"]
    kubeconfig = _apiserver_file(Path(kubeconfig_path).name)
    users = {u["name"]: u["user"] for u in kubeconfig["users"]}
    assert users[f"{service['name']}.{service['namespace']}.svc:{service['port']}"]["tokenFile"]

    web = next(d for _, _, d in _documents() if d["kind"] == "Deployment" and d["metadata"]["name"] == "vgpu-ledger-web")
    pod = web["spec"]["template"]["spec"]
    container, _ = _webhook_container()
    token_file = Path(next(e["value"] for e in container["env"] if e["name"] == "VGPU_ADMISSION_TOKEN_FILE"))
    mount = next(m for m in container["volumeMounts"] if token_file.parent == Path(m["mountPath"]))
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert volume["secret"]["secretName"] == "vgpu-ledger-admission-token"
    assert {"key": "token", "path": token_file.name} in volume["secret"]["items"]


# -- Node identity: projected ServiceAccount token, TokenReview by the web pods ---------------


def test_agent_daemonset_authenticates_with_a_projected_service_account_token_for_the_service_audience():
    from django.conf import settings as defaults

    pod = _agent_daemonset()["spec"]["template"]["spec"]
    (agent,) = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert not [v for v in pod["volumes"] if "secret" in v], "no Secret may carry the agent's identity"
    (source,) = volumes["token"]["projected"]["sources"]
    token = source["serviceAccountToken"]
    assert token["audience"] == defaults.VGPU_NODE_TOKEN_AUDIENCE
    assert 600 <= token["expirationSeconds"] <= 86400  # the API server's bounds for a projected token
    token_file = agent["args"][agent["args"].index("--token-file") + 1]
    mount = next(m for m in agent["volumeMounts"] if m["name"] == "token")
    assert token_file == f"{mount['mountPath']}/{token['path']}"
    # The token's ServiceAccount is the one the service accepts by default.
    namespace = _agent_daemonset()["metadata"]["namespace"]
    assert f"{namespace}:{pod['serviceAccountName']}" in defaults.VGPU_NODE_SERVICE_ACCOUNTS


def _grants_of(account: str, namespace: str) -> set[tuple[str, str, str, str]]:
    """(scope, apiGroup, resource, verb) granted to a ServiceAccount; scope is "cluster" or a namespace."""
    docs = [d for _, _, d in _documents()]
    roles = {(d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"]): d
             for d in docs if d["kind"] in ("Role", "ClusterRole")}
    grants = set()
    for binding in (d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        if {"kind": "ServiceAccount", "name": account, "namespace": namespace} not in binding["subjects"]:
            continue
        ref = binding["roleRef"]
        scope = "cluster" if binding["kind"] == "ClusterRoleBinding" else binding["metadata"]["namespace"]
        role = roles[(ref["kind"], "" if ref["kind"] == "ClusterRole" else scope, ref["name"])]
        grants |= {(scope, g, r, v) for rule in role["rules"] for g in rule["apiGroups"]
                   for r in rule["resources"] for v in rule["verbs"]}
    return grants


def test_web_rbac_allows_the_calls_of_node_identity_and_reads_pods_only_in_the_agents_namespace():
    # billing/services/identity/node_identity.py: create a TokenReview (cluster-scoped) and get the
    # token's pod, which runs in the agents' namespace.
    web = next(d for _, _, d in _documents() if d["kind"] == "Deployment" and d["metadata"]["name"] == "vgpu-ledger-web")
    pod = web["spec"]["template"]["spec"]
    container = next(c for c in pod["containers"] if c["name"] == "web")
    assert {"name": "VGPU_NODE_TOKENREVIEW", "value": "1"} in container["env"]
    agents_namespace = _agent_daemonset()["metadata"]["namespace"]
    assert _grants_of(pod["serviceAccountName"], web["metadata"]["namespace"]) >= {
        ("cluster", "authentication.k8s.io", "tokenreviews", "create"),
        (agents_namespace, "", "pods", "get"),
    }
    assert ("cluster", "", "pods", "get") not in _grants_of(pod["serviceAccountName"], web["metadata"]["namespace"])


# --- The admission webhook over TLS ----------------------------------------------------------


def _one(kind: str, name: str, docs: list[dict] | None = None) -> dict:
    docs = docs if docs is not None else [d for _, _, d in _documents()]
    return next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)


def _webhook_hook(docs: list[dict] | None = None) -> dict:
    (hook,) = _one("ValidatingWebhookConfiguration", "vgpu-ledger-budgets", docs)["webhooks"]
    return hook


def _webhook_container(docs: list[dict] | None = None) -> tuple[dict, dict]:
    """The container, and its port, that serve the port the webhook configuration calls, followed
    through the Service: VWC port -> Service port -> targetPort (by name or number) -> a
    containerPort of a pod the Service selects. AssertionError when a link is missing."""
    docs = docs if docs is not None else [d for _, _, d in _documents()]
    target = _webhook_hook(docs)["clientConfig"]["service"]
    service = _one("Service", target["name"], docs)
    assert service["metadata"]["namespace"] == target["namespace"]
    ports = [p for p in service["spec"]["ports"] if p["port"] == target["port"]]
    assert len(ports) == 1, f"Service {target['name']} exposes port {target['port']} {len(ports)} times"
    wanted = ports[0].get("targetPort", ports[0]["port"])
    served = []
    for doc in docs:
        if doc["kind"] != "Deployment" or doc["metadata"]["namespace"] != target["namespace"]:
            continue
        if not service["spec"]["selector"].items() <= doc["spec"]["template"]["metadata"]["labels"].items():
            continue
        for container in doc["spec"]["template"]["spec"]["containers"]:
            served += [(container, cp) for cp in container.get("ports", [])
                       if wanted in (cp["containerPort"], cp.get("name"))]
    assert len(served) == 1, f"Service port {target['port']} (targetPort {wanted}) reaches {len(served)} containers"
    return served[0]


@pytest.mark.parametrize("break_it", [
    lambda docs: _one("Service", "vgpu-ledger-web", docs)["spec"]["ports"].pop(),
    lambda docs: _webhook_hook(docs)["clientConfig"]["service"].update(port=8444),
    lambda docs: _webhook_container(docs)[1].update(name="https"),
], ids=["service-lacks-the-port", "webhook-calls-another-port", "no-container-port-of-that-name"])
def test_the_webhook_port_chain_check_catches_a_broken_link(break_it):
    docs = [d for _, _, d in _documents()]
    _webhook_container(docs)
    break_it(docs)
    with pytest.raises(AssertionError):
        _webhook_container(docs)


def test_every_port_of_the_webhook_path_leads_to_one_container_that_serves_tls_on_it():
    container, port = _webhook_container()
    number = port["containerPort"]
    command = container["command"]
    assert command[:2] == ["gunicorn", "config.wsgi"]
    assert command[command.index("--bind") + 1].endswith(f":{number}")
    # The certificate and key are files of the mounted TLS Secret (a whole-volume mount, so renewals arrive).
    volumes = {v["name"]: v for v in _one("Deployment", "vgpu-ledger-web")["spec"]["template"]["spec"]["volumes"]}
    for flag, key in (("--certfile", "tls.crt"), ("--keyfile", "tls.key")):
        path = Path(command[command.index(flag) + 1])
        assert path.name == key
        mount = next(m for m in container["volumeMounts"] if Path(m["mountPath"]) == path.parent)
        assert "subPath" not in mount
        assert volumes[mount["name"]]["secret"] == {"secretName": "vgpu-ledger-webhook-tls"}
    probe = container["readinessProbe"]["httpGet"]
    assert probe["scheme"] == "HTTPS"
    assert probe["port"] in (number, port.get("name"))
    # Django answers only for the Host the API server sends, and the probe sends it too.
    hosts = next(e["value"] for e in container["env"] if e["name"] == "DJANGO_ALLOWED_HOSTS").split(",")
    target = _webhook_hook()["clientConfig"]["service"]
    assert f"{target['name']}.{target['namespace']}.svc" in hosts
    assert {h["value"] for h in probe["httpHeaders"] if h["name"] == "Host"} <= set(hosts)


def _certificate_command() -> tuple[dict, argparse.Namespace]:
    from billing.management.commands.webhook_certificate import Command

    cronjob = _one("CronJob", "vgpu-ledger-webhook-certificate")
    pod = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    command = container["command"]
    assert command[:3] == ["python", "manage.py", "webhook_certificate"]
    return pod, Command().create_parser("manage.py", "webhook_certificate").parse_args(command[3:])


def test_the_certificate_job_stores_what_the_web_pods_mount_and_the_webhook_configuration_uses():
    pod, options = _certificate_command()
    assert options.apply
    target = _webhook_hook()["clientConfig"]["service"]
    assert (options.service, options.namespace) == (target["name"], target["namespace"])
    assert options.webhook_configuration == "vgpu-ledger-budgets"
    assert options.secret == "vgpu-ledger-webhook-tls"
    assert pod["serviceAccountName"] == "vgpu-ledger-webhook-certificate"


def test_the_certificate_job_rbac_is_least_privilege():
    _, options = _certificate_command()
    role = _one("Role", "vgpu-ledger-webhook-certificate")
    assert role["metadata"]["namespace"] == options.namespace
    grants = {(g, r, v, tuple(sorted(rule.get("resourceNames", [])))) for rule in role["rules"]
              for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    names = tuple(sorted([options.ca_secret, options.secret]))
    # create cannot be limited by name in RBAC; everything else is, to the two Secrets.
    assert grants == {("", "secrets", "get", names), ("", "secrets", "update", names), ("", "secrets", "create", ())}
    cluster_role = _one("ClusterRole", "vgpu-ledger-webhook-certificate")
    assert cluster_role["rules"] == [{"apiGroups": ["admissionregistration.k8s.io"],
                                      "resources": ["validatingwebhookconfigurations"],
                                      "resourceNames": [options.webhook_configuration], "verbs": ["get", "patch"]}]
    for kind, role_kind in (("RoleBinding", "Role"), ("ClusterRoleBinding", "ClusterRole")):
        binding = _one(kind, "vgpu-ledger-webhook-certificate")
        assert binding["roleRef"]["kind"] == role_kind
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "vgpu-ledger-webhook-certificate",
                                        "namespace": options.namespace}]


def test_the_cert_manager_option_issues_the_same_secret_for_the_same_names():
    from billing.services.identity.webhook_tls import service_dns_names

    docs = [d for d in yaml.safe_load_all((DEPLOY / "cert-manager" / "webhook-certificate.yaml").read_text()) if d]
    serving = next(d for d in docs if d["kind"] == "Certificate" and not d["spec"].get("isCA"))
    target = _webhook_hook()["clientConfig"]["service"]
    assert serving["spec"]["secretName"] == "vgpu-ledger-webhook-tls"
    assert serving["spec"]["dnsNames"] == service_dns_names(service=target["name"], namespace=target["namespace"])
    issuers = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Issuer"}
    ca_issuer = issuers[serving["spec"]["issuerRef"]["name"]]
    ca_certificate = next(d for d in docs if d["kind"] == "Certificate" and d["spec"].get("isCA"))
    assert ca_issuer["spec"]["ca"]["secretName"] == ca_certificate["spec"]["secretName"]
    assert ca_certificate["spec"]["issuerRef"]["name"] in issuers
    # The annotation the webhook configuration's comment tells operators to add names this Certificate.
    annotation = f"cert-manager.io/inject-ca-from: {serving['metadata']['namespace']}/{serving['metadata']['name']}"
    assert annotation in (DEPLOY / "k8s" / "admission-webhook.yaml").read_text()
