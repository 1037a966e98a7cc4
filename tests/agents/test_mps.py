"""The mps enforcer against the fake control daemon over real pipes.

Tests that take ``control`` run the production ``MpsControlCli`` (one front-end
process per command, as with ``nvidia-cuda-mps-control``); the state-machine
tests use ``fake.control()``, the same pipe and parser without the process spawn.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path

import pytest

from agents.events import Event
from agents.fakes.mps import FakeMpsControlDaemon, MpsGrammarError
from agents.interfaces import GpuInfo, Grant, Workload
from agents.mps import (
    MpsCommandError,
    MpsControl,
    MpsControlCli,
    MpsDefaults,
    MpsEnforcer,
    active_thread_percentage,
    pinned_mem_limit,
)

T0 = datetime(2026, 11, 30, 3, 0, 0, tzinfo=UTC)
GPU_A = GpuInfo(uuid="GPU-aaaa-1111", model="NVIDIA A100-SXM4-80GB", memory_mb=81920, sm_count=108)
GPU_B = GpuInfo(uuid="GPU-bbbb-2222", model="NVIDIA A100-SXM4-80GB", memory_mb=81920, sm_count=108)
BERT = Workload(tenant="acme", namespace="acme-prod", pod="bert-1", container="server", pod_uid="u1", sla_tier="gold")
GPT = Workload(tenant="initech", namespace="ini", pod="gpt-1", container="main", pod_uid="u2", sla_tier="bronze")
FRONT_END = (sys.executable, "-m", "agents.fakes.mps")


@pytest.fixture
def pipe_dir(tmp_path: Path) -> Path:
    return tmp_path / "mps-pipe"


@pytest.fixture
def fake(pipe_dir: Path) -> Iterator[FakeMpsControlDaemon]:
    with FakeMpsControlDaemon(pipe_dir) as daemon:
        yield daemon


@pytest.fixture
def control(pipe_dir: Path) -> MpsControlCli:
    return MpsControlCli(command=FRONT_END, pipe_directory=pipe_dir, timeout_s=10.0)


def enforcer(
    control: MpsControl,
    events: list[Event],
    pids: dict[str, Sequence[int]],
    *,
    gpus: Sequence[GpuInfo] = (GPU_A, GPU_B),
    defaults: MpsDefaults | None = None,
) -> MpsEnforcer:
    return MpsEnforcer(
        control=control,
        gpus=gpus,
        client_pids=lambda w: pids.get(w.key, ()),
        emit=events.append,
        defaults=defaults,
        now=lambda: T0,
    )


def sets(commands: list[str]) -> list[str]:
    return [c for c in commands if c.startswith("set_")]


def test_sm_share_becomes_a_percentage_rounded_up_within_1_to_100() -> None:
    assert active_thread_percentage(27.0, 108) == 25
    assert active_thread_percentage(9 * 3.0, 108) == 25  # float noise does not round up
    assert active_thread_percentage(27.1, 108) == 26
    assert active_thread_percentage(0.0, 108) == 1
    assert active_thread_percentage(500.0, 108) == 100
    with pytest.raises(ValueError, match="must be finite"):
        active_thread_percentage(float("nan"), 108)


def test_memory_grant_becomes_a_whole_mib_limit_rounded_up() -> None:
    assert pinned_mem_limit(2048.0) == "2048M"
    assert pinned_mem_limit(2048.2) == "2049M"
    assert pinned_mem_limit(0.0) == "1M"


def test_defaults_are_sent_once_and_bind_only_servers_spawned_later(
    fake: FakeMpsControlDaemon, control: MpsControlCli
) -> None:
    early_server = fake.connect_client(100, uid=2000)  # spawned before the defaults
    events: list[Event] = []
    mps = enforcer(control, events, {}, defaults=MpsDefaults(active_thread_percentage=50, pinned_mem_mb=4096))

    mps.apply([])
    mps.apply([])

    assert fake.commands == [
        "set_default_active_thread_percentage 50",
        f"set_default_device_pinned_mem_limit {GPU_A.uuid} 4096M",
        f"set_default_device_pinned_mem_limit {GPU_B.uuid} 4096M",
    ]
    assert [(e.action, e.target) for e in events] == [
        ("mps.set_default_active_thread_percentage", "mps-control"),
        ("mps.set_default_device_pinned_mem_limit", f"gpu/{GPU_A.uuid}"),
        ("mps.set_default_device_pinned_mem_limit", f"gpu/{GPU_B.uuid}"),
    ]
    assert events[0].detail["reply"] == "50.0"
    assert fake.servers[early_server].active_thread_percentage == 100.0  # "only affects the next server"
    later_server = fake.connect_client(200, uid=3000)
    assert fake.servers[later_server].active_thread_percentage == 50.0
    assert fake.client(200).pinned_mem_limits == {GPU_A.uuid: "4096M", GPU_B.uuid: "4096M"}


def test_grant_configures_the_workloads_server_for_clients_that_connect_afterwards(
    fake: FakeMpsControlDaemon, control: MpsControlCli
) -> None:
    server = fake.connect_client(501, uid=1000)
    events: list[Event] = []
    mps = enforcer(control, events, {BERT.key: [501]})

    mps.apply([Grant(workload=BERT, gpu=GPU_A.uuid, mem_mb=2048.0, sm=27.0)])

    assert sets(fake.commands)[1:] == [
        f"set_active_thread_percentage {server} 25",
        f"set_device_pinned_mem_limit {server} {GPU_A.uuid} 2048M",
    ]
    assert fake.servers[server].active_thread_percentage == 25.0
    assert fake.servers[server].pinned_mem_limits == {GPU_A.uuid: "2048M"}
    # The running client keeps what it took at connection: MPS changes no running process.
    assert fake.client(501).active_thread_percentage == 100.0
    assert fake.client(501).pinned_mem_limits == {}
    fake.connect_client(502, uid=1000)
    assert fake.client(502).active_thread_percentage == 25.0
    assert fake.client(502).pinned_mem_limits == {GPU_A.uuid: "2048M"}

    per_server = [e for e in events if e.target == f"mps-server/{server}"]
    assert [e.action for e in per_server] == ["mps.set_active_thread_percentage", "mps.set_device_pinned_mem_limit"]
    assert per_server[0].detail["running_clients_unaffected"] == [501]
    assert per_server[0].detail["workloads"] == [BERT.key]
    assert per_server[0].detail["percentage"] == 25
    assert per_server[1].detail["limit"] == "2048M"


def test_unchanged_grants_send_no_commands_and_changes_send_only_what_changed(fake: FakeMpsControlDaemon) -> None:
    server = fake.connect_client(501)
    events: list[Event] = []
    mps = enforcer(fake.control(), events, {BERT.key: [501]})
    mps.apply([Grant(workload=BERT, gpu=GPU_A.uuid, mem_mb=2048.0, sm=27.0)])
    sent_before, events_before = len(sets(fake.commands)), len(events)

    mps.apply([Grant(workload=BERT, gpu=GPU_A.uuid, mem_mb=2048.0, sm=26.5)])  # still 25 %
    assert len(sets(fake.commands)) == sent_before
    assert len(events) == events_before

    mps.apply([Grant(workload=BERT, gpu=GPU_A.uuid, mem_mb=2048.0, sm=54.0)])
    assert sets(fake.commands)[sent_before:] == [f"set_active_thread_percentage {server} 50"]
    assert [e.action for e in events[events_before:]] == ["mps.set_active_thread_percentage"]


def test_workload_on_two_gpus_gets_its_largest_share_and_a_limit_per_gpu(fake: FakeMpsControlDaemon) -> None:
    server = fake.connect_client(501)
    mps = enforcer(fake.control(), [], {BERT.key: [501]})

    mps.apply(
        [
            Grant(workload=BERT, gpu=GPU_A.uuid, mem_mb=1000.0, sm=10.8),
            Grant(workload=BERT, gpu=GPU_B.uuid, mem_mb=3000.0, sm=54.0),
        ]
    )

    assert fake.servers[server].active_thread_percentage == 50.0  # one value per server, all devices
    assert fake.servers[server].pinned_mem_limits == {GPU_A.uuid: "1000M", GPU_B.uuid: "3000M"}


def test_server_shared_by_two_workloads_gets_the_larger_grant_and_says_so(fake: FakeMpsControlDaemon) -> None:
    server = fake.connect_client(501, uid=1000)
    fake.connect_client(601, uid=1000)  # same user id: same MPS server
    events: list[Event] = []
    mps = enforcer(fake.control(), events, {BERT.key: [501], GPT.key: [601]})

    grants = [
        Grant(workload=BERT, gpu=GPU_A.uuid, mem_mb=2048.0, sm=27.0),
        Grant(workload=GPT, gpu=GPU_A.uuid, mem_mb=8192.0, sm=10.8),
    ]
    mps.apply(grants)
    mps.apply(grants)

    assert fake.servers[server].active_thread_percentage == 25.0
    assert fake.servers[server].pinned_mem_limits == {GPU_A.uuid: "8192M"}
    shared = [e for e in events if e.action == "mps.shared_server"]
    assert len(shared) == 1
    assert shared[0].detail["workloads"] == sorted([BERT.key, GPT.key])


def test_process_that_is_not_an_mps_client_is_reported_once(fake: FakeMpsControlDaemon) -> None:
    events: list[Event] = []
    mps = enforcer(fake.control(), events, {BERT.key: [777]})
    grants = [Grant(workload=BERT, gpu=GPU_A.uuid, mem_mb=2048.0, sm=27.0)]

    mps.apply(grants)
    mps.apply(grants)

    unmanaged = [e for e in events if e.action == "mps.unmanaged_process"]
    assert [(e.target, e.detail["pid"]) for e in unmanaged] == [(BERT.key, 777)]
    assert sets(fake.commands) == ["set_default_active_thread_percentage 100"]


def test_rejected_command_is_reported_once_and_retried_every_tick(
    fake: FakeMpsControlDaemon, control: MpsControlCli
) -> None:
    odd_gpu = GpuInfo(uuid="card0", model="NVIDIA A100-SXM4-80GB", memory_mb=81920, sm_count=108)
    server = fake.connect_client(501)
    events: list[Event] = []
    mps = enforcer(control, events, {BERT.key: [501]}, gpus=[odd_gpu])
    grants = [Grant(workload=BERT, gpu=odd_gpu.uuid, mem_mb=2048.0, sm=27.0)]

    mps.apply(grants)
    mps.apply(grants)

    line = f"set_device_pinned_mem_limit {server} card0 2048M"
    assert fake.commands.count(line) == 2  # retried
    assert fake.servers[server].pinned_mem_limits == {}  # the strict grammar refused the device
    failed = [e for e in events if e.action == "mps.command_failed"]
    assert len(failed) == 1
    assert failed[0].detail["command"] == line
    assert "Invalid device: card0" in failed[0].detail["error"]
    assert fake.servers[server].active_thread_percentage == 25.0  # the valid command still applied


def test_forget_resends_everything_after_a_daemon_restart(fake: FakeMpsControlDaemon) -> None:
    control = fake.control()
    mps = enforcer(control, [], {}, defaults=MpsDefaults(active_thread_percentage=40))
    mps.apply([])
    control.send("quit")
    assert fake.default_active_thread_percentage == 100.0  # lost on quit, as documented

    mps.forget()
    mps.apply([])

    assert fake.default_active_thread_percentage == 40.0


def test_no_daemon_is_a_reported_failure_not_a_crash(pipe_dir: Path, control: MpsControlCli) -> None:
    pipe_dir.mkdir()
    events: list[Event] = []
    mps = enforcer(control, events, {})

    mps.apply([Grant(workload=BERT, gpu=GPU_A.uuid, mem_mb=1.0, sm=1.0)])

    assert [e.action for e in events] == ["mps.command_failed", "mps.command_failed"]
    assert "Cannot find MPS control daemon" in events[0].detail["error"]
    with pytest.raises(MpsCommandError, match="Cannot find MPS control daemon"):
        control.send("get_server_list")


def test_control_sends_one_command_line_only(control: MpsControlCli) -> None:
    for bad in ("", " get_server_list", "get_server_list\nquit"):
        with pytest.raises(ValueError, match="one non-blank line"):
            control.send(bad)


def test_missing_control_executable_names_the_alternatives(pipe_dir: Path) -> None:
    control = MpsControlCli(command=("/nonexistent/nvidia-cuda-mps-control",), pipe_directory=pipe_dir)
    with pytest.raises(MpsCommandError, match="watchdog/dry-run"):
        control.send("get_server_list")


def test_front_end_reports_grammar_errors_through_the_pipe(fake: FakeMpsControlDaemon, control: MpsControlCli) -> None:
    with pytest.raises(MpsCommandError, match="Invalid active thread percentage: 0"):
        control.send("set_default_active_thread_percentage 0")
    assert fake.default_active_thread_percentage == 100.0


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("frobnicate", "Unrecognized command"),
        ("set_default_active_thread_percentage", "expected 1 argument"),
        ("set_default_active_thread_percentage 50 60", "expected 1 argument"),
        ("set_default_active_thread_percentage 101", "Invalid active thread percentage"),
        ("set_default_active_thread_percentage -5", "Invalid active thread percentage"),
        ("set_default_active_thread_percentage half", "Invalid active thread percentage"),
        ("set_active_thread_percentage 0 50", "Invalid PID"),
        ("set_active_thread_percentage 99999 50", "Server 99999 not found"),
        ("set_default_device_pinned_mem_limit 0 2048", "Invalid memory limit"),
        ("set_default_device_pinned_mem_limit 0 2048K", "Invalid memory limit"),
        ("set_default_device_pinned_mem_limit 0 0M", "Invalid memory limit"),
        ("set_default_device_pinned_mem_limit gpu0 1G", "Invalid device"),
        ("set_device_pinned_mem_limit 99999 0 1G", "Server 99999 not found"),
        ("get_client_list", "expected 1 argument"),
    ],
)
def test_fake_daemon_refuses_what_the_documented_grammar_does_not_allow(line: str, message: str) -> None:
    fake = FakeMpsControlDaemon(Path("/nonexistent"))  # grammar only: no pipe needed
    with pytest.raises(MpsGrammarError, match=message):
        fake.execute(line)


def test_fake_daemon_accepts_the_documented_examples() -> None:
    fake = FakeMpsControlDaemon(Path("/nonexistent"))
    server = fake.connect_client(1024)
    assert fake.execute("set_default_device_pinned_mem_limit 0 10G") == ""
    assert fake.execute(f"set_device_pinned_mem_limit {server} 0 900M") == ""
    assert fake.execute(f"get_device_pinned_mem_limit {server} 0") == "900M"
    assert fake.execute("set_default_active_thread_percentage 12.5") == "12.5"
    assert fake.execute(f"get_active_thread_percentage {server}") == "100.0"
    assert fake.execute("get_server_list") == str(server)
    assert fake.execute(f"get_client_list {server}") == "1024"
