"""The published OpenAPI schema documents the agent endpoints of wire protocol v1."""

import json

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from openapi_spec_validator import validate
from schemathesis.checks import not_a_server_error

from billing.ledger.models import UsageBatch
from billing.models import Gpu
from billing.services.batch_schema import usage_batch_schema
from tests.billing.test_ingest_protocol import raw_rows


@pytest.mark.django_db
def test_openapi_schema_lists_the_agent_endpoints_and_their_status_codes(client):
    resp = client.get("/api/v1/schema", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert resp.status_code == 200
    schema = json.loads(resp.content)
    paths = schema["paths"]
    assert set(paths) >= {"/api/v1/usage/batches", "/api/v1/nodes/{node}/policy", "/api/v1/nodes/{node}/events"}
    codes = set(paths["/api/v1/usage/batches"]["post"]["responses"])
    assert codes == {"200", "201", "400", "401", "403", "409", "413", "415", "429", "503"}


# --- The batch schema, and inputs generated from it (issue 12) ---------------------------------

BATCHES = "/api/v1/usage/batches"


def stored() -> tuple[int, int, int]:
    return UsageBatch.objects.count(), Gpu.objects.count(), raw_rows()


@pytest.mark.django_db
def test_the_document_is_valid_openapi_and_publishes_the_batch_schema(client):
    document = json.loads(client.get("/api/v1/schema", HTTP_ACCEPT="application/vnd.oai.openapi+json").content)
    validate(document)  # openapi-spec-validator: the document a client generates from is well formed
    body = document["paths"][BATCHES]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body == usage_batch_schema()
    sample = body["properties"]["samples"]["items"]
    assert sample["properties"]["tenant"]["maxLength"] == 63 and sample["properties"]["pod_uid"]["anyOf"]


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
    assert len(statuses) >= 30 and max(statuses) < 500
