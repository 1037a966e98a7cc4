"""The ``vgpu-agent`` command line (no server: uploads go to a closed loopback port)."""

from __future__ import annotations

import json
import socket
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from agents.__main__ import EXIT_PENDING, _base_policy, _parser, _predictor, main
from agents.allocation import Policy
from agents.backends.sim import demo_scenario
from agents.interfaces import GpuInfo
from agents.prediction import MarginPredictor
from agents.spool import Spool
from allocator.replay import SHIPPED, ReplayConfig
from tests import clock
from tests.agents.helpers import evidence


@pytest.fixture
def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"  # nothing listens here any more: connection refused


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    token = tmp_path / "token"
    token.write_text("  node-token-123\n")
    scenario = tmp_path / "scenario.json"
    scenario.write_text(json.dumps(demo_scenario("gpu-node-03", seed=5, gpu_count=2, tenants=[("acme", "gold")])))
    return {"token": token, "scenario": scenario, "spool": tmp_path / "spool.sqlite"}


def run_args(url: str, files: dict[str, Path], *extra: str) -> list[str]:
    return [
        "run",
        "--server",
        url,
        "--token-file",
        str(files["token"]),
        "--backend",
        "sim",
        "--scenario",
        str(files["scenario"]),
        "--spool",
        str(files["spool"]),
        *extra,
    ]


def test_scenario_command_prints_the_demo_scenario(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["scenario", "--node", "gpu-node-01", "--seed", "7", "--tenants", "acme:gold,globex:silver"])
    assert code == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == demo_scenario("gpu-node-01", seed=7, tenants=[("acme", "gold"), ("globex", "silver")])


def test_scenario_command_rejects_an_unknown_tier(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["scenario", "--node", "n", "--seed", "1", "--tenants", "acme:platinum"])
    assert "slug:tier" in capsys.readouterr().err


def test_once_with_the_server_down_keeps_every_batch_pending(closed_port_url: str, files: dict[str, Path]) -> None:
    before = clock.now()
    assert main(run_args(closed_port_url, files, "--batch-seconds", "10", "--once-seconds", "25")) == EXIT_PENDING
    spool = Spool(files["spool"], node="gpu-node-03", now=lambda: before)
    stored = spool.list_batches(state="pending")
    pending = [json.loads(b.json_bytes()) for b in stored]
    spans = [
        (
            datetime.fromisoformat(b["window"]["start"][:-1] + "+00:00"),
            datetime.fromisoformat(b["window"]["end"][:-1] + "+00:00"),
        )
        for b in pending
    ]
    # 25 s in batches that close on multiples of 10 s since the epoch (the first and last may be shorter).
    assert sum((end - start).total_seconds() for start, end in spans) == 25.0
    assert all(end.timestamp() % 10 == 0 and (end - start).total_seconds() <= 10 for start, end in spans[:-1])
    assert spans[-1][1] <= clock.now()  # the metered past ends now, never in the future
    assert spans[-1][1] >= before - timedelta(seconds=2)
    # 3 batches, or 4 when the run does not start on a multiple of 10 s; the final flush stops at the first refusal.
    assert len(stored) in {3, 4}
    assert [b.attempts for b in stored] == [1] + [0] * (len(stored) - 1)


def test_a_second_once_run_continues_after_the_first(closed_port_url: str, files: dict[str, Path]) -> None:
    start = "2026-11-30T03:00:00Z"
    assert main(run_args(closed_port_url, files, "--once-seconds", "10", "--start", start)) == EXIT_PENDING
    assert main(run_args(closed_port_url, files, "--once-seconds", "10", "--start", start)) == EXIT_PENDING
    spool = Spool(files["spool"], node="gpu-node-03", now=clock.now)
    windows = [json.loads(b.json_bytes())["window"] for b in spool.list_batches()]
    assert windows == [
        {"start": "2026-11-30T03:00:00Z", "end": "2026-11-30T03:00:10Z"},
        {"start": "2026-11-30T03:00:10Z", "end": "2026-11-30T03:00:20Z"},
    ]


def test_a_missing_token_file_is_one_clear_error(
    closed_port_url: str, files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    files["token"].unlink()
    assert main(run_args(closed_port_url, files, "--once-seconds", "5")) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"vgpu-agent: error: token file {files['token']} does not exist"


def test_an_empty_token_file_is_one_clear_error(
    closed_port_url: str, files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    files["token"].write_text("\n  \n")
    assert main(run_args(closed_port_url, files, "--once-seconds", "5")) == 1
    assert capsys.readouterr().err.strip().endswith("is empty")


def test_nvml_backend_without_a_gpu_names_the_sim_backend(
    closed_port_url: str, files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    if _nvml_works():
        pytest.skip("this machine has a working NVML")
    args = ["run", "--server", closed_port_url, "--token-file", str(files["token"]), "--backend", "nvml"]
    assert main([*args, "--node", "gpu-node-03", "--spool", str(files["spool"])]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("vgpu-agent: error: NVML is not available on this machine")
    assert "--backend sim" in line


def _nvml_works() -> bool:
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


@pytest.mark.parametrize("value", ["dry-run,mps", "mps,cgroups", "watchdog,dry-run"])
def test_enforcer_choices_are_dry_run_or_mps_and_or_watchdog(
    value: str, closed_port_url: str, files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main(run_args(closed_port_url, files, "--enforcer", value, "--once-seconds", "5"))
    assert "expected dry-run, mps, watchdog or mps,watchdog" in capsys.readouterr().err


def test_mps_and_watchdog_together_drive_the_mps_control_daemon(
    closed_port_url: str, files: dict[str, Path], tmp_path: Path
) -> None:
    import shlex
    import sys

    from agents.fakes.mps import FakeMpsControlDaemon

    start = clock.now().replace(microsecond=0) - timedelta(minutes=2)
    with FakeMpsControlDaemon(tmp_path / "mps") as daemon:
        code = main(
            run_args(
                closed_port_url, files,
                "--enforcer", "mps,watchdog",
                "--mps-control", shlex.join([sys.executable, "-m", "agents.fakes.mps"]),
                "--mps-pipe-directory", str(tmp_path / "mps"),
                "--once-seconds", "3", "--start", start.isoformat(),
            )
        )
    assert code == EXIT_PENDING  # nothing uploads to a closed port; the MPS commands went through
    # Simulated workloads have no MPS clients: the daemon gets its defaults once, then queries.
    assert daemon.commands[0] == "set_default_active_thread_percentage 100"
    assert daemon.commands.count("set_default_active_thread_percentage 100") == 1
    assert set(daemon.commands[1:]) == {"get_server_list"}


def granted_over_used(spool_path: Path) -> float:
    """Memory granted ÷ memory used over every spooled batch (v2: its per-minute integrals)."""
    spool = Spool(spool_path, node="gpu-node-03", now=clock.now)
    windows = [w for b in spool.list_batches() for w in json.loads(b.json_bytes())["windows"]]
    return sum(w["mem_granted_mb_s"] for w in windows) / sum(w["mem_used_mb_s"] for w in windows)


def test_the_default_predictor_reserves_ahead_and_current_use_does_not(
    closed_port_url: str, files: dict[str, Path], tmp_path: Path
) -> None:
    start = "2026-11-30T03:00:00Z"
    assert main(run_args(closed_port_url, files, "--once-seconds", "20", "--start", start)) == EXIT_PENDING
    current = {**files, "spool": tmp_path / "current.sqlite"}
    args = run_args(closed_port_url, current, "--once-seconds", "20", "--start", start, "--predictor", "current-use")
    assert main(args) == EXIT_PENDING
    # current-use grants use x (1 + its headroom 0.2); the default reserves the last minute's peak x 2 at first.
    assert granted_over_used(files["spool"]) > granted_over_used(current["spool"]) + 0.05


def test_the_agents_defaults_are_the_replays_agent_default() -> None:
    """`vgpu-agent run` with no flags builds the policy the replay reports as agent-default."""
    args = _parser().parse_args(["run", "--server", "http://ledger:8000", "--token-file", "token"])
    base = _base_policy(args)
    gpu = GpuInfo(uuid="GPU-0", model="NVIDIA A100-SXM4-80GB", memory_mb=81_920, sm_count=108)
    predictor = _predictor(args, gpus=[gpu], policy=lambda: base)
    replay = ReplayConfig(policy=SHIPPED)
    assert SHIPPED == "agent-default"
    assert isinstance(predictor, MarginPredictor)
    assert predictor.policy.config == replay.margin
    # The replay's trace names no tier: the agent's target for a tier the policy does not name.
    assert predictor.targets("a-tier-nobody-named") == replay.miss_target
    assert base.headroom == 0  # the replay reserves exactly the policy's reservation


@pytest.mark.parametrize(
    ("flags", "headroom"),
    [((), 0.0), (("--predictor", "lstm"), 0.2), (("--predictor", "current-use"), 0.2),
     (("--predictor", "lstm", "--headroom", "0.5"), 0.5), (("--headroom", "0.1"), 0.1)],
)
def test_each_predictor_has_its_own_headroom_unless_stated(flags: tuple[str, ...], headroom: float) -> None:
    args = _parser().parse_args(["run", "--server", "http://ledger:8000", "--token-file", "token", *flags])
    assert _base_policy(args) == Policy(headroom=headroom)


def test_a_negative_headroom_is_one_clear_error(
    closed_port_url: str, files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(run_args(closed_port_url, files, "--once-seconds", "5", "--headroom", "-0.1")) == 1
    assert "--headroom: headroom must be finite and >= 0, got -0.1" in capsys.readouterr().err


def test_a_restarted_agent_reserves_from_its_first_second(closed_port_url: str, files: dict[str, Path]) -> None:
    """No warm-up: a new process (empty predictor state) grants every workload its memory in use
    and more from the first second it meters."""
    start = "2026-11-30T03:00:00Z"
    assert main(run_args(closed_port_url, files, "--once-seconds", "2", "--start", start)) == EXIT_PENDING
    assert main(run_args(closed_port_url, files, "--once-seconds", "2", "--start", start)) == EXIT_PENDING
    spool = Spool(files["spool"], node="gpu-node-03", now=clock.now)
    first, restarted = (json.loads(b.json_bytes()) for b in spool.list_batches())
    for batch in (first, restarted):
        samples = evidence(spool, batch)  # the per-second samples behind the batch's per-minute integrals
        opening = [s for s in samples if s["start"] == batch["window"]["start"]]
        later = {(s["pod"], s["container"]) for s in samples if s["start"] != batch["window"]["start"]}
        assert opening
        assert {(s["pod"], s["container"]) for s in opening} == later  # every workload metered from the start
        assert all(s["mem_granted_mb_s"] > s["mem_used_mb_s"] for s in opening)
        assert all(s["sm_granted_s"] > 0 for s in opening if s["sm_used_s"] > 0)
    assert restarted["window"]["start"] == first["window"]["end"]


def test_an_underprediction_target_outside_0_1_is_one_clear_error(
    closed_port_url: str, files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(run_args(closed_port_url, files, "--once-seconds", "5", "--underprediction-target", "1.5")) == 1
    assert "--underprediction-target: calibration target must be in (0, 1), got 1.5" in capsys.readouterr().err
