"""A pod's controller as people name it, and the pod labels grouping may use (docs/agent.md, Grouping fields).

The controller is the ownerReference marked ``controller: true``, resolved one level up where
that one is an implementation detail: a ReplicaSet owned by a Deployment reports the Deployment,
a Job owned by a CronJob reports the CronJob. Anything else (StatefulSet, DaemonSet, a bare
ReplicaSet or Job, an operator's custom kind) reports the pod's own controller. The one level
needs a read of the ReplicaSet or Job (RBAC: ``get`` on ``apps/replicasets`` and ``batch/jobs``);
when it cannot be read, the pod's own controller is reported rather than nothing, and the read is
tried again later. Results are cached per owner, so the attribution path makes no API call for a
pod whose owner was seen before (every pod of a ReplicaSet shares one read).

Labels: only the keys of an allow-list (``--labels``) are sent, never all of a pod's labels: each
distinct value is a group the ledger keeps, so the operator chooses what is worth grouping by.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence

import urllib3
from kubernetes.client.exceptions import ApiException

__all__ = [
    "DEFAULT_LABEL_KEYS",
    "MAX_LABEL_KEYS",
    "ControllerResolver",
    "ReadController",
    "allowed_labels",
    "parse_label_keys",
]

log = logging.getLogger(__name__)

# A small default: the labels teams put on workloads to say what they are and whose.
DEFAULT_LABEL_KEYS = ("app", "app.kubernetes.io/name", "app.kubernetes.io/part-of", "team")
MAX_LABEL_KEYS = 32  # the service accepts at most 32 labels a sample (docs/protocol.md)
# Kinds whose controller is the name people use: the Deployment behind a ReplicaSet, the CronJob behind a Job.
_RESOLVED_KINDS = frozenset({"ReplicaSet", "Job"})
_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,61}[A-Za-z0-9])?")
_PREFIX = re.compile(r"[a-z0-9](?:[a-z0-9-]*[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]*[a-z0-9])?)*")

ReadController = Callable[..., tuple[str, str] | None]  # (namespace=, kind=, name=) -> its controller


class ControllerResolver:
    """(namespace, controller kind, name) -> the controller to report, cached.

    ``read`` is ``KubeClientPods.read_controller``. A resolved answer is kept for good (an object's
    controller does not change); a failed read falls back to the pod's own controller for
    ``retry_s`` before it is tried again."""

    _MAX_ENTRIES = 4096  # owners on one node; past this the cache starts over

    def __init__(self, *, read: ReadController, retry_s: float = 300.0,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self._read = read
        self._retry_s = retry_s
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._cache: dict[tuple[str, str, str], tuple[tuple[str, str], float | None]] = {}

    def resolve(self, *, namespace: str, owner: tuple[str, str] | None) -> tuple[str, str] | None:
        if owner is None or owner[0] not in _RESOLVED_KINDS:
            return owner
        key = (namespace, *owner)
        with self._lock:
            cached = self._cache.get(key)
        if cached is not None and (cached[1] is None or self._monotonic() < cached[1]):
            return cached[0]
        kind, name = owner
        try:
            above = self._read(namespace=namespace, kind=kind, name=name)
        except (ApiException, urllib3.exceptions.HTTPError, OSError, ValueError) as error:
            status = getattr(error, "status", None)
            log.warning("event=owner_unreadable %s=%s/%s status=%s detail='reporting the %s itself'",
                        kind, namespace, name, status, kind)
            # A 404: the owner is gone and will not come back; anything else may heal (RBAC, network).
            answer, until = owner, (None if status == 404 else self._monotonic() + self._retry_s)
        else:
            answer = above if above is not None and above[0] in ("Deployment", "CronJob") else owner
            until = None
        with self._lock:
            if len(self._cache) >= self._MAX_ENTRIES:
                self._cache.clear()
            self._cache[key] = (answer, until)
        return answer


def parse_label_keys(text: str) -> tuple[str, ...]:
    """``app,team,app.kubernetes.io/name`` -> the allow-list; ValueError naming a key that is not a
    Kubernetes label key, or a list longer than the service accepts."""
    keys = tuple(dict.fromkeys(k.strip() for k in text.split(",") if k.strip()))
    for key in keys:
        prefix, slash, name = key.rpartition("/")
        if not _NAME.fullmatch(name) or (slash and (len(prefix) > 253 or not _PREFIX.fullmatch(prefix))):
            raise ValueError(f"{key!r} is not a Kubernetes label key ([prefix/]name)")
    if len(keys) > MAX_LABEL_KEYS:
        raise ValueError(f"{len(keys)} label keys; at most {MAX_LABEL_KEYS}")
    return keys


def allowed_labels(labels: Mapping[str, str], keys: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """The pod's labels among ``keys``, sorted by key (the wire's and the cache's one order)."""
    return tuple(sorted((k, labels[k]) for k in keys if k in labels))
