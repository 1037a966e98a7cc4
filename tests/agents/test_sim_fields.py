"""Grouping fields: the simulated fleet describes its pods as a real node would — controllers
(Deployment, StatefulSet, Job), an app and a team label, the request — so the demo can group by
them; the agent's label allow-list applies to it too."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from agents.backends.sim import SimBackend, demo_scenario, parse_scenario
from tests import clock

TENANTS = [("acme", "gold"), ("globex", "silver")]
EPOCH = datetime(2026, 11, 30, tzinfo=UTC)


def test_the_demo_scenario_gives_every_pod_a_controller_an_app_and_a_team() -> None:
    document = demo_scenario("gpu-node-01", seed=3, tenants=TENANTS)
    kinds = {w["controller_kind"] for w in document["workloads"]}
    assert kinds <= {"Deployment", "StatefulSet", "Job"}
    assert len(kinds) >= 2
    for w in document["workloads"]:
        app = w["labels"]["app"]
        assert w["pod"].startswith(app)
        assert w["labels"]["team"].startswith(f"{w['tenant']}-")
        if w["controller_kind"] == "Job":  # a Job's pods are <job>-<suffix>
            assert w["pod"].startswith(w["controller_name"] + "-")
        else:
            assert w["controller_name"] == app
    assert demo_scenario("gpu-node-01", seed=3, tenants=TENANTS) == document  # still deterministic


def test_sim_readings_carry_the_description_and_the_allow_list_applies() -> None:
    scenario = parse_scenario(demo_scenario("gpu-node-01", seed=3, tenants=TENANTS))
    reading = SimBackend(scenario, epoch=EPOCH).read(now=EPOCH)[0]
    meta = reading.workload.meta
    assert meta.controller_kind in {"Deployment", "StatefulSet", "Job"}
    assert meta.controller_name
    assert dict(meta.labels).keys() == {"app", "team"}
    assert meta.mem_requested_mb == round(reading.entitlement.guarantee_mem_mb) > 0
    only_app = SimBackend(scenario, epoch=EPOCH, label_keys=("app",)).read(now=EPOCH)[0].workload.meta
    assert dict(only_app.labels).keys() == {"app"}
    assert only_app.controller_kind == meta.controller_kind
    assert SimBackend(scenario, epoch=EPOCH, label_keys=()).read(now=EPOCH)[0].workload.meta.labels == ()


def test_some_demo_pods_report_an_sm_request_as_real_pods_do() -> None:
    """The LLM's and the training job's pods ask for SMs, bert's do not: the demo's right-sizing
    advises against a request for some workloads and against the grant for the others."""
    document = demo_scenario("gpu-node-01", seed=3, tenants=TENANTS)
    asked = {w["profile"]: w.get("sm_requested") for w in document["workloads"]}
    assert asked == {"llama2-7b-q4": 108, "resnet50": 54, "bert-base": None}
    for reading in SimBackend(parse_scenario(document), epoch=EPOCH).read(now=EPOCH):
        want = {"llm": 108.0, "worker": 54.0}.get(reading.workload.container)
        assert reading.workload.meta.sm_requested == want
        assert ("sm_requested" in reading.workload.meta.to_wire()) == (want is not None)


@pytest.mark.parametrize("bad", [109, -1, "54"])
def test_an_sm_request_beyond_the_card_is_refused_naming_the_workload(bad) -> None:
    document = demo_scenario("gpu-node-01", seed=3, tenants=TENANTS)
    document["workloads"][1]["sm_requested"] = bad
    with pytest.raises(ValueError, match=r"workloads\[1\]\.sm_requested|workloads\[1\].*sm_requested"):
        parse_scenario(document)


@pytest.mark.parametrize(("extra", "problem"), [
    ({"controller_kind": "Deployment"}, "go together"),
    ({"labels": {"app": 3}}, "values must be strings"),
    ({"labels": {"bad key": "x"}}, "not a Kubernetes label key"),
    ({"labels": ["app"]}, "expected dict"),
])
def test_a_scenario_with_a_bad_description_is_refused_naming_the_workload(extra, problem) -> None:
    document = demo_scenario("gpu-node-01", seed=3, tenants=TENANTS)
    for key in ("controller_kind", "controller_name", "labels"):
        document["workloads"][1].pop(key)
    document["workloads"][1].update(extra)
    with pytest.raises(ValueError, match=problem) as raised:
        parse_scenario(document)
    assert "workloads[1]" in str(raised.value)


def test_the_cli_sends_the_cluster_and_the_allow_listed_labels(tmp_path, monkeypatch, capsys) -> None:
    """``--cluster`` / ``--labels`` (or $VGPU_AGENT_CLUSTER / $VGPU_AGENT_LABELS) reach the spooled bytes."""
    import json
    import socket

    from agents.__main__ import EXIT_PENDING, main
    from agents.spool import Spool

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"  # closed once the block ends: uploads stay pending
    (tmp_path / "token").write_text("node-token-123\n")
    (tmp_path / "scenario.json").write_text(json.dumps(demo_scenario("gpu-node-03", seed=5, gpu_count=1,
                                                                     tenants=[("acme", "gold")])))

    def run(spool: str, *extra: str) -> list[dict]:
        args = ["run", "--server", url, "--token-file", str(tmp_path / "token"), "--backend", "sim", "--scenario",
                str(tmp_path / "scenario.json"), "--spool", str(tmp_path / spool), "--once-seconds", "3",
                "--start", "2026-11-30T03:00:00Z", *extra]
        assert main(args) == EXIT_PENDING
        return [json.loads(b.json_bytes()) for b in Spool(tmp_path / spool, node="gpu-node-03", now=clock.now).list_batches()]

    (batch,) = run("a.sqlite", "--cluster", "prod-eu-west-1", "--labels", "app")
    assert batch["cluster"] == "prod-eu-west-1"
    assert {tuple(s["labels"]) for s in batch["windows"]} == {("app",)}
    assert all(s["controller_kind"] and s["mem_requested_mb"] > 0 for s in batch["windows"])
    monkeypatch.setenv("VGPU_AGENT_CLUSTER", "from-env")
    monkeypatch.setenv("VGPU_AGENT_LABELS", "team")
    (batch,) = run("b.sqlite")
    assert batch["cluster"] == "from-env"
    assert {tuple(s["labels"]) for s in batch["windows"]} == {("team",)}
    monkeypatch.delenv("VGPU_AGENT_CLUSTER")
    (batch,) = run("c.sqlite", "--labels", "")
    assert "cluster" not in batch
    assert not any("labels" in s for s in batch["windows"])
    for bad in (["--cluster", "a b"], ["--labels", "no spaces"]):
        with pytest.raises(SystemExit):
            main(["run", "--server", url, "--token-file", str(tmp_path / "token"), *bad])
        err = capsys.readouterr().err
        assert "cluster name" in err or "label key" in err
