"""The real-GPU check kit on CPU: its parsers, judgements and report, the load generator over a
fake libcuda (real ctypes calls), the NVML recorder over FakeNvml, and the MPS stage against the
fake control daemon. Nothing here needs a GPU, a driver or the CUDA toolkit."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from agents.backends.nvml import NvmlBackend
from agents.cuda_driver import BUSY_KERNEL, BUSY_PTX, BUSY_PTX_TARGET, SIGNATURES, CudaDriver, CudaError, format_uuid
from agents.fakes.cuda_driver import FakeCudaDevice, FakeLibcuda
from agents.fakes.mps import FakeMpsControlDaemon
from agents.fakes.nvml import FakeNvml, FakeNvmlDevice
from agents.gpu_check.compare import MEMORY_TOLERANCE_MB, Round, judge
from agents.gpu_check.fixtures import RecordingNvml
from agents.gpu_check.load import EXIT_CUDA_ERROR, LoadProcess, run_load
from agents.gpu_check.mps_stage import (
    PIPE_ENV,
    EnforcerProbe,
    PrivateMpsDaemon,
    processes_with_environment,
    run_mps_stage,
    stop_processes,
)
from agents.gpu_check.report import FAIL, PASS, SKIP, StageResult, exit_code, render, stage_from_checks
from agents.gpu_check.smi import NvidiaSmiError, parse_compute_apps, parse_gpus, parse_pmon, parse_value
from agents.interfaces import GpuInfo
from tests.clock import now

MIB = 1024 * 1024
NOWHERE = "/nonexistent/libcuda.so.1"
GPU = GpuInfo(uuid="GPU-00010203-0405-0607-0809-0a0b0c0d0e0f", model="NVIDIA H200", memory_mb=143771, sm_count=132)


# -- nvidia-smi ---------------------------------------------------------------------------------


def test_compute_apps_parse_with_and_without_units_and_missing_memory_is_none_not_zero() -> None:
    apps = parse_compute_apps(
        "4242, GPU-aaaa, 1536\n"
        "4243, GPU-aaaa, 2048 MiB\n"
        "4244, GPU-bbbb, [N/A]\n"
        "4245, GPU-bbbb, [Not Supported]\n"
        "4246, GPU-bbbb, 1 GiB\n"
    )
    assert [(a.pid, a.gpu_uuid, a.used_memory_mb) for a in apps] == [
        (4242, "GPU-aaaa", 1536.0),
        (4243, "GPU-aaaa", 2048.0),
        (4244, "GPU-bbbb", None),
        (4245, "GPU-bbbb", None),
        (4246, "GPU-bbbb", 1024.0),
    ]
    assert parse_compute_apps("No running processes found\n") == []


def test_gpu_query_parses_utilisation_and_memory() -> None:
    (gpu,) = parse_gpus("GPU-aaaa, 97 %, 2300 MiB, 143771 MiB\n")
    assert (gpu.uuid, gpu.utilization_percent, gpu.memory_used_mb, gpu.memory_total_mb) == (
        "GPU-aaaa", 97.0, 2300.0, 143771.0)
    (mig,) = parse_gpus("GPU-bbbb, [N/A], 10, 40960\n")
    assert mig.utilization_percent is None


def test_malformed_nvidia_smi_output_is_an_error_not_a_guess() -> None:
    with pytest.raises(NvidiaSmiError, match="expected 3 columns"):
        parse_compute_apps("4242, 1536\n")
    with pytest.raises(NvidiaSmiError, match="not a number"):
        parse_value("lots")


def test_pmon_columns_are_found_by_name_and_dashes_are_none() -> None:
    text = textwrap.dedent("""\
        # gpu         pid   type     sm    mem    enc    dec    jpg    ofa    command
        # Idx           #    C/G      %      %      %      %      %      %    name
            0       4242     C     98      3      -      -      -      -    python -m agents.gpu_check load
            0       4243     C      -      -      -      -      -      -    idle
            1          -     -      -      -      -      -      -      -    -
        """)
    rows = parse_pmon(text)
    assert [(r.gpu_index, r.pid, r.sm_percent) for r in rows] == [(0, 4242, 98.0), (0, 4243, None)]
    assert rows[0].command == "python -m agents.gpu_check load"
    with pytest.raises(NvidiaSmiError, match="before a header"):
        parse_pmon("    0   4242   C   98   3\n")


# -- the PTX and the ctypes binding ---------------------------------------------------------------


def test_ptx_declares_the_kernel_the_launch_names_for_the_target_it_says() -> None:
    version = re.search(r"^\.version (\d+)\.(\d+)$", BUSY_PTX, re.M)
    assert version is not None
    assert int(version.group(1)) >= 6
    assert re.search(rf"^\.target {BUSY_PTX_TARGET}$", BUSY_PTX, re.M)
    assert int(BUSY_PTX_TARGET.removeprefix("sm_")) >= 52
    entry = re.search(rf"\.visible \.entry {BUSY_KERNEL}\((.*?)\)", BUSY_PTX, re.S)
    assert entry is not None
    assert entry.group(1).count(".param .u64") == 2  # iterations pointer, duration in ns
    assert "%globaltimer" in BUSY_PTX
    assert "st.global.u64" in BUSY_PTX
    assert BUSY_PTX.count("{") == BUSY_PTX.count("}")


def test_every_driver_function_called_is_declared_and_gets_its_argtypes() -> None:
    source = Path(sys.modules[CudaDriver.__module__].__file__ or "").read_text()
    called = set(re.findall(r'(?:call|functions)\[?\(?"(cu[A-Za-z0-9_]+)"', source))
    assert called
    assert called <= set(SIGNATURES)
    driver = CudaDriver(loader=lambda _: FakeLibcuda())
    for name, argtypes in SIGNATURES.items():
        assert list(driver.functions[name].argtypes) == list(argtypes), name


def test_uuid_bytes_print_as_nvml_prints_the_gpu() -> None:
    assert format_uuid(bytes(range(16))) == "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"
    with pytest.raises(ValueError, match="16 bytes"):
        format_uuid(b"short")


def test_load_holds_its_memory_runs_a_block_per_sm_and_frees_everything() -> None:
    fake = FakeLibcuda(devices=[FakeCudaDevice(sm_count=20)])
    driver = CudaDriver(loader=lambda _: fake)
    driver.init()
    held: list[int] = []
    result = driver.run_load(ordinal=0, mb=2, blocks=20, seconds=0.05, on_ready=lambda: held.append(fake.held_bytes()))
    assert held == [2 * MIB + 20 * 8]  # the allocation and the block counters, while running
    assert result.allocated_mb == 2
    assert result.blocks == 20
    assert result.min_block_iterations > 0
    assert {launch.grid for launch in fake.launches} == {(20, 1, 1)}
    assert all(0 < launch.params[1] <= 200_000_000 for launch in fake.launches)  # ns slices of the run
    assert "cuMemsetD8_v2" in fake.calls  # the memory was written, so it is resident
    assert fake.held_bytes() == 0
    assert fake.state.retained == {0: 0}
    assert not fake.state.modules


def test_device_query_reads_name_uuid_sms_and_memory() -> None:
    driver = CudaDriver(loader=lambda _: FakeLibcuda())
    driver.init()
    device = driver.device(0)
    assert (device.name, device.uuid, device.sm_count, device.compute_capability, device.memory_mb) == (
        "NVIDIA H200", GPU.uuid, 132, (9, 0), 143771)
    with pytest.raises(CudaError, match="CUDA_ERROR_INVALID_DEVICE: invalid device ordinal"):
        driver.device(3)


def test_allocation_past_the_limit_is_out_of_memory_in_the_loads_json(capsys: pytest.CaptureFixture[str]) -> None:
    fake = FakeLibcuda(memory_limit_mb=4)
    code = run_load(ordinal=0, mb=8, sms=None, seconds=0.05, loader=lambda _: fake)
    assert code == EXIT_CUDA_ERROR
    record = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert record == {"event": "error", "call": "cuMemAlloc_v2", "error": "CUDA_ERROR_OUT_OF_MEMORY",
                      "text": "out of memory"}
    assert fake.held_bytes() == 0
    assert fake.state.retained == {0: 0}


def test_load_under_the_limit_says_ready_then_done(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_load(ordinal=0, mb=2, sms=3, seconds=0.05, loader=lambda _: FakeLibcuda(memory_limit_mb=4)) == 0
    ready, done = (json.loads(line) for line in capsys.readouterr().out.splitlines())
    assert ready == {"event": "ready", "pid": os.getpid(), "gpu": GPU.uuid, "mb": 2, "blocks": 3, "sm_count": 132}
    assert done["event"] == "done"
    assert done["blocks"] == 3
    assert done["min_block_iterations"] > 0


# -- no driver ------------------------------------------------------------------------------------


def test_no_driver_is_a_clear_message_and_exit_3_without_a_traceback() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "agents.gpu_check", "--libcuda", NOWHERE, "--nvidia-smi", "/nonexistent/nvidia-smi"],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert done.returncode == 3
    assert "cannot check on this machine" in done.stderr
    assert f"cannot load {NOWHERE}" in done.stderr
    assert "/nonexistent/nvidia-smi: not found" in done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout == ""


def test_a_load_process_without_a_driver_reports_it_and_never_gets_ready() -> None:
    with LoadProcess(ordinal=0, mb=1, seconds=1, library=NOWHERE) as load:
        assert not load.wait_ready(60)
        outcome = load.finish(60)
    assert outcome.returncode == 3
    assert outcome.error is not None
    assert outcome.error["error"] == "no-driver"
    assert "Traceback" not in outcome.stderr
    assert NOWHERE in outcome.describe()


# -- tolerances and report ------------------------------------------------------------------------


def a_round(**changes: object) -> Round:
    values: dict[str, object] = {
        "at_s": 2.0, "backend_listed": True, "backend_mem_mb": 1536.0, "backend_sm_percent": 97.0,
        "backend_sm_used": 128.0, "smi_listed": True, "smi_mem_mb": 1536.0, "pmon_sm_percent": 95.0,
        "gpu_util_percent": 100.0,
    }
    values.update(changes)
    return Round(**values)  # type: ignore[arg-type]  # test data, checked by Round itself


def verdicts(rounds: list[Round], allocated_mb: int = 1024) -> dict[str, bool | None]:
    return {c.name.split(" ")[0] + ("" if "smi" not in c.name else "-" + c.name.split()[-1]): c.passed
            for c in judge(rounds, allocated_mb=allocated_mb)}


def test_agreeing_readings_pass_every_check() -> None:
    checks = judge([a_round(at_s=t) for t in (2.0, 4.0, 6.0)], allocated_mb=1024)
    assert [c.passed for c in checks] == [True] * 6


def test_memory_off_by_more_than_the_tolerance_fails_and_within_it_passes() -> None:
    name = f"memory within {MEMORY_TOLERANCE_MB:g} MiB of nvidia-smi"
    within = {c.name: c for c in judge([a_round(smi_mem_mb=1536.0 + MEMORY_TOLERANCE_MB)], allocated_mb=1024)}
    assert within[name].passed is True
    off = {c.name: c for c in judge([a_round(), a_round(smi_mem_mb=1536.0 * 1.024)], allocated_mb=1024)}
    assert off[name].passed is False
    assert "36.9 MiB" in off[name].detail


def test_memory_below_the_allocation_or_far_above_it_fails() -> None:
    key = "memory between the allocation and 2048 MiB above it"
    below = {c.name: c.passed for c in judge([a_round(backend_mem_mb=1000.0, smi_mem_mb=1000.0)], allocated_mb=1024)}
    above = {c.name: c.passed for c in judge([a_round(backend_mem_mb=5000.0, smi_mem_mb=5000.0)], allocated_mb=1024)}
    assert below[key] is False
    assert above[key] is False


def test_an_idle_reading_of_a_busy_load_fails_and_the_first_round_is_not_judged_for_sm() -> None:
    idle = {c.name: c.passed for c in judge([a_round(), a_round(backend_sm_percent=0.0)], allocated_mb=1024)}
    assert idle["busy: backend SM at least 50 %"] is False
    assert idle["SM within 20 points of pmon sm"] is False
    warm = {c.name: c.passed for c in judge([a_round(backend_sm_percent=0.0), a_round()], allocated_mb=1024)}
    assert warm["busy: backend SM at least 50 %"] is True


def test_values_nvidia_smi_withholds_are_not_judged_and_a_missing_pid_fails() -> None:
    checks = {c.name: c for c in judge([a_round(smi_mem_mb=None, pmon_sm_percent=None)], allocated_mb=1024)}
    assert checks[f"memory within {MEMORY_TOLERANCE_MB:g} MiB of nvidia-smi"].passed is None
    assert checks["SM within 20 points of pmon sm"].passed is None
    missing = {c.name: c for c in judge([a_round(backend_listed=False, smi_listed=False)], allocated_mb=1024)}
    assert missing["PID listed"].passed is False
    assert "by backend and nvidia-smi" in missing["PID listed"].detail


def test_stage_status_follows_its_checks_and_the_exit_code_follows_the_stages() -> None:
    rounds = [a_round(), a_round(smi_mem_mb=2000.0)]
    failed = stage_from_checks("nvml-vs-nvidia-smi", judge(rounds, allocated_mb=1024))
    passed = stage_from_checks("nvml-vs-nvidia-smi", judge([a_round()], allocated_mb=1024))
    assert (failed.status, passed.status) == (FAIL, PASS)
    assert "memory within" in failed.reason
    skipped = StageResult("mps", SKIP, "nvidia-cuda-mps-control not found")
    assert exit_code([passed, skipped]) == 0
    assert exit_code([passed, failed, skipped]) == 1


def test_report_is_markdown_with_a_row_per_stage_and_escaped_cells() -> None:
    stage = stage_from_checks("nvml-vs-nvidia-smi", judge([a_round()], allocated_mb=1024))
    text = render(title="Real-GPU check", facts=[("GPU", "NVIDIA H200 | 132 SMs")],
                  stages=[stage, StageResult("mps", SKIP, "--skip-mps")])
    lines = text.splitlines()
    assert lines[0] == "### Real-GPU check"
    assert "| GPU | NVIDIA H200 \\| 132 SMs |" in lines
    assert "| mps | skip | --skip-mps |" in lines
    assert "#### nvml-vs-nvidia-smi: pass" in lines
    assert any(line.startswith("| PID listed | pass |") for line in lines)
    assert "#### mps" not in text  # nothing more to say about a skipped stage


# -- NVML fixtures --------------------------------------------------------------------------------


def h200(**changes: object) -> FakeNvmlDevice:
    device = FakeNvmlDevice(uuid=GPU.uuid, name="NVIDIA H200", memory_total_bytes=143771 * MIB,
                            compute_capability=(9, 0), cuda_cores=16896, processes={4242: 1536 * MIB, 77: None},
                            samples=[(4242, 1_000, 96), (4242, 2_000, 98)], pcie_tx_kb_s=2048, pcie_rx_kb_s=None)
    for key, value in changes.items():
        setattr(device, key, value)
    return device


def test_recorded_nvml_answers_round_trip_into_fake_nvml_and_read_the_same() -> None:
    mig = FakeNvmlDevice(uuid="MIG-1", memory_total_bytes=40960 * MIB, mig_sm_count=42, processes={9: 10 * MIB},
                         samples=[(9, 1_500, 40)])
    original = [h200(), FakeNvmlDevice(uuid="GPU-mig-parent", mig_instances=[mig])]
    recorder = RecordingNvml(FakeNvml(devices=original))
    backend = NvmlBackend(nvml=recorder)
    seen = backend.read(now=datetime(2026, 11, 30, tzinfo=UTC))
    fixture = json.loads(json.dumps(recorder.fixture(driver="550.54.15", captured_at=now().isoformat())))
    assert fixture["source"]["driver"] == "550.54.15"
    replayed = NvmlBackend(nvml=FakeNvml.from_fixture(fixture))
    assert replayed.inventory() == backend.inventory()
    assert replayed.read(now=datetime(2026, 11, 30, tzinfo=UTC)) == seen
    (device, parent) = fixture["devices"]
    assert device["processes"] == [[77, None], [4242, 1536 * MIB]]
    assert (device["pcie_tx_kb_s"], device["pcie_rx_kb_s"], device["mig_sm_count"]) == (2048, None, None)
    assert parent["mig_instances"][0]["mig_sm_count"] == 42


def test_samples_seen_over_several_reads_are_all_kept_once() -> None:
    device = h200()
    recorder = RecordingNvml(FakeNvml(devices=[device]))
    backend = NvmlBackend(nvml=recorder)
    backend.read(now=datetime(2026, 11, 30, tzinfo=UTC))
    device.samples.append((4242, 3_000, 99))
    backend.read(now=datetime(2026, 11, 30, tzinfo=UTC))
    backend.read(now=datetime(2026, 11, 30, tzinfo=UTC))  # nothing new: NOT_FOUND, passed through
    assert recorder.fixture()["devices"][0]["samples"] == [[4242, 1_000, 96], [4242, 2_000, 98], [4242, 3_000, 99]]


def test_a_file_that_is_not_an_nvml_fixture_is_refused() -> None:
    with pytest.raises(ValueError, match="not an NVML fixture"):
        FakeNvml.from_fixture({"schema": "vgpu-ledger/usage-batch/v1", "devices": []})


# -- MPS ------------------------------------------------------------------------------------------


@pytest.fixture
def fake_daemon(tmp_path: Path) -> Iterator[FakeMpsControlDaemon]:
    with FakeMpsControlDaemon(tmp_path / "pipe") as daemon:
        yield daemon


def test_the_enforcers_commands_are_accepted_and_read_back_as_set(fake_daemon: FakeMpsControlDaemon) -> None:
    probe = EnforcerProbe(control=fake_daemon.control(), gpu=GPU, limit_mb=512, percentage=50, now=now)
    probe.send_defaults(ordinal=0)
    server = fake_daemon.connect_client(4242)  # the load connecting as an MPS client
    probe.grant(4242)
    assert [c.passed for c in probe.checks()] == [True, True, True]
    commands = [row[0] for row in probe.rows]
    assert commands == [
        "set_default_active_thread_percentage 50",
        f"set_default_device_pinned_mem_limit {GPU.uuid} 512M",
        "get_default_active_thread_percentage",
        f"set_active_thread_percentage {server} 50",
        f"set_device_pinned_mem_limit {server} {GPU.uuid} 512M",
        f"get_active_thread_percentage {server}",
        f"get_device_pinned_mem_limit {server} {GPU.uuid}",
    ]
    assert fake_daemon.servers[server].pinned_mem_limits == {GPU.uuid: "512M"}


def test_a_client_the_daemon_does_not_serve_fails_the_probe(fake_daemon: FakeMpsControlDaemon) -> None:
    probe = EnforcerProbe(control=fake_daemon.control(), gpu=GPU, limit_mb=512, percentage=50, now=now)
    probe.send_defaults(ordinal=0)
    probe.grant(4242)  # never connected
    checks = {c.name: c.passed for c in probe.checks()}
    assert checks["client found under its MPS server"] is False


def test_stragglers_are_found_by_their_environment_and_stopped_by_pid(tmp_path: Path) -> None:
    marker = str(tmp_path / "pipe")
    child = subprocess.Popen(["sleep", "60"], env={**os.environ, PIPE_ENV: marker})
    try:
        # Popen returns once the child has closed its close-on-exec pipe, which the kernel does
        # before it writes the new program's environment: /proc/PID/environ reads empty for a
        # moment after that, so the test waits for the environment to appear.
        deadline = time.monotonic() + 5
        while not (found := processes_with_environment(PIPE_ENV, marker)) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert found == [child.pid]
        notes = stop_processes([child.pid], grace_s=5.0)
        assert child.wait(timeout=5) == -15
        assert notes == [f"sent SIGTERM to {child.pid}"]
    finally:
        child.kill()
        child.wait()


@pytest.fixture
def fake_control_cli(tmp_path: Path) -> Path:
    """``nvidia-cuda-mps-control`` on the fake daemon: ``-d`` starts it in the background and
    returns once it listens; otherwise the front end forwards stdin, as the real tool does."""
    script = tmp_path / "nvidia-cuda-mps-control"
    serve = ("import os; from agents.fakes.mps import FakeMpsControlDaemon as D; "
             "d = D(os.environ['CUDA_MPS_PIPE_DIRECTORY']).start(); d.quit_received.wait(); d.stop()")
    script.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        if [ "$1" = "-d" ]; then
          "{sys.executable}" -c "{serve}" </dev/null >/dev/null 2>&1 &
          for _ in $(seq 200); do [ -p "$CUDA_MPS_PIPE_DIRECTORY/control" ] && exit 0; sleep 0.05; done
          exit 1
        fi
        exec "{sys.executable}" -m agents.fakes.mps
        """))
    script.chmod(0o755)
    return script


def test_private_daemon_starts_takes_commands_quits_and_leaves_nothing(fake_control_cli: Path) -> None:
    daemon = PrivateMpsDaemon(control=(str(fake_control_cli),))
    root = daemon.pipe_directory.parent
    try:
        daemon.start()
        assert daemon.control().send("set_default_active_thread_percentage 50") == "50.0"
        assert processes_with_environment(PIPE_ENV, str(daemon.pipe_directory))
    finally:
        notes = daemon.close()
    assert notes == ["quit accepted"]
    assert not root.exists()
    assert processes_with_environment(PIPE_ENV, str(daemon.pipe_directory)) == []


def test_mps_stage_without_a_driver_fails_on_its_clients_and_still_cleans_up(fake_control_cli: Path) -> None:
    stage = run_mps_stage(control=(str(fake_control_cli),), gpu=GPU, ordinal=0, limit_mb=512, percentage=50,
                          library=NOWHERE, timeout_s=60)
    checks = {row[0]: row[1] for _, table in stage.tables if table.headers[0] == "check" for row in table.rows}
    assert stage.status == FAIL
    assert checks["private control daemon started"] == PASS
    assert checks["enforcer commands accepted"] == PASS
    assert checks["a client under the 512 MiB limit runs"] == FAIL
    assert checks["a client over the 512 MiB limit gets CUDA_ERROR_OUT_OF_MEMORY"] == FAIL
    assert checks["daemon quit and cleaned up"] == PASS


def test_mps_stage_is_skipped_when_the_control_daemon_is_not_installed() -> None:
    stage = run_mps_stage(control=("/nonexistent/nvidia-cuda-mps-control",), gpu=GPU, ordinal=0, limit_mb=512,
                          percentage=50, library=NOWHERE)
    assert stage.status == SKIP
    assert "not found" in stage.reason
