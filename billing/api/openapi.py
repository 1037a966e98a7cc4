"""The OpenAPI document at /api/v1/schema (drf-spectacular): security schemes, the API's one error
body, and a hook that adds what every operation can answer, so that a view's `extend_schema`
lists only its own answers.

- A read API view that keeps DRF's default authentication (an API token, or a signed-in browser's
  session cookie) gets `apiToken` and `cookieAuth` from ApiTokenScheme and drf-spectacular's own
  extension, and 401 from the hook: decorating it with `extend_schema(responses={200: ...})` is all
  it takes.
- Agent views declare `schema = NodeTokenSchema()`, the admission webhook `AdmissionSchema()`.
- The hook (`complete_responses`, in SPECTACULAR_SETTINGS) adds 503 + Retry-After to every
  operation (OutageMiddleware answers it under /api/ whatever the view), 401 + WWW-Authenticate
  to every authenticated one, 403 to a cookie-authenticated write (CSRF), and Retry-After to 429.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.plumbing import ResolvedComponent
from drf_spectacular.utils import OpenApiResponse

__all__ = ["ERRORS", "ERRORS_SCHEMA", "AdmissionSchema", "ApiTokenScheme", "NodeTokenSchema", "complete_responses", "errors", "without_kubecost_aliases"]

# {"errors": [{"path": "$…", "message": "…"}]}: every error the API answers (billing.api.errors).
# The hook puts it in every document's components, so an answer refers to it by name.
ERRORS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["errors"],
    "properties": {"errors": {"type": "array", "items": {
        "type": "object",
        "required": ["path", "message"],
        "properties": {"path": {"type": "string", "description": "JSON path of the offending part ($: the request)"},
                       "message": {"type": "string"}},
    }}},
}
ERRORS = {"$ref": "#/components/schemas/Errors"}


def errors(description: str) -> OpenApiResponse:
    """An error answer in the API's one error shape."""
    return OpenApiResponse(ERRORS, description=description)


SECURITY_SCHEMES: dict[str, dict[str, Any]] = {
    "apiToken": {"type": "http", "scheme": "bearer", "bearerFormat": "vgla_…",
                 "description": "A person's API token (`manage.py create_api_token USERNAME` or the API tokens page); "
                                "it reads with exactly its user's role (docs/api.md)."},
    "nodeToken": {"type": "http", "scheme": "bearer", "bearerFormat": "vgl_… or a ServiceAccount JWT",
                  "description": "A node token (`manage.py create_node_token NODE`), or in Kubernetes the agent "
                                 "pod's projected ServiceAccount token, checked with a TokenReview "
                                 "(docs/protocol.md, Authentication)."},
    "admissionToken": {"type": "http", "scheme": "bearer",
                       "description": "The API server's token from the webhook kubeconfig (VGPU_ADMISSION_TOKEN_FILE). "
                                      "Instead, a client certificate verified by the TLS-terminating proxy, whose "
                                      "subject it passes in VGPU_ADMISSION_CLIENT_CERT_HEADER (docs/operations.md)."},
}


class ApiTokenScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call]  # its __init_subclass__ has no hints
    target_class = "billing.api.auth.ApiTokenAuthentication"
    name = "apiToken"

    def get_security_definition(self, auto_schema: AutoSchema) -> dict[str, Any]:
        return SECURITY_SCHEMES[self.name]


class _BearerSchema(AutoSchema):
    """A view that checks its callers itself (no DRF authentication): its one security scheme."""

    security_scheme = ""

    def get_auth(self) -> list[dict[str, list[str]]]:
        self.registry.register_on_missing(ResolvedComponent(  # type: ignore[no-untyped-call]  # its __init__ has no hints
            name=self.security_scheme, type=ResolvedComponent.SECURITY_SCHEMA, object=self.security_scheme,
            schema=SECURITY_SCHEMES[self.security_scheme]))
        return [{self.security_scheme: []}]


class NodeTokenSchema(_BearerSchema):
    security_scheme = "nodeToken"


class AdmissionSchema(_BearerSchema):
    security_scheme = "admissionToken"


_RETRY_AFTER = {"Retry-After": {"schema": {"type": "integer"}, "required": True,
                                "description": "seconds to wait before retrying"}}
_CHALLENGE = {"WWW-Authenticate": {"schema": {"type": "string"}, "required": True,
                                   "description": 'Bearer realm="vgpu-ledger"'}}


def _error(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": ERRORS}}}


def without_kubecost_aliases(endpoints: list[Any]) -> list[Any]:
    """drf-spectacular preprocessing hook: the `/model/...` routes are Kubecost-style aliases of the
    read API's own operations (billing/urls.py), for clients that prepend that prefix; documenting
    each operation a third time would say nothing new (and triple what schemathesis fuzzes)."""
    return [endpoint for endpoint in endpoints if not endpoint[0].startswith("/model/")]


def complete_responses(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """drf-spectacular postprocessing hook: the answers no single view decides (see the module)."""
    for operations in result.get("paths", {}).values():
        for method, operation in operations.items():
            responses: dict[str, Any] = operation.setdefault("responses", {})
            security = {name for requirement in operation.get("security", []) for name in requirement}
            if security:
                responses.setdefault("401", _error("Missing, unknown, revoked or expired credentials"))
                responses["401"].setdefault("headers", _CHALLENGE)
            if "cookieAuth" in security and method not in ("get", "head", "options"):
                responses.setdefault("403", _error("A signed-in browser's write without its CSRF token"))
            responses.setdefault("503", _error("The database, or another service this answer needs, is down; "
                                               "nothing was stored"))
            for code in ("429", "503"):
                if code in responses:
                    responses[code].setdefault("headers", _RETRY_AFTER)
    result.setdefault("components", {}).setdefault("schemas", {})["Errors"] = ERRORS_SCHEMA
    return result
