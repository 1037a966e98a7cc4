"""The service's one way to reach the Kubernetes API server, through the official client.

Node identity (TokenReview), rebalance execution and the webhook certificate command all talk to
the API server of the cluster the service runs in; VGPU_KUBE_API (a URL: a `kubectl proxy`, or a
test's fake API server) points them elsewhere."""

from __future__ import annotations

from typing import Any

from django.conf import settings

__all__ = ["new_api_client"]


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
