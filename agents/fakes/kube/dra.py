"""Dynamic resource allocation (resource.k8s.io): discovery, and ResourceClaims in each
served version."""

from __future__ import annotations

import copy
import re
from typing import TYPE_CHECKING, Any

from agents.fakes.kube.wire import CLAIMS, ApiError, parse_field_selector

if TYPE_CHECKING:
    from agents.fakes.kube.server import FakeKubernetes

# Served in the versions of ``FakeKubernetes.resource_api_versions``, as API servers of
# different releases do (1.32: v1beta1; 1.33: v1beta1, v1beta2; 1.34+: v1 as well). Claims
# are stored in the v1 shape and converted on the way in and out, as the API server
# converts between versions: only ``spec.devices.requests[]`` differs (v1beta1 has no
# ``exactly``).

RESOURCE_GROUP_VERSIONS = ("v1", "v1beta2", "v1beta1")  # what the fake can serve, newest first
_CLAIM_VERSION = r"(?P<version>v1|v1beta2|v1beta1)"
DRA_ROUTES: list[tuple[str, re.Pattern[str]]] = [
    ("resource_group", re.compile(r"^/apis/resource\.k8s\.io/?$")),
    ("claims", re.compile(rf"^/apis/resource\.k8s\.io/{_CLAIM_VERSION}/resourceclaims$")),
    (
        "namespaced_claims",
        re.compile(rf"^/apis/resource\.k8s\.io/{_CLAIM_VERSION}/namespaces/(?P<ns>[^/]+)/resourceclaims$"),
    ),
    (
        "claim",
        re.compile(
            rf"^/apis/resource\.k8s\.io/{_CLAIM_VERSION}/namespaces/(?P<ns>[^/]+)/resourceclaims/(?P<name>[^/]+)$"
        ),
    ),
]
DRA_ROUTE_NAMES = frozenset(name for name, _ in DRA_ROUTES)


def _not_served(path: str) -> ApiError:
    """The API server's answer for a group or version it does not serve (as for any unknown path)."""
    return ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")


def _resource_group(versions: tuple[str, ...]) -> dict[str, Any]:
    """The ``APIGroup`` discovery document for resource.k8s.io; the first version is the preferred one."""
    listed = [{"groupVersion": f"resource.k8s.io/{v}", "version": v} for v in versions]
    return {
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": "resource.k8s.io",
        "versions": listed,
        "preferredVersion": listed[0],
    }


def claim_to_v1(claim: dict[str, Any]) -> dict[str, Any]:
    """A claim in any served version's shape, as stored (v1)."""
    stored = copy.deepcopy(claim)
    if stored.get("apiVersion", "resource.k8s.io/v1") == "resource.k8s.io/v1beta1":
        for request in (stored.get("spec") or {}).get("devices", {}).get("requests") or ():
            if "firstAvailable" not in request:
                exactly = {k: request.pop(k) for k in list(request) if k != "name"}
                request["exactly"] = exactly
    return stored


def _claim_in_version(stored: dict[str, Any], version: str) -> dict[str, Any]:
    """A stored (v1) claim as the API server returns it in ``version``."""
    claim = copy.deepcopy(stored)
    if "apiVersion" in claim:  # list items carry none
        claim["apiVersion"] = f"resource.k8s.io/{version}"
    if version == "v1beta1":
        for request in (claim.get("spec") or {}).get("devices", {}).get("requests") or ():
            request.update(request.pop("exactly", {}))
    return claim


def serve_dra(
    fake: FakeKubernetes, route: str, params: dict[str, str], query: dict[str, str], path: str
) -> dict[str, Any]:
    """GET of the discovery document, a claim, or a list of claims (watches are not served)."""
    versions = fake.resource_api_versions
    if not versions:
        raise _not_served(path)
    if route == "resource_group":
        return _resource_group(versions)
    version = params["version"]
    if version not in versions:
        raise _not_served(path)
    if route == "claim":
        return _claim_in_version(fake._get(CLAIMS, (params["ns"], params["name"])), version)
    if query.get("watch") in ("true", "1"):
        raise ApiError(405, "MethodNotAllowed", "FakeKubernetes does not watch resourceclaims")
    selector = parse_field_selector(
        query.get("fieldSelector"), supported=set(CLAIMS.fields), resource=", ".join(sorted(CLAIMS.fields))
    )
    listed = fake._list(CLAIMS, namespace=params.get("ns"), selector=selector)
    listed["apiVersion"] = f"resource.k8s.io/{version}"
    listed["items"] = [_claim_in_version(item, version) for item in listed["items"]]
    return listed
