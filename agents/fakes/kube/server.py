"""``FakeKubernetes``: the API server itself, its lifecycle, and the core resources it serves."""

from __future__ import annotations

import copy
import threading
import uuid
from datetime import UTC, datetime
from http.server import ThreadingHTTPServer
from typing import Any

from agents.fakes.kube.certificates import CertificateObjects
from agents.fakes.kube.dra import claim_to_v1
from agents.fakes.kube.routing import handler_for
from agents.fakes.kube.tokens import TokenReviews
from agents.fakes.kube.watch import Watches
from agents.fakes.kube.wire import (
    CLAIMS,
    NAMESPACES,
    NODES,
    OWNER_KINDS,
    PODS,
    ApiError,
    KubeRequest,
    merge_patch,
    rfc3339,
    status_body,
)


class FakeKubernetes(Watches, CertificateObjects, TokenReviews):
    """A Kubernetes API server on loopback that speaks the real JSON shapes over real HTTP.

    Point the official client at it with ``kubernetes.client.Configuration(host=fake.url)``.
    It serves pods (list and watch, ``fieldSelector``, ``resourceVersion``), namespaces
    (get, list, watch), ``pods/eviction`` (``policy/v1`` Eviction), events (``core/v1`` and
    ``events.k8s.io/v1``), ReplicaSets and Jobs (get: pods' owners) and ``resource.k8s.io`` ResourceClaims (get, list, and the group's
    discovery document) in the versions of ``resource_api_versions``.

    Watches stream newline-delimited JSON events (ADDED / MODIFIED / DELETED, BOOKMARK at a
    timeout when asked for) in a chunked response, as the API server does. A watch from a
    ``resourceVersion`` older than the last ``compact()`` gets the API server's
    ``ERROR`` event with a 410 ``Expired`` Status. Tests drive changes with ``add_pod`` /
    ``update_pod`` / ``delete_pod`` (and the namespace and claim equivalents) and read what
    the client did from ``evictions``, ``events`` and ``requests``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.evictions: list[dict[str, Any]] = []  # Eviction bodies the client posted
        self.events: list[dict[str, Any]] = []  # Event objects as stored (core/v1 or events.k8s.io/v1)
        self.requests: list[KubeRequest] = []
        # True: evictions are refused with 429, as when a PodDisruptionBudget forbids them.
        self.refuse_evictions = False
        # True: ReplicaSet and Job reads answer 403, as for an agent whose ClusterRole lacks them.
        self.forbid_owner_reads = False
        # resource.k8s.io versions discovery lists, preferred first; claims are served in those of
        # RESOURCE_GROUP_VERSIONS among them. () serves no DRA API at all.
        self.resource_api_versions: tuple[str, ...] = ("v1",)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), name="fake-kube-api", daemon=True
        )
        self._thread.start()

    # -- lifecycle ---------------------------------------------------------------------

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def close(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> FakeKubernetes:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- state changes (each one is a watch event) ---------------------------------------

    def add_namespace(self, namespace: dict[str, Any]) -> dict[str, Any]:
        return self._put(NAMESPACES, namespace, create=True)

    def update_namespace(self, namespace: dict[str, Any]) -> dict[str, Any]:
        return self._put(NAMESPACES, namespace, create=False)

    def delete_namespace(self, name: str) -> None:
        self._delete(NAMESPACES, ("", name))

    def add_pod(self, pod: dict[str, Any]) -> dict[str, Any]:
        """Store a pod (``metadata.uid`` and ``resourceVersion`` are filled in); returns the stored copy."""
        return self._put(PODS, pod, create=True)

    def update_pod(self, pod: dict[str, Any]) -> dict[str, Any]:
        return self._put(PODS, pod, create=False)

    def delete_pod(self, namespace: str, name: str) -> None:
        self._delete(PODS, (namespace, name))

    def add_node(self, node: dict[str, Any]) -> dict[str, Any]:
        """Store a node (cluster-scoped); the client may GET it and PATCH it (e.g. cordon)."""
        return self._put(NODES, node, create=True)

    def add_resource_claim(self, claim: dict[str, Any]) -> dict[str, Any]:
        """Store a claim written in any resource.k8s.io version (``apiVersion``; v1 when absent)."""
        return self._put(CLAIMS, claim_to_v1(claim), create=True)

    def add_owner(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Store a ReplicaSet (``kind: ReplicaSet``) or a Job (``kind: Job``) that pods name as owner."""
        return self._put(OWNER_KINDS[obj["kind"].lower()], obj, create=True)

    # -- writes the client makes (routing dispatches them here) ---------------------------

    def _evict(self, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        if body.get("kind") != "Eviction" or body.get("apiVersion") != "policy/v1":
            raise ApiError(400, "BadRequest", "the body of a pods/eviction request must be a policy/v1 Eviction")
        if (body.get("metadata") or {}).get("name") != name:
            raise ApiError(400, "BadRequest", "name in URL does not match name in Eviction object")
        pod = self._get(PODS, (namespace, name))
        wanted_uid = ((body.get("deleteOptions") or {}).get("preconditions") or {}).get("uid")
        if wanted_uid is not None and wanted_uid != pod["metadata"]["uid"]:
            raise ApiError(
                409,
                "Conflict",
                f"Precondition failed: UID in precondition: {wanted_uid}, UID in object meta: {pod['metadata']['uid']}",
            )
        if self.refuse_evictions:
            raise ApiError(
                429,
                "TooManyRequests",
                "Cannot evict pod as it would violate the pod's disruption budget.",
                {"causes": [{"reason": "DisruptionBudget", "message": "The disruption budget needs 1 healthy pods"}]},
            )
        with self._cond:
            self.evictions.append(copy.deepcopy(body))
        # Eviction is a graceful delete: the pod stays, marked, until its containers stop.
        pod["metadata"]["deletionTimestamp"] = rfc3339(datetime.now(UTC))
        pod["metadata"]["deletionGracePeriodSeconds"] = 30
        self._put(PODS, pod, create=False)
        return status_body(code=201, reason="", message="")

    def _patch_node(self, name: str, patch: Any, content_type: str) -> dict[str, Any]:
        """JSON merge patch and strategic merge patch (as a merge patch: enough for ``spec``
        fields); a JSON Patch list of ``add`` / ``replace`` / ``remove`` operations."""
        node = self._get(NODES, ("", name))
        if isinstance(patch, dict) and "json-patch" not in content_type:
            merge_patch(node, patch)
        elif isinstance(patch, list):
            for op in patch:
                *parents, leaf = [p for p in str(op.get("path", "")).split("/") if p]
                target = node
                for part in parents:
                    target = target.setdefault(part, {})
                if op.get("op") in ("add", "replace"):
                    target[leaf] = op.get("value")
                elif op.get("op") == "remove":
                    target.pop(leaf, None)
                else:
                    raise ApiError(422, "Invalid", f"FakeKubernetes does not implement JSON Patch op {op.get('op')!r}")
        else:
            raise ApiError(415, "UnsupportedMediaType", f"the body of a PATCH must match {content_type}")
        return self._put(NODES, node, create=False)

    def _create_event(self, namespace: str, body: dict[str, Any], *, api_version: str) -> dict[str, Any]:
        if body.get("kind") != "Event" or body.get("apiVersion") != api_version:
            raise ApiError(400, "BadRequest", f"the body must be an {api_version} Event")
        subject_field = "involvedObject" if api_version == "v1" else "regarding"
        if not isinstance(body.get(subject_field), dict):
            raise ApiError(422, "Invalid", f"Event.{subject_field}: Required value")
        stored = copy.deepcopy(body)
        meta = stored.setdefault("metadata", {})
        if meta.get("namespace", namespace) != namespace:
            raise ApiError(
                400, "BadRequest", "the namespace of the object does not match the namespace on the request"
            )
        meta["namespace"] = namespace
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise ApiError(422, "Invalid", "metadata.name: Required value: name or generateName is required")
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        with self._cond:
            self._resource_version += 1
            meta["resourceVersion"] = str(self._resource_version)
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = rfc3339(datetime.now(UTC))
            self.events.append(copy.deepcopy(stored))
        return stored
