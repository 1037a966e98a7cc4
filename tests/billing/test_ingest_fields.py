"""The optional grouping fields of wire protocol v1 (docs/protocol.md) —
batch `cluster`, per-sample controller, allow-listed labels and requests — validated, stored once
per pod in WorkloadMeta and on the node, and never erased by a batch that does not carry them."""

from __future__ import annotations

import copy
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from billing.errors import InvalidBatch
from billing.ledger.models import UsageBatch, WorkloadMeta
from billing.ledger.workloads import workload_meta
from billing.models import Node
from billing.services.ingest.batch_validation import validate_batch
from tests import clock
from tests.billing.test_ingest_protocol import raw_rows
from tests.conftest import make_batch

pytestmark = pytest.mark.django_db

TWO_PODS = [
    {"gpu": 0, "tenant": "acme", "pod": "bert-1", "mem_used": 100.0, "mem_granted": 512.0, "sm_used": 1.0,
     "sm_granted": 10.0},
    {"gpu": 0, "tenant": "globex", "pod": "llm-1", "mem_used": 100.0, "mem_granted": 512.0, "sm_used": 1.0,
     "sm_granted": 10.0},
]
BERT = {"controller_kind": "Deployment", "controller_name": "bert", "labels": {"app": "bert", "team": "search"},
        "mem_requested_mb": 512, "sm_requested": 10.5}


def with_fields(payload: dict[str, Any], pod: str, fields: dict[str, Any]) -> dict[str, Any]:
    """The batch with `fields` added to every sample of `pod`."""
    for sample in payload["samples"]:
        if sample["pod"] == pod:
            sample.update(copy.deepcopy(fields))
    return payload


def meta(pod: str) -> WorkloadMeta:
    return WorkloadMeta.objects.get(pod=pod)


def test_a_batch_with_the_fields_and_one_without_both_store(post_batch, minute_start):
    old = make_batch(start=minute_start, seq=1, workloads=TWO_PODS)
    assert post_batch(old).status_code == 201
    new = with_fields(make_batch(start=minute_start + timedelta(seconds=10), seq=2, workloads=TWO_PODS), "bert-1", BERT)
    new["cluster"] = "prod-eu-west-1"
    resp = post_batch(new)
    assert resp.status_code == 201, resp.content
    # The fields change nothing of what is metered: 40 samples, one row per batch and workload-minute.
    assert raw_rows() == 4


def test_ingest_stores_one_row_per_pod_with_its_controller_labels_and_requests(post_batch, minute_start):
    payload = with_fields(make_batch(start=minute_start, workloads=TWO_PODS), "bert-1", BERT)
    payload["cluster"] = "prod-eu-west-1"
    assert post_batch(payload).status_code == 201
    assert WorkloadMeta.objects.count() == 2  # 20 samples, two pods
    bert = meta("bert-1")
    assert (bert.namespace, bert.pod_uid, bert.controller_kind, bert.controller_name) == (
        "acme-prod", "uid-bert-1", "Deployment", "bert")
    assert bert.labels == {"app": "bert", "team": "search"}
    assert bert.requests == {"server": {"mem_mb": 512, "sm": 10.5}}
    assert (bert.first_seen, bert.last_seen) == (minute_start, minute_start + timedelta(seconds=10))
    llm = meta("llm-1")  # an old agent's pod: a row with its times, nothing made up
    assert (llm.controller_kind, llm.labels, llm.requests) == ("", {}, {})
    assert Node.objects.get(name="gpu-node-1").cluster == "prod-eu-west-1"
    rows = workload_meta([("acme-prod", "bert-1", "uid-bert-1"), ("nowhere", "x", "y")])
    assert list(rows) == [("acme-prod", "bert-1", "uid-bert-1")]
    assert rows[("acme-prod", "bert-1", "uid-bert-1")].labels == {"app": "bert", "team": "search"}
    assert rows[("acme-prod", "bert-1", "uid-bert-1")].requests == {"server": {"mem_mb": 512, "sm": 10.5}}


def test_a_later_batch_without_the_fields_keeps_the_metadata_and_moves_last_seen(post_batch, minute_start):
    first = with_fields(make_batch(start=minute_start, seq=1, workloads=TWO_PODS), "bert-1", BERT)
    first["cluster"] = "prod"
    assert post_batch(first).status_code == 201
    later = make_batch(start=minute_start + timedelta(seconds=10), seq=2, workloads=TWO_PODS)
    assert post_batch(later).status_code == 201
    bert = meta("bert-1")
    assert (bert.controller_kind, bert.controller_name, bert.labels) == ("Deployment", "bert", BERT["labels"])
    assert bert.requests == {"server": {"mem_mb": 512, "sm": 10.5}}
    assert (bert.first_seen, bert.last_seen) == (minute_start, minute_start + timedelta(seconds=20))
    assert Node.objects.get(name="gpu-node-1").cluster == "prod"


def test_newer_labels_replace_older_ones_but_a_late_old_batch_does_not(post_batch, minute_start):
    relabelled = {**BERT, "labels": {"app": "bert", "team": "ranking"}}
    newer = with_fields(make_batch(start=minute_start + timedelta(seconds=10), seq=2, workloads=TWO_PODS),
                        "bert-1", relabelled)
    assert post_batch(newer).status_code == 201
    # A spool replayed late: an older window arrives after the newer one.
    older = with_fields(make_batch(start=minute_start, seq=1, workloads=TWO_PODS), "bert-1", BERT)
    assert post_batch(older).status_code == 201
    bert = meta("bert-1")
    assert bert.labels == {"app": "bert", "team": "ranking"}
    assert (bert.first_seen, bert.last_seen) == (minute_start, minute_start + timedelta(seconds=20))
    newest = with_fields(make_batch(start=minute_start + timedelta(seconds=20), seq=3, workloads=TWO_PODS),
                         "bert-1", {"labels": {"app": "bert2"}, "mem_requested_mb": 1024})
    assert post_batch(newest).status_code == 201
    bert = meta("bert-1")
    assert bert.labels == {"app": "bert2"}
    assert bert.requests == {"server": {"mem_mb": 1024}}  # a container's newest request replaces its older one


def test_requests_merge_per_container(post_batch, minute_start):
    payload = with_fields(make_batch(start=minute_start, seq=1, workloads=TWO_PODS[:1]), "bert-1", BERT)
    for sample in make_batch(start=minute_start, seq=1, workloads=TWO_PODS[:1])["samples"]:
        payload["samples"].append({**sample, "container": "sidecar", "mem_granted_mb_s": 0.0,
                                   "sm_granted_s": 0.0, "mem_requested_mb": 64})
    assert post_batch(payload).status_code == 201, post_batch(payload).content
    assert meta("bert-1").requests == {"server": {"mem_mb": 512, "sm": 10.5}, "sidecar": {"mem_mb": 64}}


def test_a_duplicate_batch_writes_nothing_and_a_400_batch_writes_nothing(post_batch, minute_start):
    payload = with_fields(make_batch(start=minute_start, workloads=TWO_PODS), "bert-1", BERT)
    payload["cluster"] = "prod"
    assert post_batch(payload).status_code == 201
    WorkloadMeta.objects.update(labels={"edited": "by-test"})
    Node.objects.update(cluster="elsewhere")
    assert post_batch(payload).status_code == 200  # duplicate: stores nothing
    assert meta("bert-1").labels == {"edited": "by-test"}
    assert Node.objects.get().cluster == "elsewhere"
    bad = with_fields(make_batch(start=minute_start + timedelta(seconds=10), seq=2, workloads=TWO_PODS),
                      "llm-1", {"labels": {"app": "llm"}, "mem_requested_mb": -1})
    bad["cluster"] = "prod"
    resp = post_batch(bad)
    assert resp.status_code == 400
    assert resp.json()["errors"][0]["path"].endswith(".mem_requested_mb")
    assert meta("llm-1").labels == {"edited": "by-test"}
    assert Node.objects.get().cluster == "elsewhere"
    assert UsageBatch.objects.count() == 1


def test_one_pod_with_two_controllers_in_a_batch_is_400(post_batch, minute_start):
    payload = with_fields(make_batch(start=minute_start, workloads=TWO_PODS), "bert-1", BERT)
    payload["samples"][-2]["controller_name"] = "bert-canary"
    assert payload["samples"][-2]["pod"] == "bert-1"
    resp = post_batch(payload)
    assert resp.status_code == 400
    error = resp.json()["errors"][0]
    assert error["path"] == f"$.samples[{len(payload['samples']) - 2}].controller_kind"
    assert "one controller" in error["message"]
    assert WorkloadMeta.objects.count() == 0
    assert raw_rows() == 0


BAD_FIELDS = [
    ("cluster", None, {"cluster": ""}, "$.cluster"),
    ("cluster", None, {"cluster": "a b"}, "$.cluster"),
    ("cluster", None, {"cluster": "x" * 254}, "$.cluster"),
    ("cluster", None, {"cluster": 7}, "$.cluster"),
    ("kind", {"controller_kind": "Deploy ment", "controller_name": "bert"}, None, ".controller_kind"),
    ("kind", {"controller_kind": "1Job", "controller_name": "bert"}, None, ".controller_kind"),
    ("kind", {"controller_kind": "K" * 64, "controller_name": "bert"}, None, ".controller_kind"),
    ("name without kind", {"controller_name": "bert"}, None, ".controller_kind"),
    ("kind without name", {"controller_kind": "Job"}, None, ".controller_name"),
    ("name", {"controller_kind": "Job", "controller_name": "x" * 254}, None, ".controller_name"),
    ("labels type", {"labels": ["app", "bert"]}, None, ".labels"),
    ("label value type", {"labels": {"app": 3}}, None, ".labels"),
    ("label value long", {"labels": {"app": "v" * 64}}, None, ".labels"),
    ("label value char", {"labels": {"app": "a b"}}, None, ".labels"),
    ("label value edge", {"labels": {"app": "-bert"}}, None, ".labels"),
    ("label key empty", {"labels": {"": "bert"}}, None, ".labels"),
    ("label name long", {"labels": {"k" * 64: "bert"}}, None, ".labels"),
    ("label prefix", {"labels": {"Example.COM/app": "bert"}}, None, ".labels"),
    ("label prefix empty", {"labels": {"/app": "bert"}}, None, ".labels"),
    ("too many labels", {"labels": {f"l{i}": "v" for i in range(33)}}, None, ".labels"),
    ("mem requested type", {"mem_requested_mb": 1.5}, None, ".mem_requested_mb"),
    ("mem requested bool", {"mem_requested_mb": True}, None, ".mem_requested_mb"),
    ("mem requested above card", {"mem_requested_mb": 81921}, None, ".mem_requested_mb"),
    ("sm requested above card", {"sm_requested": 108.5}, None, ".sm_requested"),
    ("sm requested negative", {"sm_requested": -1}, None, ".sm_requested"),
    ("sm requested text", {"sm_requested": "10"}, None, ".sm_requested"),
]


@pytest.mark.parametrize(("name", "sample_fields", "batch_fields", "path"), BAD_FIELDS, ids=[b[0] for b in BAD_FIELDS])
def test_a_wrong_field_is_400_naming_its_json_path_and_stores_nothing(post_batch, minute_start, name, sample_fields,
                                                                      batch_fields, path):
    payload = make_batch(start=minute_start, workloads=TWO_PODS)
    if sample_fields:
        with_fields(payload, "bert-1", sample_fields)
    payload.update(batch_fields or {})
    resp = post_batch(payload)
    assert resp.status_code == 400, (name, resp.content)
    errors = resp.json()["errors"]
    assert errors[0]["path"].endswith(path), errors
    assert errors[0]["path"].startswith("$."), errors
    assert WorkloadMeta.objects.count() == 0
    assert raw_rows() == 0
    assert UsageBatch.objects.count() == 0
    assert Node.objects.get().cluster == ""


GOOD_LABELS = [
    {"app": "bert"},
    {"app.kubernetes.io/name": "bert", "team": ""},
    {"example.com/Team_1": "A.b-c_9", "x": "1"},
    {"k" * 63: "v" * 63, ("p" * 60 + ".") * 4 + "io/name": "v"},
    {f"l{i}": "v" for i in range(32)},
]


@pytest.mark.parametrize("labels", GOOD_LABELS)
def test_kubernetes_labels_of_every_shape_are_accepted(labels, minute_start):
    payload = with_fields(make_batch(start=minute_start, workloads=TWO_PODS), "bert-1", {"labels": labels})
    batch = validate_batch(payload, now=clock.now(), max_skew=timedelta(seconds=30), max_samples=100)
    assert next(p for p in batch.pods if p.pod == "bert-1").labels == labels


# Kubernetes' label syntax, generated: a name segment, an optional DNS prefix, a value.
_SEGMENT = st.from_regex(r"\A[A-Za-z0-9]([A-Za-z0-9._-]{0,20}[A-Za-z0-9])?\Z")
_PREFIX = st.from_regex(r"\A[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?){0,3}\Z")
_KEY = st.one_of(_SEGMENT, st.builds(lambda p, n: f"{p}/{n}", _PREFIX, _SEGMENT))
_VALUE = st.one_of(st.just(""), _SEGMENT)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(labels=st.dictionaries(_KEY, _VALUE, max_size=32))
def test_any_valid_label_set_round_trips_through_validation_unchanged(labels, minute_start):
    payload = with_fields(make_batch(start=minute_start, seconds=2, workloads=TWO_PODS[:1]), "bert-1",
                          {"labels": labels})
    batch = validate_batch(payload, now=clock.now(), max_skew=timedelta(seconds=30), max_samples=100)
    assert batch.pods[0].labels == labels


def test_validation_without_the_fields_gathers_each_pod_once_and_no_cluster(minute_start):
    payload = make_batch(start=minute_start, workloads=TWO_PODS)
    batch = validate_batch(payload, now=clock.now(), max_skew=timedelta(seconds=30), max_samples=100)
    assert batch.cluster is None
    assert [(p.namespace, p.pod, p.pod_uid, p.controller_kind, p.labels, p.requests) for p in batch.pods] == [
        ("acme-prod", "bert-1", "uid-bert-1", "", {}, {}), ("globex-prod", "llm-1", "uid-llm-1", "", {}, {})]


def test_errors_from_several_fields_are_all_listed(minute_start):
    payload = with_fields(make_batch(start=minute_start, seconds=1, workloads=TWO_PODS), "bert-1",
                          {"controller_kind": "Job", "labels": {"a b": "c"}, "sm_requested": float("nan")})
    with pytest.raises(InvalidBatch) as raised:
        validate_batch(payload, now=clock.now(), max_skew=timedelta(seconds=30), max_samples=100)
    assert {e.path for e in raised.value.errors} == {
        "$.samples[0].controller_name", "$.samples[0].labels", "$.samples[0].sm_requested"}


def test_what_the_simulated_agent_renders_validates_and_lands_per_pod(post_batch, minute_start):
    """The agent's side of the contract: a batch agents.batch renders from the demo's sim workloads
    (controllers, app and team labels, requests, cluster) is accepted and stored one row per pod."""
    from agents.backends.sim import SimBackend, demo_scenario, parse_scenario
    from agents.batch import Sample, render_batch

    scenario = parse_scenario(demo_scenario("gpu-node-1", seed=1, gpu_count=2, tenants=[("acme", "gold")]))
    backend = SimBackend(scenario, epoch=minute_start)
    samples = [
        Sample(start=minute_start, seconds=1, gpu=r.gpu, workload=r.workload, mem_used_mb_s=0.0,
               mem_granted_mb_s=0.0, sm_used_s=0.0, sm_granted_s=0.0, pcie_mb=0.0)
        for r in backend.read(now=minute_start)
    ]
    body = render_batch(node="gpu-node-1", batch_seq=1, window_start=minute_start,
                        window_end=minute_start + timedelta(seconds=1), gpus=scenario.gpus, samples=samples,
                        cluster="demo", wire="v2")
    resp = post_batch(None, raw=body)
    assert resp.status_code == 201, resp.content
    pods = {w.workload.pod: w.workload for w in scenario.workloads}
    assert WorkloadMeta.objects.count() == len(pods)
    for row in WorkloadMeta.objects.all():
        expected = pods[row.pod].meta
        assert (row.controller_kind, row.controller_name) == (expected.controller_kind, expected.controller_name)
        assert row.labels == dict(expected.labels)
        assert set(row.labels) == {"app", "team"}
        assert row.requests[pods[row.pod].container]["mem_mb"] == expected.mem_requested_mb
    assert Node.objects.get(name="gpu-node-1").cluster == "demo"
