"""The node policy client: ETag polling over real HTTP (a loopback server answering with the
service's recorded document shape), the on-disk cache, and what the policy does to grants."""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from agents.allocation import CurrentUsePredictor, Policy, compute_grants
from agents.interfaces import GpuInfo, UsageReading, Workload
from agents.policy_client import PolicyClient, PollOutcome, parse_policy
from allocator.risk import DEFAULT_MISS_TARGET, DEFAULT_MISS_TARGETS, MissTarget

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "node_policy_v1.json").read_text())
NOW = datetime(2026, 11, 30, 3, 0, 0, tzinfo=UTC)


class PolicyServer:
    """Serves one policy document with an ETag, 304 on a matching If-None-Match."""

    def __init__(self) -> None:
        self.document: dict[str, Any] = FIXTURE
        self.etag = '"v1"'
        self.status = 200
        self.seen: list[dict[str, str]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # signature of BaseHTTPRequestHandler
                return

            def do_GET(self) -> None:
                outer.seen.append({"path": self.path, **dict(self.headers.items())})
                if outer.status != 200:
                    self.send_response(outer.status)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if self.headers.get("If-None-Match") == outer.etag:
                    self.send_response(304)
                    self.send_header("ETag", outer.etag)
                    self.end_headers()
                    return
                body = json.dumps(outer.document).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("ETag", outer.etag)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def server() -> Iterator[PolicyServer]:
    running = PolicyServer()
    yield running
    running.close()


def client(url: str, cache: Path) -> PolicyClient:
    return PolicyClient(server=url, node="gpu-node-03", token=lambda: "tok", cache_path=cache, now=lambda: NOW)


def test_the_recorded_document_becomes_weights_throttles_evictions_and_default_tiers() -> None:
    snapshot = parse_policy(FIXTURE, base=Policy(), etag='"v1"', fetched_at=NOW)
    assert snapshot.allocation.sla_weights["gold"] == 6.0  # the server's weight replaces the default (4)
    assert snapshot.allocation.throttled_tenants == {"acme"}
    assert snapshot.allocation.tenant_throttle_factors == {"acme": 0.25}
    assert snapshot.evict_best_effort_tenants == {"initech"}
    assert snapshot.blocked_tenants == {"umbrella"}
    assert snapshot.default_tier("acme") == "gold"
    assert snapshot.default_tier("globex") == "best-effort"  # no default on the server
    assert snapshot.default_tier("unknown") == "best-effort"


def test_enforced_namespaces_become_throttles_and_evictions_and_a_document_without_them_is_fine() -> None:
    document = copy.deepcopy(FIXTURE)
    document["namespaces"] = {
        "acme-prod": {"budget": {"state": "enforced", "action": "throttle", "throttle_factor": "0.200"}},
        "initech-batch": {"budget": {"state": "enforced", "action": "evict-best-effort", "throttle_factor": "0.5"}},
        "globex-ci": {"budget": {"state": "enforced", "action": "block", "throttle_factor": "0.5"}},
    }
    snapshot = parse_policy(document, base=Policy(), etag='"v2"', fetched_at=NOW)
    assert snapshot.allocation.namespace_throttle_factors == {"acme-prod": 0.2}
    assert snapshot.evict_best_effort_namespaces == {"initech-batch"}
    assert snapshot.blocked_namespaces == {"globex-ci"}
    assert snapshot.allocation.throttled_tenants == {"acme"}  # the tenants' part is read as before
    assert "namespaces" not in FIXTURE
    assert parse_policy(FIXTURE, base=Policy()).allocation.namespace_throttle_factors == {}
    document["namespaces"]["acme-prod"]["budget"]["action"] = "pause"
    with pytest.raises(ValueError, match=r"policy\.namespaces\.acme-prod\.budget\.action"):
        parse_policy(document, base=Policy())


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("schema",), "vgpu-ledger/node-policy/v0", "policy.schema"),
        (("sla_tiers", "gold", "weight"), "-1", "policy.sla_tiers.gold.weight"),
        (("tenants", "acme", "budget", "throttle_factor"), "1.5", "policy.tenants.acme.budget.throttle_factor"),
        (("tenants", "acme", "budget", "action"), "pause", "policy.tenants.acme.budget.action"),
    ],
)
def test_an_invalid_document_is_refused_naming_the_field(path: tuple[str, ...], value: str, message: str) -> None:
    document = json.loads(json.dumps(FIXTURE))
    target = document
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        parse_policy(document, base=Policy())


def with_miss_targets(**tiers: dict[str, object]) -> dict[str, Any]:
    """The recorded document (an older service: no miss targets) with `miss_targets` for some tiers."""
    document = copy.deepcopy(FIXTURE)
    for slug, targets in tiers.items():
        document["sla_tiers"][slug]["miss_targets"] = targets
    return document


def test_miss_targets_per_tier_replace_the_bases_and_a_tier_without_them_keeps_the_bases() -> None:
    document = with_miss_targets(gold={"memory": "0.0000002000", "sm": "0.000003"})
    document["sla_tiers"]["platinum"] = {"weight": "8.000", "miss_targets": {"memory": "1e-7", "sm": "0.000001"}}
    base = Policy(miss_targets={**DEFAULT_MISS_TARGETS, "custom": MissTarget(memory=0.01, sm=0.02)})
    policy = parse_policy(document, base=base).allocation
    assert policy.miss_target_for("gold") == MissTarget(memory=2e-7, sm=3e-6)
    assert policy.miss_target_for("platinum") == MissTarget(memory=1e-7, sm=1e-6)
    # Named without targets (an older service), or not named at all: the base's.
    assert policy.miss_target_for("silver") == DEFAULT_MISS_TARGETS["silver"]
    assert policy.miss_target_for("custom") == MissTarget(memory=0.01, sm=0.02)
    assert policy.miss_target_for("unknown") == DEFAULT_MISS_TARGET


def test_a_service_that_predates_miss_targets_leaves_the_agents_defaults() -> None:
    assert all("miss_targets" not in tier for tier in FIXTURE["sla_tiers"].values())
    assert dict(parse_policy(FIXTURE, base=Policy()).allocation.miss_targets) == dict(DEFAULT_MISS_TARGETS)


@pytest.mark.parametrize("targets", [
    {"memory": "0", "sm": "0.001"}, {"memory": "1", "sm": "0.001"}, {"memory": "0.001", "sm": "1.5"},
    {"memory": "-0.001", "sm": "0.001"}, {"memory": "NaN", "sm": "0.001"}, {"memory": "Infinity", "sm": "0.1"},
    {"memory": "often", "sm": "0.001"}, {"memory": "0.001"}, {"memory": 0.001, "sm": True}, "0.001", None,
    {"memory": "1e-400", "sm": "0.001"},
])
def test_broken_miss_targets_refuse_the_whole_document_naming_the_tier(targets: object) -> None:
    with pytest.raises(ValueError, match=r"policy\.sla_tiers\.gold\.miss_targets"):
        parse_policy(with_miss_targets(gold=targets), base=Policy())  # type: ignore[arg-type]


def test_a_throttled_tenant_gets_its_own_factor_and_no_burst() -> None:
    snapshot = parse_policy(FIXTURE, base=Policy(headroom=0.2))  # current use's own headroom: the burst shows
    gpu = GpuInfo(uuid="GPU-1", model="A100", memory_mb=81920, sm_count=108)

    def reading(tenant: str) -> UsageReading:
        w = Workload(tenant=tenant, namespace=tenant, pod="p", container="c", pod_uid=tenant, sla_tier="gold")
        return UsageReading(workload=w, gpu="GPU-1", mem_used_mb=1000.0, sm_used=40.0, pcie_mb_per_s=0.0)

    grants = {
        g.workload.tenant: g
        for g in compute_grants(
            gpus=[gpu], readings=[reading("acme"), reading("globex")], policy=snapshot.allocation,
            predictor=CurrentUsePredictor(), now=NOW,
        ).grants
    }
    assert grants["acme"].sm == 0.0
    assert grants["acme"].mem_mb == pytest.approx(1000.0)
    assert grants["globex"].sm == pytest.approx(48.0)
    assert grants["globex"].mem_mb == pytest.approx(1200.0)


def test_polls_with_the_token_and_if_none_match_and_keeps_the_policy_on_304(server: PolicyServer, tmp_path: Path) -> None:
    policy = client(server.url, tmp_path / "policy.json")
    assert policy.current().etag is None
    assert policy.age_s() is None
    assert policy.poll() is PollOutcome.UPDATED
    assert policy.current().allocation.throttled_tenants == {"acme"}
    assert policy.poll() is PollOutcome.NOT_MODIFIED
    assert policy.current().allocation.throttled_tenants == {"acme"}
    assert [r.get("If-None-Match") for r in server.seen] == [None, '"v1"']
    assert server.seen[0]["path"] == "/api/v1/nodes/gpu-node-03/policy"
    assert server.seen[0]["Authorization"] == "Bearer tok"
    # The budget is raised: a new ETag, a new document, applied on the next poll.
    server.document = {**FIXTURE, "tenants": {"acme": {"default_sla_tier": "gold", "budget": {"state": "ok"}}}}
    server.etag = '"v2"'
    assert policy.poll() is PollOutcome.UPDATED
    assert policy.current().allocation.throttled_tenants == frozenset()
    assert policy.age_s() == 0.0


def test_the_last_known_policy_survives_an_outage_and_a_restart(server: PolicyServer, tmp_path: Path) -> None:
    cache = tmp_path / "agent" / "spool.policy.json"
    assert client(server.url, cache).poll() is PollOutcome.UPDATED
    assert json.loads(cache.read_text())["etag"] == '"v1"'
    server.status = 503
    restarted = client(server.url, cache)  # a new process: the cache is all it has
    assert restarted.current().allocation.throttled_tenants == {"acme"}
    assert restarted.poll() is PollOutcome.FAILED
    assert restarted.current().evict_best_effort_tenants == {"initech"}
    assert [p.name for p in cache.parent.iterdir()] == ["spool.policy.json"]  # no temporary file left
    server.status = 200
    assert restarted.poll() is PollOutcome.NOT_MODIFIED  # the cached ETag is still current


def test_a_bad_answer_or_a_corrupt_cache_never_replaces_a_good_policy(server: PolicyServer, tmp_path: Path) -> None:
    cache = tmp_path / "policy.json"
    policy = client(server.url, cache)
    policy.poll()
    server.document = {"schema": "something-else"}
    server.etag = '"v3"'
    assert policy.poll() is PollOutcome.FAILED
    assert policy.current().etag == '"v1"'
    cache.write_text("{not json")
    assert client(server.url, cache).current().etag is None  # defaults; the next poll refetches


def test_an_unreachable_server_keeps_the_defaults(tmp_path: Path) -> None:
    policy = client("http://127.0.0.1:9", tmp_path / "policy.json")
    assert policy.poll() is PollOutcome.FAILED
    assert policy.current().allocation == Policy()
