"""The service's one way to reach the Kubernetes API server, through the official client.

Node identity (TokenReview), rebalance execution and the webhook certificate command all talk to
the API server of the cluster the service runs in; VGPU_KUBE_API (a URL: a `kubectl proxy`, or a
test's fake API server) points them elsewhere."""

from __future__ import annotations

import threading
from typing import Any

from django.conf import settings

__all__ = ["create_token_review", "new_api_client", "shared_api_client"]


def new_api_client(url: str = "", *, retries: int | None = None) -> Any:
    """A client for `url`, else VGPU_KUBE_API, else the in-cluster configuration (the pod's
    ServiceAccount token, re-read as the kubelet rotates it, and the cluster CA). Raises
    `kubernetes.config.ConfigException` outside a cluster with neither URL. `retries`: urllib3's
    retries per request (None: the client's default)."""
    from kubernetes import client, config

    configuration = client.Configuration()
    if url := url or settings.VGPU_KUBE_API:
        configuration.host = url
    else:
        config.load_incluster_config(client_configuration=configuration)
    if retries is not None:
        configuration.retries = retries
    return client.ApiClient(configuration)


_shared: dict[str, Any] = {}  # URL ("" = in-cluster) -> ApiClient, one per process
_shared_lock = threading.Lock()


def shared_api_client() -> Any:
    """One client for VGPU_KUBE_API per process, so request-time callers (the nodes' and OpenCost's
    clients' TokenReviews) share its connection pool. No retries: the caller answers 503 now and its client
    retries later, rather than a request hanging on a down API server."""
    url = settings.VGPU_KUBE_API
    with _shared_lock:
        api = _shared.get(url)
        if api is None:
            api = _shared[url] = new_api_client(url, retries=0)
        return api


def create_token_review(token: str, *, audiences: list[str]) -> Any:
    """POST a TokenReview of `token` for `audiences` (authentication.k8s.io/v1) and return the
    client's V1TokenReview; the API server's errors and outages are raised as the client raises
    them (ApiException, urllib3 errors) for the caller to classify."""
    from kubernetes import client

    body = client.V1TokenReview(api_version="authentication.k8s.io/v1", kind="TokenReview",
                                spec=client.V1TokenReviewSpec(token=token, audiences=audiences))
    return client.AuthenticationV1Api(shared_api_client()).create_token_review(
        body, _request_timeout=settings.VGPU_KUBE_API_TIMEOUT_S)
