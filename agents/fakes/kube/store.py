"""The fake API server's object store: what etcd holds, its revisions and change history."""

from __future__ import annotations

import copy
import threading
import uuid
from datetime import UTC, datetime
from typing import Any

from agents.fakes.kube.wire import (
    CLAIMS,
    JOBS,
    NAMESPACES,
    NODES,
    REPLICA_SETS,
    ApiError,
    Change,
    Kind,
    Selector,
    rfc3339,
)


class Store:
    """Objects by resource and (namespace, name), one lock, one resource version, and the
    history of the watched resources' changes."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._resource_version = 1000  # etcd revisions are large; start away from 0 ("any")
        self._compacted_rv = 0
        self._history: list[Change] = []
        self._objects: dict[str, dict[tuple[str, str], dict[str, Any]]] = {
            "pods": {},
            "namespaces": {},
            "resourceclaims": {},
            "nodes": {},
            "replicasets": {},
            "jobs": {},
        }

    def get_node(self, name: str) -> dict[str, Any]:
        with self._cond:
            return copy.deepcopy(self._objects["nodes"][("", name)])

    def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        with self._cond:
            return copy.deepcopy(self._objects["pods"][(namespace, name)])

    def _put(self, kind: Kind, obj: dict[str, Any], *, create: bool) -> dict[str, Any]:
        stored = copy.deepcopy(obj)
        meta = stored.setdefault("metadata", {})
        namespace = "" if kind in (NAMESPACES, NODES) else meta.setdefault("namespace", "default")
        key = (namespace, meta["name"])
        with self._cond:
            before = self._objects[kind.resource].get(key)
            if create and before is not None:
                raise ValueError(f"{kind.resource} {key} already exists")
            if not create and before is None:
                raise KeyError(f"{kind.resource} {key} does not exist")
            self._resource_version += 1
            meta["resourceVersion"] = str(self._resource_version)
            if before is not None:
                meta["uid"] = before["metadata"]["uid"]
                meta["creationTimestamp"] = before["metadata"]["creationTimestamp"]
            else:
                meta.setdefault("uid", str(uuid.uuid4()))
                meta.setdefault("creationTimestamp", rfc3339(datetime.now(UTC)))
            stored["kind"] = kind.kind
            stored["apiVersion"] = kind.api_version
            self._objects[kind.resource][key] = stored
            if kind not in (CLAIMS, REPLICA_SETS, JOBS):  # not watched
                self._history.append(Change(self._resource_version, kind.resource, before, stored))
            self._cond.notify_all()
            return copy.deepcopy(stored)

    def _delete(self, kind: Kind, key: tuple[str, str]) -> None:
        with self._cond:
            before = self._objects[kind.resource].pop(key)
            self._resource_version += 1
            gone = copy.deepcopy(before)
            gone["metadata"]["resourceVersion"] = str(self._resource_version)
            # The DELETED event carries the object's last state at the deletion's revision.
            self._history.append(Change(self._resource_version, kind.resource, gone, None))
            self._cond.notify_all()

    def _list(self, kind: Kind, *, namespace: str | None, selector: Selector) -> dict[str, Any]:
        with self._cond:
            items = []
            for (ns, _), obj in sorted(self._objects[kind.resource].items()):
                if namespace is not None and ns != namespace:
                    continue
                if selector.matches(obj):
                    item = copy.deepcopy(obj)
                    # List items carry no kind / apiVersion; the list does.
                    item.pop("kind", None)
                    item.pop("apiVersion", None)
                    items.append(item)
            return {
                "kind": f"{kind.kind}List",
                "apiVersion": kind.api_version,
                "metadata": {"resourceVersion": str(self._resource_version)},
                "items": items,
            }

    def _get(self, kind: Kind, key: tuple[str, str]) -> dict[str, Any]:
        with self._cond:
            obj = self._objects[kind.resource].get(key)
            if obj is None:
                raise ApiError(
                    404,
                    "NotFound",
                    f'{kind.resource} "{key[1]}" not found',
                    {"name": key[1], "kind": kind.resource},
                )
            return copy.deepcopy(obj)
