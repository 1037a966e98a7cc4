"""The admission webhook authenticates its caller: anonymous or wrong credentials answer 401 and
reserve or free nothing, with no credential configured every review is refused, and the operator
is told by a system check."""

from __future__ import annotations

import json

import pytest

from billing.checks import check_admission_credentials
from billing.models import AdmittedPod, Tenant
from billing.services.identity.admission_auth import common_name_of
from tests.billing.test_budgets import quota_review

TOKEN = "the-api-servers-token-0123456789abcdef"
URL = "/api/v1/admission/pods"


def post(client, doc, **headers):
    return client.post(URL, json.dumps(doc), content_type="application/json", **headers)


def bearer(token: str) -> dict[str, str]:
    return {"HTTP_AUTHORIZATION": f"Bearer {token}"}


@pytest.fixture
def quota_tenant(db):
    return Tenant.objects.create(slug="acme", name="Acme", namespaces=["acme-prod"], quota_guaranteed_mem_mb=10000)


def reserve(uid: str) -> dict:
    return quota_review(uid=uid, name=uid, mem="4000")


def release(uid: str) -> dict:
    return quota_review(uid=uid, name=uid, operation="DELETE")


def assert_refused(resp, reason: str) -> None:
    assert resp.status_code == 401, resp.content
    body = resp.json()
    assert reason in body["errors"][0]["message"]
    assert body["kind"] == "AdmissionReview"
    assert body["response"]["allowed"] is False
    assert body["response"]["status"]["code"] == 401
    assert resp["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.django_db
def test_with_no_credential_configured_every_review_is_refused_and_nothing_is_reserved(quota_tenant, client, settings):
    settings.VGPU_ADMISSION_TOKEN = ""
    resp = post(client, reserve("p1"), **bearer("anything"))
    assert_refused(resp, "no credential configured")
    assert "VGPU_ADMISSION_TOKEN_FILE" in resp.json()["errors"][0]["message"]
    assert resp.json()["response"]["uid"] == "705ab4f5-6393-11e8-b7cc-42010a800002"
    assert not AdmittedPod.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("headers", [{}, bearer("wrong-token"), bearer(TOKEN + "x"), {"HTTP_AUTHORIZATION": TOKEN},
                                     {"HTTP_AUTHORIZATION": f"Basic {TOKEN}"}],
                         ids=["anonymous", "wrong", "longer", "no-scheme", "basic"])
def test_anonymous_or_wrong_token_can_neither_reserve_nor_free_a_quota(quota_tenant, client, settings, headers):
    settings.VGPU_ADMISSION_TOKEN = TOKEN
    assert post(client, reserve("kept"), **bearer(TOKEN)).json()["response"]["allowed"] is True
    assert_refused(post(client, reserve("intruder"), **headers), "missing or wrong")
    assert_refused(post(client, release("kept"), **headers), "missing or wrong")
    assert list(AdmittedPod.objects.values_list("uid", flat=True)) == ["kept"]
    # The API server's token frees it.
    assert post(client, release("kept"), **bearer(TOKEN)).status_code == 200
    assert not AdmittedPod.objects.exists()


@pytest.mark.django_db
def test_the_token_is_read_from_its_file_on_each_review_so_a_rotated_secret_applies(quota_tenant, client, settings,
                                                                                  tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    settings.VGPU_ADMISSION_TOKEN, settings.VGPU_ADMISSION_TOKEN_FILE = "", str(token_file)
    assert post(client, reserve("p1"), **bearer(TOKEN)).status_code == 200
    token_file.write_text("rotated-token-0123456789abcdefghijkl")
    assert_refused(post(client, reserve("p2"), **bearer(TOKEN)), "missing or wrong")
    assert post(client, reserve("p2"), **bearer("rotated-token-0123456789abcdefghijkl")).status_code == 200
    assert set(AdmittedPod.objects.values_list("uid", flat=True)) == {"p1", "p2"}


@pytest.mark.django_db
def test_an_unreadable_token_file_refuses_every_review_and_says_why(quota_tenant, client, settings, tmp_path):
    settings.VGPU_ADMISSION_TOKEN, settings.VGPU_ADMISSION_TOKEN_FILE = "", str(tmp_path / "missing")
    assert_refused(post(client, reserve("p1"), **bearer(TOKEN)), "cannot be read")
    assert not AdmittedPod.objects.exists()


@pytest.mark.django_db
def test_a_client_certificate_passed_by_the_proxy_authenticates_only_when_configured(quota_tenant, client, settings):
    dn = {"HTTP_X_CLIENT_CERT_DN": "CN=kube-apiserver-webhook,O=cluster"}
    settings.VGPU_ADMISSION_TOKEN = TOKEN
    # Not configured: the header is just a header anyone can send.
    assert_refused(post(client, reserve("p1"), **dn), "missing or wrong")
    settings.VGPU_ADMISSION_CLIENT_CERT_HEADER = "X-Client-Cert-DN"
    settings.VGPU_ADMISSION_CLIENT_CERT_CNS = ["kube-apiserver-webhook"]
    assert post(client, reserve("p1"), **dn).status_code == 200
    assert_refused(post(client, reserve("p2"), HTTP_X_CLIENT_CERT_DN="CN=someone-else"), "missing or wrong")
    assert_refused(post(client, release("p1"), HTTP_X_CLIENT_CERT_DN="CN=someone-else"), "missing or wrong")
    assert list(AdmittedPod.objects.values_list("uid", flat=True)) == ["p1"]


@pytest.mark.parametrize(("dn", "cn"), [
    ("CN=kube-apiserver,O=k8s", "kube-apiserver"),
    ("O=k8s, CN=kube-apiserver", "kube-apiserver"),
    (r"CN=api\, server,O=k8s", "api, server"),
    ("O=k8s", None),
    ("CN=a,CN=b", None),
    ("CN=", None),
    ("", None),
])
def test_common_name_of_a_subject_dn(dn, cn):
    assert common_name_of(dn) == cn


@pytest.mark.parametrize(("values", "check_id"), [
    ({}, "billing.W001"),
    ({"VGPU_ADMISSION_TOKEN": "short"}, "billing.W002"),
    ({"VGPU_ADMISSION_TOKEN": TOKEN, "VGPU_ADMISSION_TOKEN_FILE": "/etc/token"}, "billing.E001"),
    ({"VGPU_ADMISSION_TOKEN_FILE": "/nonexistent/token"}, "billing.E001"),
    ({"VGPU_ADMISSION_CLIENT_CERT_HEADER": "X-Client-Cert-DN"}, "billing.E001"),
    ({"VGPU_ADMISSION_TOKEN": TOKEN}, None),
    ({"VGPU_ADMISSION_CLIENT_CERT_HEADER": "X-Client-Cert-DN", "VGPU_ADMISSION_CLIENT_CERT_CNS": ["apiserver"]}, None),
], ids=["none", "short", "both", "unreadable", "header-without-names", "token", "certificate"])
def test_system_check_tells_the_operator_about_the_admission_credential(settings, values, check_id):
    settings.VGPU_ADMISSION_TOKEN, settings.VGPU_ADMISSION_TOKEN_FILE = "", ""
    settings.VGPU_ADMISSION_CLIENT_CERT_HEADER, settings.VGPU_ADMISSION_CLIENT_CERT_CNS = "", []
    for key, value in values.items():
        setattr(settings, key, value)
    assert [m.id for m in check_admission_credentials()] == ([check_id] if check_id else [])


# --- Reviews the webhook cannot store answer 400, not 500 ---------------------------------------

@pytest.mark.django_db
@pytest.mark.parametrize(("name", "mutate"), [
    ("pod uid beyond its column", lambda d: d["request"]["object"]["metadata"].update(uid="u" * 65)),
    ("NUL in the namespace", lambda d: d["request"].update(namespace="acme-prod\x00")),
    ("lone surrogate in the name", lambda d: d["request"]["object"]["metadata"].update(name="p\ud800")),
    ("NaN SMs", lambda d: d["request"]["object"]["metadata"]["annotations"].update({"vgpu-ledger.io/sm-count": "NaN"})),
    ("memory beyond any fleet", lambda d: d["request"]["object"]["metadata"]["annotations"].update(
        {"vgpu-ledger.io/memory-mb": str(2**70)})),
    ("SMs beyond the column", lambda d: d["request"]["object"]["metadata"]["annotations"].update(
        {"vgpu-ledger.io/sm-count": "1e12"})),
])
def test_a_review_the_webhook_cannot_store_is_a_400_and_reserves_nothing(quota_tenant, client, settings, name, mutate):
    settings.VGPU_ADMISSION_TOKEN = TOKEN
    doc = reserve("p1")
    mutate(doc)
    resp = post(client, doc, **bearer(TOKEN))
    assert resp.status_code == 400, (name, resp.content)
    assert resp.json()["errors"]
    assert not AdmittedPod.objects.exists()
