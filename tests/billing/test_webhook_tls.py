"""The admission webhook over TLS: `manage.py webhook_certificate` stores a CA and a serving
certificate in the cluster (FakeKubernetes, over real HTTP with the official client), and a real
gunicorn serving those files answers AdmissionReviews to a client that trusts only the caBundle
the API server was given, under the Service's DNS name."""

from __future__ import annotations

import base64
import json
import os
import secrets
import socket
import ssl
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from functools import partial
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
import urllib3
import yaml
from cryptography import x509
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from agents.fakes.kube import FakeKubernetes
from billing.ledger.rollup import rollup_usage
from billing.models import RateCard, Tenant
from billing.services.budgets.spend import evaluate_budgets, set_budget
from billing.services.identity.webhook_tls import CA_VALIDITY, StoredCertificates, plan_certificates, service_dns_names
from tests import clock
from tests.billing.test_budgets import review
from tests.conftest import A100, make_batch, state_transitions

ROOT = Path(__file__).resolve().parents[2]
SERVICE_HOST = "vgpu-ledger-web.vgpu-ledger.svc"
NAMESPACE = "vgpu-ledger"
TOKEN = "admission-token-for-tls-tests-0123456789abcdef"
WRITES = {"POST", "PUT", "PATCH", "DELETE"}


@pytest.fixture
def kube() -> Iterator[FakeKubernetes]:
    """An API server holding the webhook configuration exactly as deploy/ ships it."""
    shipped = yaml.safe_load((ROOT / "deploy" / "k8s" / "admission-webhook.yaml").read_text())
    with FakeKubernetes() as fake:
        fake.add_validating_webhook_configuration(shipped)
        yield fake


def apply(kube: FakeKubernetes, *args: str) -> str:
    out = StringIO()
    call_command("webhook_certificate", "--apply", "--kube-api", kube.url, *args, stdout=out)
    return out.getvalue()


def ca_bundle_in(kube: FakeKubernetes) -> bytes:
    """The caBundle the API server would use: the webhook configuration as stored."""
    (hook,) = kube.get_validating_webhook_configuration("vgpu-ledger-budgets")["webhooks"]
    return base64.b64decode(hook["clientConfig"]["caBundle"])


def secret_data(kube: FakeKubernetes, name: str) -> dict[str, bytes]:
    return {k: base64.b64decode(v) for k, v in kube.get_secret(NAMESPACE, name)["data"].items()}


def writes(kube: FakeKubernetes) -> list[tuple[str, str]]:
    return [(r.method, r.path) for r in kube.requests if r.method in WRITES]


def mount_secret(directory: Path, data: dict[str, bytes]) -> None:
    """Project a Secret into `directory` the way kubelet's atomic writer does: the files live in a
    fresh timestamped directory, `..data` is swapped to it in one rename, and each key is a
    symlink through `..data`, so a reader never sees a new certificate with an old key."""
    directory.mkdir(exist_ok=True)
    version = directory / f"..{time.monotonic_ns()}"
    version.mkdir()
    for key, value in data.items():
        (version / key).write_bytes(value)
    swap = directory / "..data_tmp"
    swap.symlink_to(version.name)
    os.replace(swap, directory / "..data")
    for key in data:
        if not (directory / key).is_symlink():
            (directory / key).symlink_to(f"..data/{key}")


@contextmanager
def gunicorn_tls(mount: Path, *, env: dict[str, str] | None = None) -> Iterator[int]:
    """gunicorn serving config.wsgi over TLS on a loopback port, as the web pods' `webhook`
    container runs it (sync workers, --certfile / --keyfile from the mounted Secret)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    port = listener.getsockname()[1]
    command = [sys.executable, "-m", "gunicorn", "config.wsgi", "--bind", f"fd://{listener.fileno()}",
               "--worker-class", "sync", "--workers", "1",
               "--certfile", str(mount / "tls.crt"), "--keyfile", str(mount / "tls.key")]
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.Popen(command, cwd=ROOT, env=full_env, pass_fds=[listener.fileno()],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    listener.close()  # gunicorn holds its own copy
    try:
        _wait_for_handshake(port, proc)
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_for_handshake(port: int, proc: subprocess.Popen[str]) -> None:
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # only "is it up?"
    deadline = time.monotonic() + 30
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"gunicorn exited with {proc.returncode}:\n{proc.stdout.read() if proc.stdout else ''}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as raw, \
                    context.wrap_socket(raw) as tls:
                tls.getpeercert(binary_form=True)
                return
        except (OSError, ssl.SSLError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def served_certificate(port: int, ca_file: Path, *, hostname: str = SERVICE_HOST) -> x509.Certificate:
    """The certificate a new connection is served, verified against `ca_file` for `hostname`."""
    context = ssl.create_default_context(cafile=str(ca_file))
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
            context.wrap_socket(raw, server_hostname=hostname) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


def api_server_client(port: int, ca_file: Path, *, hostname: str = SERVICE_HOST) -> urllib3.HTTPSConnectionPool:
    """A TLS client as the API server is one: it trusts only `ca_file` and checks `hostname`."""
    return urllib3.HTTPSConnectionPool("127.0.0.1", port, ca_certs=str(ca_file), cert_reqs="CERT_REQUIRED",
                                       server_hostname=hostname, assert_hostname=hostname, retries=False,
                                       timeout=10)


def post_review(pool: urllib3.HTTPSConnectionPool, doc: dict, *, token: str | None) -> urllib3.BaseHTTPResponse:
    headers = {"Content-Type": "application/json", "Host": f"{SERVICE_HOST}:8443"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return pool.request("POST", "/api/v1/admission/pods?timeout=5s", body=json.dumps(doc).encode(), headers=headers)


def hold_a_month(margin: timedelta) -> None:
    """The test's usage and the review gunicorn answers (on the real clock) must fall in one month:
    out of the first and the last `margin` of a month, waiting only there (at most 2 × margin)."""
    clock.wait_until_the_month_holds(margin)
    now = clock.now()
    next_month = (clock.month_start(now) + timedelta(days=32)).replace(day=1)
    if next_month - now < margin:
        time.sleep((next_month - now + margin).total_seconds())


@pytest.fixture
def blocked_acme(transactional_db, post_batch) -> None:
    """acme's budget of 0.50 USD is exhausted with the `block` action, committed so that another
    process (gunicorn) sees it: 10 s of 10 % of an A100 at 3600 USD/GPU-h is 1.00 USD."""
    hold_a_month(timedelta(seconds=60))
    RateCard.objects.create(gpu_model=A100["model"], currency="USD", price_per_gpu_hour=Decimal("3600"),
                            effective_from=datetime(2020, 1, 1, tzinfo=UTC), source_url="https://example.org")
    Tenant.objects.create(slug="acme", name="Acme Robotics", namespaces=["acme-prod"])
    set_budget(tenant_slug="acme", now=clock.now(), actor_label="test",
               values={"amount": Decimal("0.50"), "currency": "USD", "hard_action": "block",
                       "owner": "finops@acme.example"})
    workloads = [{"gpu": 0, "tenant": "acme", "pod": "bert-1", "mem_used": 8192.0, "mem_granted": 8192.0,
                  "sm_used": 10.8, "sm_granted": 10.8}]
    start = (clock.now() - timedelta(seconds=15)).replace(microsecond=0)
    assert post_batch(make_batch(start=start, seq=1, seconds=10, workloads=workloads)).status_code == 201
    rollup_usage(now=clock.now())
    assert [t.after for t in state_transitions(evaluate_budgets(now=clock.now()))] == ["enforced"]


def test_the_webhook_answers_over_tls_to_a_client_trusting_only_the_ca_bundle_the_command_gave_the_api_server(
        kube, blocked_acme, tmp_path):
    out = apply(kube)
    assert "patched caBundle into ValidatingWebhookConfiguration vgpu-ledger-budgets" in out
    bundle = tmp_path / "ca-bundle.pem"
    bundle.write_bytes(ca_bundle_in(kube))
    tls = secret_data(kube, "vgpu-ledger-webhook-tls")
    assert set(tls) == {"tls.crt", "tls.key", "ca.crt"}  # never the CA's key: it stays in its own Secret
    mount_secret(tmp_path / "webhook-tls", tls)
    database = urllib.parse.urlsplit(os.environ["DATABASE_URL"])._replace(path="/" + connection.settings_dict["NAME"])
    env = {"DATABASE_URL": database.geturl(), "VGPU_PRODUCTION": "1", "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
           "DJANGO_ALLOWED_HOSTS": SERVICE_HOST, "VGPU_ADMISSION_TOKEN": TOKEN, "VGPU_ADMISSION_TOKEN_FILE": ""}
    with gunicorn_tls(tmp_path / "webhook-tls", env=env) as port:
        pool = api_server_client(port, bundle)
        denied = post_review(pool, review(), token=TOKEN)
        assert denied.status == 200, denied.data
        answer = json.loads(denied.data)
        assert answer["apiVersion"] == "admission.k8s.io/v1"
        assert answer["kind"] == "AdmissionReview"
        assert answer["response"]["uid"] == "705ab4f5-6393-11e8-b7cc-42010a800002"
        assert answer["response"]["allowed"] is False
        assert "blocked" in answer["response"]["status"]["message"]
        assert "finops@acme.example" in answer["response"]["status"]["message"]
        # Another tenant's pod is admitted: the deny is the budget's, not the transport's.
        assert json.loads(post_review(pool, review(namespace="globex-prod"), token=TOKEN).data)["response"][
            "allowed"] is True

        anonymous = post_review(pool, review(), token=None)
        assert anonymous.status == 401
        assert json.loads(anonymous.data)["response"]["allowed"] is False

        # Trusting another CA (one the same command makes elsewhere), the handshake fails.
        call_command("webhook_certificate", "--out", str(tmp_path / "other"), stdout=StringIO())
        with pytest.raises(urllib3.exceptions.SSLError, match="CERTIFICATE_VERIFY_FAILED"):
            post_review(api_server_client(port, tmp_path / "other" / "ca.crt"), review(), token=TOKEN)
        # The right CA but a name the certificate does not carry: refused too.
        with pytest.raises(urllib3.exceptions.SSLError, match=r"match|mismatch"):
            post_review(api_server_client(port, bundle, hostname="vgpu-ledger-web.other.svc"), review(), token=TOKEN)


def test_a_renewed_serving_certificate_is_served_to_new_connections_without_restarting_gunicorn(kube, tmp_path):
    apply(kube)
    bundle = tmp_path / "ca-bundle.pem"
    bundle.write_bytes(ca_bundle_in(kube))
    mount = tmp_path / "webhook-tls"
    first = secret_data(kube, "vgpu-ledger-webhook-tls")
    mount_secret(mount, first)
    with gunicorn_tls(mount) as port:
        before = served_certificate(port, bundle)
        assert before == x509.load_pem_x509_certificate(first["tls.crt"])
        # A new name is a new serving certificate, signed by the same CA.
        assert "stored a new serving certificate" in apply(kube, "--dns-name", "webhook.vgpu-ledger.example")
        assert ca_bundle_in(kube) == bundle.read_bytes()
        renewed = secret_data(kube, "vgpu-ledger-webhook-tls")
        mount_secret(mount, renewed)  # kubelet's periodic sync of the mounted Secret
        after = served_certificate(port, bundle, hostname="webhook.vgpu-ledger.example")
        assert after == x509.load_pem_x509_certificate(renewed["tls.crt"])
        assert after != before
        assert served_certificate(port, bundle).serial_number == after.serial_number


def test_a_second_run_keeps_the_ca_and_changes_nothing(kube):
    first = apply(kube)
    assert "CA issued" in first
    bundle, ca = ca_bundle_in(kube), kube.get_secret(NAMESPACE, "vgpu-ledger-webhook-ca")
    tls = kube.get_secret(NAMESPACE, "vgpu-ledger-webhook-tls")
    assert tls["type"] == "kubernetes.io/tls"
    assert ca["type"] == "Opaque"
    # The patch merged into the webhook by name: everything else of the shipped configuration is kept.
    (hook,) = kube.get_validating_webhook_configuration("vgpu-ledger-budgets")["webhooks"]
    assert hook["rules"][0]["operations"] == ["CREATE", "DELETE"]
    assert hook["clientConfig"]["service"]["port"] == 8443
    done = len(kube.requests)

    second = apply(kube)
    assert "CA kept" in second
    assert "serving certificate kept" in second
    assert "nothing to change" in second
    assert [r for r in kube.requests[done:] if r.method in WRITES] == []
    assert ca_bundle_in(kube) == bundle
    assert kube.get_secret(NAMESPACE, "vgpu-ledger-webhook-ca") == ca
    assert kube.get_secret(NAMESPACE, "vgpu-ledger-webhook-tls") == tls


def test_the_serving_certificate_is_renewed_near_expiry_while_the_ca_and_the_bundle_stay(kube, time_machine):
    apply(kube)
    bundle, ca = ca_bundle_in(kube), secret_data(kube, "vgpu-ledger-webhook-ca")
    old = x509.load_pem_x509_certificate(secret_data(kube, "vgpu-ledger-webhook-tls")["tls.crt"])
    time_machine.move_to(clock.now() + timedelta(days=61), tick=False)  # 29 of its 90 days left
    done = len(kube.requests)
    out = apply(kube)
    assert "expires in 28 days" in out or "expires in 29 days" in out
    assert writes(kube)[-1:] == [("PUT", f"/api/v1/namespaces/{NAMESPACE}/secrets/vgpu-ledger-webhook-tls")]
    assert [w for w in [(r.method, r.path) for r in kube.requests[done:]] if w[0] in WRITES] == writes(kube)[-1:]
    new = x509.load_pem_x509_certificate(secret_data(kube, "vgpu-ledger-webhook-tls")["tls.crt"])
    assert new.not_valid_after_utc > old.not_valid_after_utc + timedelta(days=60)
    new.verify_directly_issued_by(x509.load_pem_x509_certificate(ca["ca.crt"]))
    assert ca_bundle_in(kube) == bundle
    assert secret_data(kube, "vgpu-ledger-webhook-ca") == ca


def test_a_ca_near_its_end_is_replaced_and_the_old_one_stays_in_the_bundle_until_it_expires():
    names = service_dns_names(service="vgpu-ledger-web", namespace=NAMESPACE)
    t0 = datetime(2030, 1, 1, tzinfo=UTC)
    plan = partial(plan_certificates, dns_names=names, serving_validity=timedelta(days=90),
                   renew_before=timedelta(days=30))
    first = plan(stored=StoredCertificates(ca=None, serving=None), now=t0)
    late = t0 + CA_VALIDITY - timedelta(days=60)  # the CA would die before a new serving certificate
    second = plan(stored=StoredCertificates(ca=first.ca, serving=first.serving), now=late)
    assert second.ca_issued
    assert second.serving_issued
    assert x509.load_pem_x509_certificates(second.ca_bundle) == [second.ca.certificate, first.ca.certificate]
    second.serving.certificate.verify_directly_issued_by(second.ca.certificate)
    after = plan(stored=StoredCertificates(ca=second.ca, serving=second.serving),
                 now=t0 + CA_VALIDITY + timedelta(days=1))
    assert not after.ca_issued
    assert x509.load_pem_x509_certificates(after.ca_bundle) == [second.ca.certificate]
    # A CA left to expire (no run for months) is replaced too, and the dead one is not bundled.
    revived = plan(stored=StoredCertificates(ca=first.ca, serving=first.serving),
                   now=t0 + CA_VALIDITY + timedelta(days=1))
    assert revived.ca_issued
    assert "the CA expired" in revived.reasons
    assert x509.load_pem_x509_certificates(revived.ca_bundle) == [revived.ca.certificate]


def _ca_secret(data: dict[str, bytes]) -> dict:
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": "vgpu-ledger-webhook-ca", "namespace": NAMESPACE},
            "data": {k: base64.b64encode(v).decode() for k, v in data.items()}}


def test_a_stored_ca_that_cannot_be_used_is_refused_and_nothing_is_written(kube, tmp_path):
    call_command("webhook_certificate", "--out", str(tmp_path / "a"), stdout=StringIO())
    call_command("webhook_certificate", "--out", str(tmp_path / "b"), stdout=StringIO())
    a, b = tmp_path / "a", tmp_path / "b"
    kube.add_secret(_ca_secret({"ca.crt": (a / "ca.crt").read_bytes(), "ca.key": (b / "ca.key").read_bytes()}))
    with pytest.raises(CommandError, match="CA key does not belong to the stored CA certificate"):
        apply(kube)
    assert writes(kube) == []
    assert kube.get_validating_webhook_configuration("vgpu-ledger-budgets")["webhooks"][0]["clientConfig"][
        "caBundle"] == ""


def test_half_a_ca_a_garbled_one_or_a_serving_certificate_as_ca_is_refused(kube, tmp_path):
    call_command("webhook_certificate", "--out", str(tmp_path), stdout=StringIO())
    kube.add_secret(_ca_secret({"ca.crt": (tmp_path / "tls.crt").read_bytes(),
                                "ca.key": (tmp_path / "tls.key").read_bytes()}))
    with pytest.raises(CommandError, match="not a CA"):
        apply(kube)
    kube.add_secret({**_ca_secret({"ca.crt": (tmp_path / "ca.crt").read_bytes()}),
                     "metadata": {"name": "half-a-ca", "namespace": NAMESPACE}})
    with pytest.raises(CommandError, match="has a certificate but no key"):
        apply(kube, "--ca-secret", "half-a-ca")
    kube.add_secret({**_ca_secret({"ca.crt": b"not a certificate", "ca.key": b"nor a key"}),
                     "metadata": {"name": "garbled-ca", "namespace": NAMESPACE}})
    with pytest.raises(CommandError, match="the stored CA cannot be read"):
        apply(kube, "--ca-secret", "garbled-ca")
    assert writes(kube) == []


def test_without_the_webhook_configuration_or_with_cert_manager_managing_it_the_command_stops(kube):
    with pytest.raises(CommandError, match=r"ValidatingWebhookConfiguration nope not found: apply "
                                           r"deploy/k8s/admission-webhook\.yaml first"):
        apply(kube, "--webhook-configuration", "nope")
    managed = yaml.safe_load((ROOT / "deploy" / "k8s" / "admission-webhook.yaml").read_text())
    managed["metadata"] = {"name": "managed", "annotations": {
        "cert-manager.io/inject-ca-from": "vgpu-ledger/vgpu-ledger-webhook"}}
    kube.add_validating_webhook_configuration(managed)
    with pytest.raises(CommandError, match="cert-manager manages its caBundle"):
        apply(kube, "--webhook-configuration", "managed")
    assert writes(kube) == []


def test_an_unreachable_api_server_is_a_clear_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    with pytest.raises(CommandError, match="cannot read ValidatingWebhookConfiguration vgpu-ledger-budgets"):
        call_command("webhook_certificate", "--apply", "--kube-api", f"http://127.0.0.1:{port}", stdout=StringIO())


def test_out_writes_pem_files_with_private_keys_and_a_rerun_keeps_them(tmp_path):
    out = StringIO()
    call_command("webhook_certificate", "--out", str(tmp_path), "--namespace", "billing",
                 "--dns-name", "webhook.example.internal", stdout=out)
    assert {p.name for p in tmp_path.iterdir()} == {"ca.crt", "ca.key", "tls.crt", "tls.key"}
    assert (tmp_path / "tls.key").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "ca.key").stat().st_mode & 0o777 == 0o600
    cert = x509.load_pem_x509_certificate((tmp_path / "tls.crt").read_bytes())
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate((tmp_path / "ca.crt").read_bytes()))
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == [
        "vgpu-ledger-web.billing.svc", "vgpu-ledger-web.billing.svc.cluster.local", "webhook.example.internal"]
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    again = StringIO()
    call_command("webhook_certificate", "--out", str(tmp_path), "--namespace", "billing",
                 "--dns-name", "webhook.example.internal", stdout=again)
    assert "nothing to change" in again.getvalue()
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


@pytest.mark.parametrize(("args", "message"), [
    (["--valid-days", "0"], "--valid-days must be at least 1"),
    (["--valid-days", "30", "--renew-days", "30"], "must be shorter than the validity"),
])
def test_lifetimes_that_make_no_sense_are_refused(tmp_path, args, message):
    with pytest.raises(CommandError, match=message):
        call_command("webhook_certificate", "--out", str(tmp_path), *args, stdout=StringIO())
    assert not tmp_path.joinpath("ca.key").exists()


# --- The fake API server refuses what the real one refuses -----------------------------------------


def raw_body(body: dict[str, Any]) -> Any:
    """A JSON body for the kubernetes client, which sends a dict as it is although its annotations
    name only its own model classes (V1Secret)."""
    return body


def test_fake_kubernetes_validates_tls_secrets_and_refuses_stale_updates(kube):
    configuration = k8s.Configuration()
    configuration.host = kube.url
    core = k8s.CoreV1Api(k8s.ApiClient(configuration))
    # Raw JSON bodies (raw_body), so the fake server is checked against exactly what a manifest or
    # kubectl would send.
    body: dict[str, Any] = {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
                            "metadata": {"name": "t", "namespace": NAMESPACE}, "data": {"tls.crt": "Y2VydA=="}}
    with pytest.raises(ApiException) as missing:
        core.create_namespaced_secret(NAMESPACE, raw_body(body))
    assert missing.value.status == 422
    assert "data[tls.key]: Required value" in (missing.value.body or "")
    body["data"]["tls.key"] = "a2V5"
    created = core.create_namespaced_secret(NAMESPACE, raw_body(body))
    assert created.metadata is not None
    with pytest.raises(ApiException) as exists:
        core.create_namespaced_secret(NAMESPACE, raw_body(body))
    assert exists.value.status == 409
    updated = core.replace_namespaced_secret("t", NAMESPACE, raw_body({
        **body, "metadata": {**body["metadata"], "resourceVersion": created.metadata.resource_version}}))
    with pytest.raises(ApiException) as stale:
        core.replace_namespaced_secret("t", NAMESPACE, raw_body({
            **body, "metadata": {**body["metadata"], "resourceVersion": created.metadata.resource_version}}))
    assert stale.value.status == 409
    assert "the object has been modified" in (stale.value.body or "")
    assert updated.metadata is not None
    with pytest.raises(ApiException) as retyped:
        core.replace_namespaced_secret("t", NAMESPACE, raw_body({**body, "type": "Opaque", "metadata": {
            **body["metadata"], "resourceVersion": updated.metadata.resource_version}}))
    assert retyped.value.status == 422
    assert "field is immutable" in (retyped.value.body or "")
    with pytest.raises(ApiException) as not_base64:
        core.create_namespaced_secret(NAMESPACE, raw_body({**body, "metadata": {"name": "u"}, "data": {
            "tls.crt": "not base64!", "tls.key": "a2V5"}}))
    assert not_base64.value.status == 400
