"""core/v1 Secrets and admissionregistration.k8s.io/v1 ValidatingWebhookConfigurations."""

from __future__ import annotations

import base64
import binascii
import copy
import re
import uuid
from datetime import UTC, datetime
from typing import Any

from agents.fakes.kube.store import Store
from agents.fakes.kube.wire import ApiError, Kind, merge_patch, rfc3339

# What `manage.py webhook_certificate --apply` calls: get / create / replace (PUT) Secrets, get /
# patch the webhook configuration (the client sends a dict as a strategic merge patch).

_SECRETS = Kind("secrets", "Secret", "v1", frozenset({"metadata.name", "metadata.namespace"}))
_WEBHOOK_CONFIGS = Kind(
    "validatingwebhookconfigurations",
    "ValidatingWebhookConfiguration",
    "admissionregistration.k8s.io/v1",
    frozenset({"metadata.name"}),
)
CERTIFICATE_ROUTES: list[tuple[str, re.Pattern[str]]] = [
    ("secrets", re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/secrets$")),
    ("secret", re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/secrets/(?P<name>[^/]+)$")),
    (
        "validating_webhook_configuration",
        re.compile(r"^/apis/admissionregistration\.k8s\.io/v1/validatingwebhookconfigurations/(?P<name>[^/]+)$"),
    ),
]
# The lists the API's strategic merge patch merges by key instead of replacing
# (``patchMergeKey`` in the OpenAPI schema), by path from the object's root.
_STRATEGIC_MERGE_KEYS: dict[tuple[str, ...], str] = {("webhooks",): "name"}


def _check_base64(values: dict[str, Any], *, field_path: str) -> None:
    """The API server decodes ``[]byte`` fields and refuses a value that is not base64."""
    for key, value in values.items():
        try:
            base64.b64decode(str(value), validate=True)
        except binascii.Error as error:
            raise ApiError(400, "BadRequest", f"{field_path}[{key}]: illegal base64 data: {error}") from error


def _validate_secret(secret: dict[str, Any], *, before: dict[str, Any] | None) -> None:
    """The API server's validation of a Secret that matters here: base64 data, the keys a
    ``kubernetes.io/tls`` Secret must have, and ``type`` immutable once created."""
    data = secret.get("data") or {}
    if not isinstance(data, dict):
        raise ApiError(400, "BadRequest", "Secret.data must be an object of base64 strings")
    _check_base64(data, field_path="data")
    kind = secret.get("type") or "Opaque"
    if kind == "kubernetes.io/tls":
        missing = [key for key in ("tls.crt", "tls.key") if key not in data]
        if missing:
            raise ApiError(422, "Invalid", f"Secret \"{secret['metadata']['name']}\" is invalid: data[{missing[0]}]: "
                            "Required value")
    if before is not None and (before.get("type") or "Opaque") != kind:
        raise ApiError(422, "Invalid", f"Secret \"{secret['metadata']['name']}\" is invalid: type: Invalid value: "
                        f"\"{kind}\": field is immutable")


def _strategic_merge(target: dict[str, Any], patch: dict[str, Any], *, path: tuple[str, ...] = ()) -> None:
    """Strategic merge patch: a JSON merge patch, except that the lists named in
    ``_STRATEGIC_MERGE_KEYS`` merge element by element on their key. Directives (``$patch``,
    ``$setElementOrder``...) are refused rather than misapplied."""
    for key, value in patch.items():
        if key.startswith("$"):
            raise ApiError(422, "Invalid", f"FakeKubernetes does not implement the patch directive {key!r}")
        merge_key = _STRATEGIC_MERGE_KEYS.get((*path, key))
        if value is None:
            target.pop(key, None)
        elif merge_key is not None and isinstance(value, list):
            current = target.setdefault(key, [])
            for element in value:
                if not isinstance(element, dict) or merge_key not in element:
                    raise ApiError(400, "BadRequest", f"{key}: every element must have its merge key {merge_key!r}")
                match = next((e for e in current if e.get(merge_key) == element[merge_key]), None)
                if match is None:
                    current.append(copy.deepcopy(element))
                else:
                    _strategic_merge(match, element, path=(*path, key))
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _strategic_merge(target[key], value, path=(*path, key))
        else:
            target[key] = copy.deepcopy(value)


class CertificateObjects(Store):
    """Secrets and webhook configurations, kept in the store's objects but written with the API
    server's own checks (``_store_object``) rather than the tests' ``_put``."""

    def add_secret(self, secret: dict[str, Any]) -> dict[str, Any]:
        namespace = secret.get("metadata", {}).get("namespace", "default")
        return self._create_namespaced(_SECRETS, namespace, secret)

    def get_secret(self, namespace: str, name: str) -> dict[str, Any]:
        """The Secret as stored (``data`` base64, as on the wire)."""
        return self._get_object(_SECRETS, (namespace, name))

    def add_validating_webhook_configuration(self, config: dict[str, Any]) -> dict[str, Any]:
        return self._store_object(_WEBHOOK_CONFIGS, ("", config["metadata"]["name"]), config, create=True)

    def get_validating_webhook_configuration(self, name: str) -> dict[str, Any]:
        return self._get_object(_WEBHOOK_CONFIGS, ("", name))

    def _serve_certificate_objects(
        self, method: str, route: str, params: dict[str, str], body: dict[str, Any], content_type: str
    ) -> tuple[int, dict[str, Any]]:
        if route == "secrets" and method == "POST":
            return 201, self._create_namespaced(_SECRETS, params["ns"], body)
        if route == "secret" and method == "GET":
            return 200, self._get_object(_SECRETS, (params["ns"], params["name"]))
        if route == "secret" and method == "PUT":
            return 200, self._replace_secret(params["ns"], params["name"], body)
        if route == "validating_webhook_configuration" and method == "GET":
            return 200, self._get_object(_WEBHOOK_CONFIGS, ("", params["name"]))
        if route == "validating_webhook_configuration" and method == "PATCH":
            return 200, self._patch_webhook_configuration(params["name"], body, content_type)
        raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on {route}")

    def _create_namespaced(self, kind: Kind, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        meta = body.get("metadata") or {}
        if meta.get("namespace", namespace) != namespace:
            raise ApiError(400, "BadRequest", "the namespace of the provided object does not match the namespace "
                            "sent on the request")
        if not meta.get("name"):
            raise ApiError(422, "Invalid", f"{kind.kind}.metadata.name: Required value: name or generateName is "
                            "required")
        if kind is _SECRETS:
            _validate_secret(body, before=None)
        stored = copy.deepcopy(body)
        stored["metadata"]["namespace"] = namespace
        return self._store_object(kind, (namespace, meta["name"]), stored, create=True)

    def _replace_secret(self, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        meta = body.get("metadata") or {}
        if meta.get("name") != name:
            raise ApiError(400, "BadRequest", "the name of the object does not match the name on the URL")
        if meta.get("namespace", namespace) != namespace:
            raise ApiError(400, "BadRequest", "the namespace of the provided object does not match the namespace "
                            "sent on the request")
        _validate_secret(body, before=self._get_object(_SECRETS, (namespace, name)))
        stored = copy.deepcopy(body)
        stored["metadata"]["namespace"] = namespace
        return self._store_object(_SECRETS, (namespace, name), stored, create=False)

    def _patch_webhook_configuration(self, name: str, patch: Any, content_type: str) -> dict[str, Any]:
        config = self._get_object(_WEBHOOK_CONFIGS, ("", name))
        if not isinstance(patch, dict):
            raise ApiError(415, "UnsupportedMediaType", "FakeKubernetes patches webhook configurations with merge "
                            "or strategic merge patches only")
        if "strategic-merge-patch" in content_type:
            _strategic_merge(config, patch)
        elif "merge-patch" in content_type:
            merge_patch(config, patch)
        else:
            raise ApiError(415, "UnsupportedMediaType", f"the body of a PATCH must match {content_type}")
        for hook in config.get("webhooks") or []:
            bundle = (hook.get("clientConfig") or {}).get("caBundle")
            if bundle:
                _check_base64({"caBundle": bundle}, field_path=f"webhooks[{hook.get('name')}].clientConfig")
        # A resourceVersion in the patch is a precondition, as in the API server.
        return self._store_object(_WEBHOOK_CONFIGS, ("", name), config, create=False)

    def _get_object(self, kind: Kind, key: tuple[str, str]) -> dict[str, Any]:
        with self._cond:
            obj = self._objects.setdefault(kind.resource, {}).get(key)
            if obj is None:
                raise ApiError(404, "NotFound", f'{kind.resource} "{key[1]}" not found',
                                {"name": key[1], "kind": kind.resource})
            return copy.deepcopy(obj)

    def _store_object(self, kind: Kind, key: tuple[str, str], obj: dict[str, Any], *, create: bool) -> dict[str, Any]:
        """Create or update with the API server's optimistic concurrency: an update that names a
        ``resourceVersion`` other than the stored one is a 409 Conflict."""
        stored = copy.deepcopy(obj)
        meta = stored.setdefault("metadata", {})
        with self._cond:
            objects = self._objects.setdefault(kind.resource, {})
            before = objects.get(key)
            if create and before is not None:
                raise ApiError(409, "AlreadyExists", f'{kind.resource} "{key[1]}" already exists',
                                {"name": key[1], "kind": kind.resource})
            if not create and before is None:
                raise ApiError(404, "NotFound", f'{kind.resource} "{key[1]}" not found',
                                {"name": key[1], "kind": kind.resource})
            wanted = meta.get("resourceVersion")
            if before is not None and wanted and wanted != before["metadata"]["resourceVersion"]:
                raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on {kind.resource} "{key[1]}": the '
                                "object has been modified; please apply your changes to the latest version and try "
                                "again")
            self._resource_version += 1
            meta["resourceVersion"] = str(self._resource_version)
            if before is not None:
                meta["uid"] = before["metadata"]["uid"]
                meta["creationTimestamp"] = before["metadata"]["creationTimestamp"]
            else:
                meta["uid"] = str(uuid.uuid4())
                meta["creationTimestamp"] = rfc3339(datetime.now(UTC))
            stored["kind"] = kind.kind
            stored["apiVersion"] = kind.api_version
            objects[key] = stored
            self._cond.notify_all()
            return copy.deepcopy(stored)
