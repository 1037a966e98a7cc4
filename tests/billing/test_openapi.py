"""The published OpenAPI schema documents the agent endpoints of wire protocol v1."""

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import schemathesis
from django.urls import path
from drf_spectacular.utils import extend_schema
from hypothesis import HealthCheck, given, settings
from openapi_spec_validator import validate
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView
from schemathesis.checks import not_a_server_error

from billing.ledger.models import UsageBatch
from billing.models import ApiToken, Gpu
from billing.scope import FINANCE_GROUP
from billing.services.identity.api_tokens import issue_api_token
from billing.services.ingest.batch_schema import usage_batch_schema
from billing.urls import urlpatterns as app_urls
from tests import clock
from tests.billing.test_ingest_protocol import raw_rows
from tests.conftest import user_in


@pytest.mark.django_db
def test_openapi_schema_lists_the_agent_endpoints_and_their_status_codes(client):
    resp = client.get("/api/v1/schema", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert resp.status_code == 200
    schema = json.loads(resp.content)
    paths = schema["paths"]
    assert set(paths) >= {"/api/v1/usage/batches", "/api/v1/nodes/{node}/policy", "/api/v1/nodes/{node}/events",
                          "/api/v1/nodes/{node}/undelivered", "/api/v1/admission/pods"}
    codes = set(paths["/api/v1/usage/batches"]["post"]["responses"])
    assert codes == {"200", "201", "400", "401", "403", "409", "413", "415", "429", "503"}
    assert set(paths["/api/v1/nodes/{node}/policy"]["get"]["responses"]) == {"200", "304", "401", "403", "503"}
    assert set(paths["/api/v1/admission/pods"]["post"]["responses"]) == {"200", "400", "401", "503"}


@pytest.mark.django_db
def test_every_operation_names_its_security_scheme_and_its_errors_body(client):
    document = json.loads(client.get("/api/v1/schema", HTTP_ACCEPT="application/vnd.oai.openapi+json").content)
    schemes = document["components"]["securitySchemes"]
    assert {"nodeToken", "admissionToken", "apiToken", "cookieAuth"} <= set(schemes)
    assert all(s["type"] == "http" and s["scheme"] == "bearer" for name, s in schemes.items() if name != "cookieAuth")
    assert schemes["cookieAuth"]["type"] == "apiKey"
    assert schemes["cookieAuth"]["in"] == "cookie"
    for route, operations in document["paths"].items():
        # The read API (OpenCost's allocation and assets) answers its errors in OpenCost's shape.
        reading = route.removeprefix("/api/v1").removeprefix("/model").startswith(("/allocation", "/assets"))
        for method, operation in operations.items():
            expected: list[list[dict[str, list[str]]]] = (
                [[{"apiToken": []}, {"cookieAuth": []}]] if reading
                else [[{"nodeToken": []}], [{"admissionToken": []}]])
            assert operation["security"] in expected, (route, method)
            # Bodies: the batch and the other agent bodies are published, never a bare object.
            if method == "post":
                body = operation["requestBody"]["content"]["application/json"]["schema"]
                assert all(one.get("required") for one in body.get("oneOf", [body])), route
            for code, answer in operation["responses"].items():
                if code.startswith(("4", "5")) and route != "/api/v1/admission/pods":
                    errors = "AllocationError" if reading and code != "503" else "Errors"
                    assert answer["content"]["application/json"]["schema"] == {"$ref": f"#/components/schemas/{errors}"}
            assert "WWW-Authenticate" in operation["responses"]["401"]["headers"]
            assert "Retry-After" in operation["responses"]["503"]["headers"]


def test_a_read_api_view_needs_only_its_decorator():
    """The read API's views keep DRF's default authentication: the document then gives
    them the API token and the session cookie as schemes, 401 and 503, and 403 to a write."""
    from drf_spectacular.generators import SchemaGenerator

    class Reading(APIView):  # type: ignore[misc]  # DRF ships no type hints
        @extend_schema(operation_id="read_something", responses={200: {"type": "object"}})
        def get(self, request):
            return Response({})

        @extend_schema(operation_id="write_something", request=None, responses={201: {"type": "object"}})
        def post(self, request):
            return Response({}, status=201)

    document = SchemaGenerator(patterns=[path("api/v1/reading", Reading.as_view())]).get_schema(request=None,
                                                                                                 public=True)
    validate(document)
    operations = document["paths"]["/api/v1/reading"]
    assert operations["get"]["security"] == [{"apiToken": []}, {"cookieAuth": []}]
    assert set(operations["get"]["responses"]) == {"200", "401", "503"}
    assert set(operations["post"]["responses"]) == {"201", "401", "403", "503"}
    assert document["components"]["securitySchemes"]["apiToken"]["bearerFormat"] == "vgla_…"
    assert document["components"]["securitySchemes"]["cookieAuth"] == {"type": "apiKey", "in": "cookie",
                                                                       "name": "sessionid"}


# --- The batch schema, and inputs generated from it -----------------------------------------

BATCHES = "/api/v1/usage/batches"


def stored() -> tuple[int, int, int]:
    return UsageBatch.objects.count(), Gpu.objects.count(), raw_rows()


@pytest.mark.django_db
def test_the_document_is_valid_openapi_and_publishes_the_batch_schema(client):
    document = json.loads(client.get("/api/v1/schema", HTTP_ACCEPT="application/vnd.oai.openapi+json").content)
    validate(document)  # openapi-spec-validator: the document a client generates from is well formed
    body = document["paths"][BATCHES]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body == usage_batch_schema()
    v1, v2 = body["oneOf"]
    assert v1["properties"]["schema"]["enum"] == ["vgpu-ledger/usage-batch/v1"]
    assert v2["properties"]["schema"]["enum"] == ["vgpu-ledger/usage-batch/v2"]
    sample, window = v1["properties"]["samples"]["items"], v2["properties"]["windows"]["items"]
    for item in (sample, window):
        assert item["properties"]["tenant"]["maxLength"] == 63
        assert item["properties"]["pod_uid"]["anyOf"]
    assert {"mem_billed_mb_s", "sm_billed_s", "mem_peak_mb", "sm_peak"} <= set(window["required"])
    assert window["properties"]["seconds"]["maximum"] == 60


@pytest.fixture
def api_schema(db):
    """The published document, read from the real WSGI application. Like Django's test client,
    requests keep the test's database connection (Django closes it at the end of a request)."""
    from django.core import signals
    from django.db import close_old_connections

    from config.wsgi import application

    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    try:
        yield schemathesis.openapi.from_wsgi("/api/v1/schema", application,
                                             headers={"Accept": "application/vnd.oai.openapi+json"})
    finally:
        signals.request_started.connect(close_old_connections)
        signals.request_finished.connect(close_old_connections)


@pytest.mark.django_db
def test_schemathesis_against_the_running_app_finds_no_server_error(api_schema, node_token):
    """schemathesis drives the real WSGI application with requests generated from the published
    document (valid and invalid ones), authenticated as a node."""
    operation = api_schema[BATCHES]["POST"]
    statuses: list[int] = []

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy())
    def run(case):
        before = stored()
        response = case.call(headers={"Authorization": f"Bearer {node_token.token}"})
        case.validate_response(response, checks=(not_a_server_error,))
        statuses.append(response.status_code)
        if response.status_code >= 400:
            assert stored() == before

    run()
    assert len(statuses) >= 30
    assert max(statuses) < 500


# --- The whole document on a live server ----------------------------------------------------

class WhoAmI(APIView):  # type: ignore[misc]  # DRF ships no type hints
    """A stand-in for the read API until its views land: DRF's default authentication
    and a decorator, nothing else, as a read API view is written."""

    @extend_schema(operation_id="test_whoami", responses={200: {
        "type": "object", "required": ["user"], "properties": {"user": {"type": "string"}}}})
    def get(self, request: Request) -> Response:
        return Response({"user": request.user.get_username()})


urlpatterns = [path("api/v1/test/whoami", WhoAmI.as_view()), *app_urls]

ST = Path(sys.executable).parent / "st"
# Every check that holds for any API: no 5xx, only documented status codes, content types, headers
# and bodies as documented, schema-invalid requests refused, and no operation answering without
# its credential. (positive_data_acceptance cannot hold: a batch can match the schema and still
# break a rule no schema can state, such as use above capacity × seconds.)
CHECKS = ("not_a_server_error,status_code_conformance,content_type_conformance,response_headers_conformance,"
          "response_schema_conformance,negative_data_rejection,ignored_auth")


# The same views at a second path (billing/urls.py): OpenCost's paths at the root and /compute
# serve what /api/v1/allocation[/summary] and /api/v1/assets serve. Their coverage phase (every
# boundary value of every parameter, about 200 requests an operation, a third of the run) tested
# the same parsing again; they keep the examples and fuzzing phases and every check.
SAME_VIEW_AGAIN = r"^/(allocation|assets)|^/api/v1/allocation/compute"


def schemathesis_config(*, node: str, node_token: str, api_token: str) -> str:
    """Each operation gets the credential of its security scheme: the node's token by default
    (the admission webhook is given the same token as its own), a finance user's API token for
    the read API's operations, and the token's node for the node endpoints (any other answers
    403 before its body is read). The coverage phase runs once per view (SAME_VIEW_AGAIN)."""
    return (f'headers = {{ Authorization = "Bearer {node_token}" }}\n'
            f'[parameters]\n"path.node" = "{node}"\n'
            f'[[operations]]\ninclude-by = "/security/0/apiToken == []"\n'
            f'headers = {{ Authorization = "Bearer {api_token}" }}\n'
            f"[[operations]]\ninclude-path-regex = '{SAME_VIEW_AGAIN}'\n"
            'phases.coverage.enabled = false\n')


@pytest.mark.urls("tests.billing.test_openapi")
@pytest.mark.django_db(transaction=True)
def test_schemathesis_on_a_live_server_finds_no_undocumented_answer(live_server, node_token, settings, tmp_path):
    """`st run` (schemathesis's CLI, in a subprocess) against the project on a loopback server,
    every operation, with few examples each and a fixed seed so a failure reproduces."""
    settings.VGPU_ADMISSION_TOKEN, settings.VGPU_ADMISSION_TOKEN_FILE = node_token.token, ""
    api_token = issue_api_token(username=user_in(FINANCE_GROUP).username, name="schemathesis", expires_at=None,
                                now=clock.now(), actor_label="test").token
    config = tmp_path / "schemathesis.toml"
    config.write_text(schemathesis_config(node=node_token.node, node_token=node_token.token, api_token=api_token))
    started = time.monotonic()
    proc = subprocess.run(
        [str(ST), "--config-file", str(config), "run", f"{live_server.url}/api/v1/schema", "--checks", CHECKS,
         "--max-examples", "8", "--seed", "17", "--workers", "1", "--phases", "examples,coverage,fuzzing",
         "--no-color", "--request-timeout", "20"],
        check=False, capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-12000:] + proc.stderr[-3000:]
    # Every operation of the document (the agent API's five, the stand-in, the read API's once it lands).
    selected = re.search(r"Operations: +(\d+) selected / (\d+) total", proc.stdout)
    assert selected, proc.stdout[-3000:]
    assert selected[1] == selected[2], proc.stdout[-3000:]
    assert int(selected[1]) >= 6, proc.stdout[-3000:]
    # Each operation was exercised past its authentication (the credentials above).
    assert "returned only 401/403" not in proc.stdout, proc.stdout[-3000:]
    assert ApiToken.objects.get(prefix=api_token[:13]).last_used_at is not None
    # A guard on the fuzzing's cost, not a benchmark: 17 operations since the OpenCost read paths
    # (summary, autocomplete, assets at the root and under /api/v1) at 8 examples each.
    assert time.monotonic() - started < 180
