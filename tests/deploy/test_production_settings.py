"""The web container as deploy/k8s/control-plane.yaml configures it (VGPU_PRODUCTION=1) answers
the callers inside the cluster: the kubelet's readiness probe and Prometheus name the pod by its
IP, agents by the Service's name, all over plain HTTP. A redirect to HTTPS would turn an agent's
POST into a GET and make a probe check nothing; a Host refused with 400 would keep every web pod
unready. Browsers, through the TLS-terminating ingress, still get the HTTPS redirect, and an
unknown Host is still refused.

The settings are read from the environment at import, so each case runs in a fresh interpreter
with the manifest's environment, through Django's real middleware stack."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.parse
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
POD_IP = "10.1.2.3"

_PROBE = """
import json, sys
import django
django.setup()
from django.test import Client
client = Client()
answers = []
for method, path, host in json.loads(sys.argv[1]):
    response = getattr(client, method)(path, HTTP_HOST=host)
    answers.append([response.status_code, response.get("Location", "")])
print(json.dumps(answers))
"""


def _web_environment() -> dict[str, str]:
    """The web container's env from the manifest, with $(POD_IP) expanded as the kubelet does."""
    docs = yaml.safe_load_all((ROOT / "deploy" / "k8s" / "control-plane.yaml").read_text())
    web = next(d for d in docs if d and d["kind"] == "Deployment" and d["metadata"]["name"] == "vgpu-ledger-web")
    container = next(c for c in web["spec"]["template"]["spec"]["containers"] if c["name"] == "web")
    values = {"POD_IP": POD_IP}
    for entry in container["env"]:
        if "value" in entry:
            values[entry["name"]] = entry["value"].replace("$(POD_IP)", POD_IP)
    return values


def _answers(requests: list[tuple[str, str, str]]) -> list[tuple[int, str]]:
    manifest = _web_environment()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VGPU_", "DJANGO_", "PROMETHEUS_"))}
    env |= {
        "VGPU_PRODUCTION": manifest["VGPU_PRODUCTION"],
        "VGPU_INTERNAL_HOSTS": manifest["VGPU_INTERNAL_HOSTS"],
        # What the Secret vgpu-ledger-env holds: the public name and a key.
        "DJANGO_ALLOWED_HOSTS": "ledger.example.com",
        "DJANGO_SECRET_KEY": "a-test-key-that-is-long-enough-for-the-production-checks-0123456789",
        "DJANGO_SETTINGS_MODULE": "config.settings",
        # /readyz asks the database server only to answer: its maintenance database will do.
        "DATABASE_URL": urllib.parse.urlunsplit(urllib.parse.urlsplit(os.environ["DATABASE_URL"])._replace(
            path="/postgres")),
    }
    done = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(requests)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return [tuple(answer) for answer in json.loads(done.stdout.strip().splitlines()[-1])]


def test_cluster_callers_reach_the_web_container_over_http_by_pod_ip_or_service_name():
    service = "vgpu-ledger-web.vgpu-ledger.svc:8000"
    readyz, metrics, batches, policy, finance, stranger = _answers([
        ("get", "/readyz", f"{POD_IP}:8000"),                 # the kubelet's readiness probe
        ("get", "/metrics", f"{POD_IP}:8000"),                # Prometheus, by pod IP
        ("post", "/api/v1/usage/batches", service),           # an agent, without its token
        ("get", "/api/v1/nodes/gpu-1/policy", service),
        ("get", "/finance/", "ledger.example.com"),           # a browser that skipped the ingress
        ("get", "/readyz", "attacker.example"),
    ])
    assert readyz == (200, "")
    # /metrics answers for itself (no scrape token in this environment), never with a redirect.
    assert metrics[0] == 403
    assert metrics[1] == ""
    assert batches == (401, "")
    assert policy == (401, "")
    assert finance == (301, "https://ledger.example.com/finance/")
    assert stranger[0] == 400
