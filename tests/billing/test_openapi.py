"""The published OpenAPI schema documents the agent endpoints of wire protocol v1."""

import pytest


@pytest.mark.django_db
def test_openapi_schema_lists_the_agent_endpoints_and_their_status_codes(client):
    resp = client.get("/api/v1/schema", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert resp.status_code == 200
    import json

    schema = json.loads(resp.content)
    paths = schema["paths"]
    assert set(paths) >= {"/api/v1/usage/batches", "/api/v1/nodes/{node}/policy", "/api/v1/nodes/{node}/events"}
    codes = set(paths["/api/v1/usage/batches"]["post"]["responses"])
    assert codes == {"200", "201", "400", "401", "403", "409", "413", "415", "429"}
