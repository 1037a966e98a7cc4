"""Command line of the GPU check kit: ``check`` (the default) and ``load``."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pynvml

from agents.attribution import PidAttributor
from agents.backends.nvml import NvmlBackend
from agents.clock import utc_now
from agents.cuda_driver import DEFAULT_LIBRARY, CudaDevice, CudaDriver, CudaError, CudaUnavailable
from agents.gpu_check.compare import Check, Round, judge
from agents.gpu_check.fixtures import RecordingNvml
from agents.gpu_check.load import EXIT_NO_DRIVER, LoadOutcome, LoadProcess, run_load
from agents.gpu_check.mps_stage import run_mps_stage
from agents.gpu_check.report import FAIL, PASS, SKIP, StageResult, Table, exit_code, render, stage_from_checks
from agents.gpu_check.smi import NvidiaSmi, NvidiaSmiError
from agents.interfaces import GpuInfo
from agents.mps import DEFAULT_CONTROL_COMMAND, MpsCommandError

__all__ = ["main"]

_READY_TIMEOUT_S = 120.0  # the first run of a GPU may JIT and load modules slowly
_STAGE_ERRORS = (pynvml.NVMLError, NvidiaSmiError, CudaError, MpsCommandError, OSError)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m agents.gpu_check",
        description="Check the agent's NVML readings and MPS enforcement on this machine's GPU "
        "(needs the NVIDIA driver, not the CUDA toolkit).",
    )
    parser.add_argument("--device", type=int, default=0, help="CUDA device ordinal (default 0)")
    parser.add_argument("--mb", type=int, default=1024, help="MiB the load holds (default 1024)")
    parser.add_argument("--sms", type=int, default=None, help="blocks the load keeps busy, one per SM (default: all SMs)")
    parser.add_argument("--rounds", type=int, default=4, help="comparisons with nvidia-smi (default 4)")
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between comparisons (default 2)")
    parser.add_argument("--mps-limit-mb", type=int, default=512, help="the private MPS daemon's pinned memory limit")
    parser.add_argument("--mps-percentage", type=int, default=50, help="its active thread percentage")
    parser.add_argument("--skip-mps", action="store_true", help="do not start a private MPS daemon")
    parser.add_argument("--save-fixtures", type=Path, default=None, metavar="DIR", help="write the NVML answers here")
    parser.add_argument("--report", type=Path, default=None, metavar="FILE", help="also write the report here")
    parser.add_argument("--libcuda", default=DEFAULT_LIBRARY, help=f"the CUDA driver library (default {DEFAULT_LIBRARY})")
    parser.add_argument("--nvidia-smi", default="nvidia-smi", help="nvidia-smi executable (default: on PATH)")
    parser.add_argument("--mps-control", default=DEFAULT_CONTROL_COMMAND[0], help="MPS control executable")
    commands = parser.add_subparsers(dest="command")
    load = commands.add_parser("load", help="be the load: hold memory and keep SMs busy (prints JSON lines)")
    load.add_argument("--device", type=int, default=0)
    load.add_argument("--mb", type=int, default=1024, help="MiB to allocate and write")
    load.add_argument("--sms", type=int, default=None, help="blocks to launch, one per SM (default: all SMs)")
    load.add_argument("--seconds", type=float, default=10.0, help="how long to run (SIGTERM ends it sooner)")
    load.add_argument("--libcuda", default=DEFAULT_LIBRARY)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "load":
        return run_load(library=args.libcuda, ordinal=args.device, mb=args.mb, sms=args.sms, seconds=args.seconds)
    return _check(args)


@dataclass
class _Machine:
    cuda: CudaDriver
    device: CudaDevice
    smi: NvidiaSmi
    recorder: RecordingNvml


def _preflight(args: argparse.Namespace) -> _Machine | list[str]:
    """Everything the check needs, or what is missing (every missing thing, not just the first)."""
    problems: list[str] = []
    cuda: CudaDriver | None = None
    device: CudaDevice | None = None
    try:
        cuda = CudaDriver(args.libcuda)
        cuda.init()
        count = cuda.device_count()
        if not 0 <= args.device < count:
            problems.append(f"CUDA device {args.device}: the driver sees {count} device(s)")
        else:
            device = cuda.device(args.device)
    except (CudaUnavailable, CudaError) as error:
        problems.append(f"CUDA driver: {error}")
    if shutil.which(args.nvidia_smi) is None:
        problems.append(f"{args.nvidia_smi}: not found (it comes with the NVIDIA driver)")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:
        problems.append(f"NVML: {error} (libnvidia-ml.so.1 comes with the NVIDIA driver)")
    if problems or cuda is None or device is None:
        return problems
    return _Machine(cuda=cuda, device=device, smi=NvidiaSmi(args.nvidia_smi), recorder=RecordingNvml(pynvml))


def _check(args: argparse.Namespace) -> int:
    machine = _preflight(args)
    if isinstance(machine, list):
        print("gpu-check: cannot check on this machine:", file=sys.stderr)
        for problem in machine:
            print(f"  - {problem}", file=sys.stderr)
        print("It needs an NVIDIA driver (libcuda.so.1, NVML, nvidia-smi); the CUDA toolkit is not needed.",
              file=sys.stderr)
        return EXIT_NO_DRIVER
    device = machine.device
    stages: list[StageResult] = []
    backend = NvmlBackend(nvml=machine.recorder)
    gpu = next((g for g in backend.inventory() if g.uuid == device.uuid), None)
    stages.append(_driver_stage(device, gpu))
    if gpu is None:
        stages += [StageResult(n, SKIP, "NVML does not list the CUDA device") for n in ("load", "nvml-vs-nvidia-smi", "mps")]
    else:
        stages += _guarded(("load", "nvml-vs-nvidia-smi"), lambda: _load_stages(args, machine, backend, gpu))
        if args.skip_mps:
            stages.append(StageResult("mps", SKIP, "--skip-mps"))
        else:
            stages += _guarded(("mps",), lambda: [run_mps_stage(
                control=(args.mps_control,), gpu=gpu, ordinal=args.device, limit_mb=args.mps_limit_mb,
                percentage=args.mps_percentage, library=args.libcuda)])
    stages.append(_fixture_stage(args, machine))
    backend.close()
    report = render(title=f"Real-GPU check (`make gpu-check`), {utc_now():%Y-%m-%d}", facts=_facts(machine, args),
                    stages=stages)
    print(report)
    if args.report is not None:
        args.report.write_text(report)
    return exit_code(stages)


def _guarded(names: Sequence[str], run: Callable[[], list[StageResult]]) -> list[StageResult]:
    """A stage that meets an error of the driver or a tool fails with that error, not a traceback."""
    try:
        return run()
    except _STAGE_ERRORS as error:
        return [StageResult(name, FAIL, f"{type(error).__name__}: {error}") for name in names]


def _facts(machine: _Machine, args: argparse.Namespace) -> list[tuple[str, str]]:
    d = machine.device
    try:
        driver = machine.smi.version()
    except NvidiaSmiError as error:
        driver = f"unknown ({error})"
    return [
        ("GPU", f"{d.name} ({d.uuid}), {d.sm_count} SMs, {d.memory_mb} MiB, compute capability "
                f"{d.compute_capability[0]}.{d.compute_capability[1]}"),
        ("Driver", f"{driver} (CUDA {machine.cuda.driver_version()})"),
        ("Load", f"{args.mb} MiB, {args.sms or d.sm_count} blocks (one per SM), {args.rounds} rounds "
                 f"{args.interval:g} s apart"),
    ]


def _driver_stage(device: CudaDevice, gpu: GpuInfo | None) -> StageResult:
    if gpu is None:
        return StageResult("driver", FAIL, f"CUDA device {device.uuid} is not among NVML's devices (MIG mode?)")
    if gpu.sm_count != device.sm_count:
        return StageResult("driver", FAIL, f"NVML's SM count {gpu.sm_count} differs from CUDA's {device.sm_count}")
    return StageResult("driver", PASS, f"CUDA and NVML agree on {gpu.uuid}: {gpu.sm_count} SMs, {gpu.memory_mb} MiB")


def _load_stages(args: argparse.Namespace, machine: _Machine, backend: NvmlBackend, gpu: GpuInfo) -> list[StageResult]:
    cap_s = _READY_TIMEOUT_S + args.rounds * (args.interval + 5)  # ends itself if this process dies
    with LoadProcess(ordinal=args.device, mb=args.mb, sms=args.sms, seconds=cap_s, library=args.libcuda) as load:
        if not load.wait_ready(_READY_TIMEOUT_S):
            outcome = load.finish(10)
            return [StageResult("load", FAIL, outcome.describe()),
                    StageResult("nvml-vs-nvidia-smi", SKIP, "the load did not start")]
        backend.read(now=utc_now())  # consumes the samples from before the load
        started = time.monotonic()
        rounds, rows, notes = [], [], []
        for _ in range(args.rounds):
            time.sleep(args.interval)
            measured, row, said = _round(backend, machine.smi, gpu, load.pid, started, load.outcome.ready or {})
            rounds.append(measured)
            rows.append(row)
            notes += said
        load.stop()
        outcome = load.finish(30)
    compare = stage_from_checks("nvml-vs-nvidia-smi", judge(rounds, allocated_mb=args.mb), tables=[
        (f"The load (PID {load.pid}) as the NVML backend and nvidia-smi saw it", Table(_ROUND_HEADERS, tuple(rows)))])
    compare.notes += notes
    compare.notes.append("SM utilisation is a share of time with a kernel running, not of SMs: the agent's sm_used "
                         "(utilisation × SM count) counts every SM for a kernel on fewer of them.")
    return [stage_from_checks("load", _load_checks(outcome, gpu)), compare]


def _load_checks(outcome: LoadOutcome, gpu: GpuInfo) -> list[Check]:
    ready, done = outcome.ready or {}, outcome.done or {}
    return [
        Check("ran on the GPU checked", ready.get("gpu") == gpu.uuid, f"ready on {ready.get('gpu')}"),
        Check("ended normally", outcome.returncode == 0 and bool(done), outcome.describe()),
        Check("every block ran", int(done.get("min_block_iterations", 0)) > 0,
              f"fewest loop iterations of a block: {done.get('min_block_iterations')}"),
    ]


_ROUND_HEADERS = (
    "t (s)", "backend MiB", "nvidia-smi MiB", "backend SM %", "pmon SM %", "utilization.gpu %",
    "backend sm_used (SMs)", "SMs the load occupies",
)


def _round(  # noqa: PLR0917 - a private helper whose one caller passes its loop's state in order
    backend: NvmlBackend, smi: NvidiaSmi, gpu: GpuInfo, pid: int, started: float, ready: dict[str, Any]
) -> tuple[Round, tuple[str, ...], list[str]]:
    """One look: the backend's reading of ``pid``, then nvidia-smi's three views of it."""
    workload = PidAttributor().attribute(pid=pid)
    mine = [r for r in backend.read(now=utc_now()) if r.gpu == gpu.uuid and r.workload.key == workload.key]
    at_s = time.monotonic() - started
    notes: list[str] = []
    apps = _or_note(smi.compute_apps, notes) or []
    app = next((a for a in apps if a.pid == pid), None)
    gpus = _or_note(smi.gpus, notes) or []
    util = next((g.utilization_percent for g in gpus if g.uuid == gpu.uuid), None)
    pmon = _or_note(lambda: smi.pmon(gpu.uuid), notes) or []
    pmon_sm = next((p.sm_percent for p in pmon if p.pid == pid), None)
    mem = mine[0].mem_used_mb if mine else 0.0
    sm_used = mine[0].sm_used if mine else 0.0
    measured = Round(
        at_s=round(at_s, 1), backend_listed=bool(mine), backend_mem_mb=mem,
        backend_sm_percent=sm_used / gpu.sm_count * 100, backend_sm_used=sm_used, smi_listed=app is not None,
        smi_mem_mb=app.used_memory_mb if app else None, pmon_sm_percent=pmon_sm, gpu_util_percent=util,
    )
    occupied = min(int(ready.get("blocks", 0)), gpu.sm_count)
    row = (f"{at_s:.1f}", f"{mem:.0f}", _num(measured.smi_mem_mb), f"{measured.backend_sm_percent:.0f}",
           _num(pmon_sm), _num(util), f"{sm_used:.1f}", str(occupied))
    return measured, row, notes


def _or_note(call: Callable[[], Any], notes: list[str]) -> Any:
    try:
        return call()
    except NvidiaSmiError as error:
        notes.append(str(error))
        return None


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f}"


def _fixture_stage(args: argparse.Namespace, machine: _Machine) -> StageResult:
    if args.save_fixtures is None:
        return StageResult("fixtures", SKIP, "no --save-fixtures DIR")
    d = machine.device
    fixture = machine.recorder.fixture(
        captured_at=utc_now().isoformat(timespec="seconds"),
        cuda=machine.cuda.driver_version(),
        driver=_or_note(machine.smi.version, []),
        tool="python -m agents.gpu_check",
    )
    args.save_fixtures.mkdir(parents=True, exist_ok=True)
    path = args.save_fixtures / f"nvml-{re.sub(r'[^a-z0-9]+', '-', d.name.lower()).strip('-')}.json"
    path.write_text(json.dumps(fixture, indent=2, sort_keys=True) + "\n")
    devices = len(fixture["devices"])
    return StageResult("fixtures", PASS, f"wrote {path} ({devices} device(s)); FakeNvml.from_fixture reads it")
