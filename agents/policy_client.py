"""The node policy, pulled from the service and cached on disk (docs/protocol.md, Node policy).

``GET {server}/api/v1/nodes/{node}/policy`` with the node token and ``If-None-Match``
returns the policy document (``vgpu-ledger/node-policy/v1``)::

    {"schema": "vgpu-ledger/node-policy/v1", "node": "gpu-node-17",
     "sla_tiers": {"gold": {"weight": "4.000",
                            "miss_targets": {"memory": "0.0000010000", "sm": "0.0000100000"}}, ...},
     "tenants": {"acme": {"default_sla_tier": "gold",
                          "budget": {"state": "enforced", "action": "throttle", "throttle_factor": "0.500"}},
                 "globex": {"default_sla_tier": null, "budget": {"state": "ok"}}},
     "namespaces": {"initech-prod": {"budget": {"state": "enforced", "action": "evict-best-effort",
                                                "throttle_factor": "0.500"}}}}

(``miss_targets``: per tier, the share of its workloads' seconds whose use may exceed the grant,
per resource; a service that predates them omits them) and an ``ETag``; a 304 means the policy in hand is still current. Each accepted document
is written (atomically: temporary file, fsync, rename) to a JSON cache next to the spool,
so the agent keeps enforcing the last known policy while the server is away and after a
restart. A document that does not parse is refused as a whole: the previous policy stays.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import logging
import math
import os
import tempfile
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any
from urllib.parse import quote

import requests

from agents.allocation import Policy
from agents.clock import utc_now
from agents.credentials import TokenError
from allocator.risk import MissTarget

__all__ = [
    "BEST_EFFORT_TIER",
    "CACHE_SCHEMA",
    "POLICY_PATH",
    "POLICY_SCHEMA",
    "PolicyClient",
    "PolicySnapshot",
    "PollOutcome",
    "parse_policy",
]

log = logging.getLogger(__name__)

POLICY_PATH = "/api/v1/nodes/{node}/policy"
POLICY_SCHEMA = "vgpu-ledger/node-policy/v1"
CACHE_SCHEMA = "vgpu-ledger/agent-policy-cache/v1"
BEST_EFFORT_TIER = "best-effort"  # the tier ``evict-best-effort`` budgets evict; the fallback tier


@dataclass(frozen=True, slots=True)
class PolicySnapshot:
    """One version of the node policy, as the agent applies it."""

    allocation: Policy  # SLA weights and throttled tenants: the allocation loop's input
    evict_best_effort_tenants: frozenset[str] = frozenset()  # budgets enforced with ``evict-best-effort``
    blocked_tenants: frozenset[str] = frozenset()  # ``block``: enforced at admission; listed for the logs
    # The same for namespaces whose own budget is enforced (the document's optional ``namespaces``).
    evict_best_effort_namespaces: frozenset[str] = frozenset()
    blocked_namespaces: frozenset[str] = frozenset()
    default_tiers: Mapping[str, str] = field(default_factory=dict)  # tenant -> default SLA tier
    etag: str | None = None  # as the server sent it (quotes included); None: never fetched
    fetched_at: datetime | None = None  # when the server last answered 200 for this version

    def default_tier(self, tenant: str) -> str:
        """A tenant's default tier; tenants unknown to the server (or without one) get ``best-effort``."""
        return self.default_tiers.get(tenant) or BEST_EFFORT_TIER


class PollOutcome(enum.Enum):
    UPDATED = "updated"  # 200 with a valid document: applied and cached
    NOT_MODIFIED = "not_modified"  # 304: the policy in hand is current
    FAILED = "failed"  # no usable answer: the policy in hand stays


def _positive_decimal(value: object, path: str) -> float:
    try:
        number = Decimal(str(value)) if isinstance(value, str | int) and not isinstance(value, bool) else None
    except InvalidOperation:
        number = None
    if number is None or not number.is_finite() or number <= 0:
        raise ValueError(f"{path}: expected a positive decimal string, got {value!r}")
    return float(number)


def _miss_target(value: object, path: str) -> MissTarget:
    """``{"memory": "<decimal>", "sm": "<decimal>"}``, each a share in (0, 1)."""
    targets = _object(value, path)
    shares = {}
    for resource in ("memory", "sm"):
        share = _positive_decimal(targets.get(resource), f"{path}.{resource}")
        if share >= 1:
            raise ValueError(f"{path}.{resource}: must be a share in (0, 1), got {targets.get(resource)!r}")
        shares[resource] = share
    try:
        return MissTarget(memory=shares["memory"], sm=shares["sm"])
    except ValueError as error:  # a decimal too small for a float reads as 0
        raise ValueError(f"{path}: {error}") from None


def _object(value: object, path: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ValueError(f"{path}: expected a JSON object, got {value!r}")
    return value


def parse_policy(
    body: Mapping[str, Any], *, base: Policy, etag: str | None = None, fetched_at: datetime | None = None
) -> PolicySnapshot:
    """The agent's policy from the service's document; errors name the offending path.

    SLA weights and miss targets from the server replace ``base``'s for the tiers it names; a
    tier it does not name, or names without ``miss_targets`` (a service that predates them),
    keeps ``base``'s, so a pod labelled with a tier unknown to the server is still metered.
    ``headroom`` and the node-wide throttle factor come from ``base``.
    """
    document = _object(body, "policy")
    if document.get("schema") != POLICY_SCHEMA:
        raise ValueError(f"policy.schema: expected {POLICY_SCHEMA!r}, got {document.get('schema')!r}")
    weights = dict(base.sla_weights)
    miss_targets = dict(base.miss_targets)
    for slug, raw in _object(document.get("sla_tiers"), "policy.sla_tiers").items():
        entry = _object(raw, f"policy.sla_tiers.{slug}")
        weights[slug] = _positive_decimal(entry.get("weight"), f"policy.sla_tiers.{slug}.weight")
        if "miss_targets" in entry:
            miss_targets[slug] = _miss_target(entry["miss_targets"], f"policy.sla_tiers.{slug}.miss_targets")
    default_tiers: dict[str, str] = {}
    tenants = _object(document.get("tenants"), "policy.tenants")
    for slug, raw in tenants.items():
        tier = _object(raw, f"policy.tenants.{slug}").get("default_sla_tier")
        if tier is not None:
            if not isinstance(tier, str) or not tier:
                raise ValueError(f"policy.tenants.{slug}.default_sla_tier: expected a tier slug or null, got {tier!r}")
            default_tiers[slug] = tier
    by_tenant = _budget_actions(tenants, "policy.tenants")
    # Optional: a service that predates namespace budgets sends none.
    by_namespace = _budget_actions(_object(document.get("namespaces", {}), "policy.namespaces"), "policy.namespaces")
    allocation = Policy(
        sla_weights=weights,
        headroom=base.headroom,
        throttled_tenants=frozenset(by_tenant.throttled),
        throttle_weight_factor=base.throttle_weight_factor,
        tenant_throttle_factors=by_tenant.throttled,
        namespace_throttle_factors=by_namespace.throttled,
        miss_targets=miss_targets,
    )
    return PolicySnapshot(
        allocation=allocation,
        evict_best_effort_tenants=frozenset(by_tenant.evict),
        blocked_tenants=frozenset(by_tenant.blocked),
        evict_best_effort_namespaces=frozenset(by_namespace.evict),
        blocked_namespaces=frozenset(by_namespace.blocked),
        default_tiers=default_tiers,
        etag=etag,
        fetched_at=fetched_at,
    )


@dataclass(frozen=True, slots=True)
class _BudgetActions:
    """Who the enforced budgets of one part of the document (tenants or namespaces) act on."""

    throttled: dict[str, float]  # name -> throttle factor
    evict: set[str]
    blocked: set[str]


def _budget_actions(entries: Mapping[str, Any], where: str) -> _BudgetActions:
    actions = _BudgetActions(throttled={}, evict=set(), blocked=set())
    for name, raw in entries.items():
        path = f"{where}.{name}"
        budget = _object(_object(raw, path).get("budget", {"state": "ok"}), f"{path}.budget")
        if budget.get("state") != "enforced":
            continue
        action = budget.get("action")
        if action == "throttle":
            factor = _positive_decimal(budget.get("throttle_factor"), f"{path}.budget.throttle_factor")
            if factor > 1:
                raise ValueError(f"{path}.budget.throttle_factor: must be in (0, 1], got {factor!r}")
            actions.throttled[name] = factor
        elif action == "evict-best-effort":
            actions.evict.add(name)
        elif action == "block":
            actions.blocked.add(name)
        else:
            raise ValueError(f"{path}.budget.action: unknown action {action!r}")
    return actions


class PolicyClient:
    """Keeps the current ``PolicySnapshot``: from the cache at start, then from the server.

    ``current()`` is cheap and thread-safe (the loop calls it every tick); ``poll()`` asks
    the server once; ``run()`` polls every ``interval_s`` until ``stop()``.
    """

    def __init__(
        self,
        *,
        server: str,
        node: str,
        token: Callable[[], str],
        cache_path: Path,
        base: Policy | None = None,
        session: requests.Session | None = None,
        interval_s: float = 10.0,
        timeout_s: float = 10.0,
        now: Callable[[], datetime] = utc_now,
    ) -> None:
        if not node:
            raise ValueError("node must not be empty")
        if not (math.isfinite(interval_s) and interval_s > 0):
            raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
        self._url = server.rstrip("/") + POLICY_PATH.format(node=quote(node, safe=""))
        self._token = token
        self._cache_path = cache_path
        self._base = base if base is not None else Policy()
        self._session = session if session is not None else requests.Session()
        self._interval_s = interval_s
        self._timeout_s = timeout_s
        self._now = now
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._current = self._load_cache() or PolicySnapshot(allocation=self._base)

    @property
    def url(self) -> str:
        return self._url

    def current(self) -> PolicySnapshot:
        with self._lock:
            return self._current

    def allocation_policy(self) -> Policy:
        return self.current().allocation

    def age_s(self) -> float | None:
        """Seconds since the server last confirmed the policy (200 or 304); None: never."""
        fetched = self.current().fetched_at
        return None if fetched is None else max(0.0, (self._now() - fetched).total_seconds())

    def poll(self) -> PollOutcome:
        held = self.current()
        try:
            headers = {"Authorization": f"Bearer {self._token()}", "Accept": "application/json"}
        except TokenError as error:
            log.error("event=policy_no_token error=%r", str(error))
            return PollOutcome.FAILED
        if held.etag is not None:
            headers["If-None-Match"] = held.etag
        try:
            response = self._session.get(self._url, headers=headers, timeout=self._timeout_s)
        except requests.RequestException as error:
            log.warning("event=policy_fetch_failed url=%s error=%r keeping_etag=%s", self._url, error, held.etag)
            return PollOutcome.FAILED
        now = self._now()
        if response.status_code == 304:
            with self._lock:
                self._current = dataclasses.replace(self._current, fetched_at=now)
            return PollOutcome.NOT_MODIFIED
        if response.status_code != 200:
            log.warning(
                "event=policy_fetch_failed url=%s status=%d answer=%r keeping_etag=%s",
                self._url,
                response.status_code,
                response.text[:200],
                held.etag,
            )
            return PollOutcome.FAILED
        etag = response.headers.get("ETag")
        try:
            body = response.json()
            snapshot = parse_policy(body, base=self._base, etag=etag, fetched_at=now)
        except ValueError as error:  # requests' JSONDecodeError is a ValueError too
            log.error("event=policy_rejected url=%s error=%r keeping_etag=%s", self._url, str(error), held.etag)
            return PollOutcome.FAILED
        with self._lock:
            self._current = snapshot
        self._write_cache(body=body, etag=etag, fetched_at=now)
        log.info(
            "event=policy_updated etag=%s throttled=%s evict_best_effort=%s blocked=%s",
            etag,
            ",".join(sorted(snapshot.allocation.throttled_tenants)) or "-",
            ",".join(sorted(snapshot.evict_best_effort_tenants)) or "-",
            ",".join(sorted(snapshot.blocked_tenants)) or "-",
        )
        return PollOutcome.UPDATED

    def run(self) -> None:
        """Poll until ``stop()``; failures keep the policy in hand and are retried next interval."""
        while not self._stop.is_set():
            self.poll()
            self._stop.wait(self._interval_s)

    def stop(self) -> None:
        self._stop.set()

    # -- the cache ---------------------------------------------------------------------

    def _load_cache(self) -> PolicySnapshot | None:
        try:
            raw = self._cache_path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except OSError as error:
            log.error("event=policy_cache_unreadable path=%s error=%r", self._cache_path, error)
            return None
        try:
            cached = _object(json.loads(raw), "cache")
            if cached.get("schema") != CACHE_SCHEMA:
                raise ValueError(f"cache.schema: expected {CACHE_SCHEMA!r}, got {cached.get('schema')!r}")
            etag = cached.get("etag")
            fetched_at = datetime.fromisoformat(str(cached.get("fetched_at")))
            if fetched_at.tzinfo is None:
                raise ValueError("cache.fetched_at: no UTC offset")
            snapshot = parse_policy(
                _object(cached.get("policy"), "cache.policy"),
                base=self._base,
                etag=etag if isinstance(etag, str) else None,
                fetched_at=fetched_at,
            )
        except ValueError as error:
            log.error("event=policy_cache_invalid path=%s error=%r detail='starting from defaults'", self._cache_path, str(error))
            return None
        log.info("event=policy_cache_loaded path=%s etag=%s fetched_at=%s", self._cache_path, etag, fetched_at.isoformat())
        return snapshot

    def _write_cache(self, *, body: Mapping[str, Any], etag: str | None, fetched_at: datetime) -> None:
        document = {"schema": CACHE_SCHEMA, "etag": etag, "fetched_at": fetched_at.isoformat(), "policy": body}
        directory = self._cache_path.parent
        try:
            directory.mkdir(parents=True, exist_ok=True)
            fd, temporary = tempfile.mkstemp(prefix=f".{self._cache_path.name}.", dir=directory)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as handle:
                    json.dump(document, handle, sort_keys=True)
                    handle.flush()
                    os.fsync(handle.fileno())
                os.replace(temporary, self._cache_path)
            except BaseException:
                Path(temporary).unlink(missing_ok=True)
                raise
        except OSError as error:
            # The policy still applies in memory; only a restart during an outage loses it.
            log.error("event=policy_cache_write_failed path=%s error=%r", self._cache_path, error)

