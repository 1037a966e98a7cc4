"""A private MPS control daemon, the agent's mps enforcer against it, and clients held to its limit.

The daemon gets its own ``CUDA_MPS_PIPE_DIRECTORY`` and ``CUDA_MPS_LOG_DIRECTORY`` (a fresh
temporary directory), so it neither meets nor disturbs a daemon the node already runs, and
its clients are only the load processes started here with that environment. Whatever
happens, it is told to ``quit``; processes still carrying its pipe directory in their
environment afterwards (the control daemon, its MPS servers) are stopped by PID, and the
directory is removed.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path

from agents.attribution import PidAttributor
from agents.clock import utc_now
from agents.events import Event
from agents.gpu_check.compare import Check
from agents.gpu_check.load import LoadOutcome, LoadProcess
from agents.gpu_check.report import SKIP, StageResult, Table, stage_from_checks
from agents.gpu_check.smi import run_driver_tool
from agents.interfaces import GpuInfo, Grant
from agents.mps import MpsCommandError, MpsControl, MpsControlCli, MpsDefaults, MpsEnforcer

__all__ = [
    "LOG_ENV",
    "PIPE_ENV",
    "EnforcerProbe",
    "MpsStartError",
    "PrivateMpsDaemon",
    "processes_with_environment",
    "run_mps_stage",
    "stop_processes",
]

PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
LOG_ENV = "CUDA_MPS_LOG_DIRECTORY"
OUT_OF_MEMORY = "CUDA_ERROR_OUT_OF_MEMORY"


class MpsStartError(RuntimeError):
    """The control daemon did not start; the message carries its output and log."""


def processes_with_environment(key: str, value: str) -> list[int]:
    """PIDs whose environment holds ``key=value`` (only this user's processes are readable)."""
    wanted = f"{key}={value}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue  # another user's process, or one that just exited
        if wanted in environ.split(b"\0"):
            found.append(int(entry.name))
    return sorted(found)


def stop_processes(pids: Sequence[int], *, grace_s: float) -> list[str]:
    """SIGTERM each PID, SIGKILL what is left after ``grace_s``; says what it did."""
    notes = []
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
            notes.append(f"sent SIGTERM to {pid}")
        except ProcessLookupError:
            continue
    deadline = time.monotonic() + grace_s
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [pid for pid in alive if _alive(pid)]
    for pid in alive:
        try:
            os.kill(pid, signal.SIGKILL)
            notes.append(f"sent SIGKILL to {pid}")
        except ProcessLookupError:
            continue
    return notes


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by its parent) is gone for our purposes
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


class PrivateMpsDaemon:
    """``<control> -d`` with a private pipe and log directory; ``close()`` always cleans up."""

    def __init__(self, *, control: Sequence[str], timeout_s: float = 10.0) -> None:
        self._control = tuple(control)
        self._timeout_s = timeout_s
        self._root = Path(tempfile.mkdtemp(prefix="vgl-mps-"))
        self.pipe_directory = self._root / "pipe"
        self.log_directory = self._root / "log"
        self.env = {PIPE_ENV: str(self.pipe_directory), LOG_ENV: str(self.log_directory)}

    def start(self) -> None:
        self.pipe_directory.mkdir()
        self.log_directory.mkdir()
        run_driver_tool([*self._control, "-d"], env={**os.environ, **self.env}, timeout_s=self._timeout_s,
                        error=MpsStartError, after_failure=self.log_tail)

    def control(self) -> MpsControlCli:
        return MpsControlCli(command=self._control, pipe_directory=self.pipe_directory, timeout_s=self._timeout_s)

    def log_tail(self, lines: int = 5) -> str:
        """The last lines of the daemon's control.log (where it says why it refused something)."""
        try:
            text = (self.log_directory / "control.log").read_text(errors="replace")
        except OSError:
            return ""
        return " / ".join(text.strip().splitlines()[-lines:])

    def close(self) -> list[str]:
        """``quit``, wait for its processes to go, stop stragglers by PID, remove the directory."""
        notes = []
        try:
            self.control().send("quit")
            notes.append("quit accepted")
        except MpsCommandError as error:
            notes.append(f"quit failed: {error}")
        deadline = time.monotonic() + self._timeout_s
        left = processes_with_environment(PIPE_ENV, str(self.pipe_directory))
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = [pid for pid in processes_with_environment(PIPE_ENV, str(self.pipe_directory)) if _alive(pid)]
        if left:
            notes.append(f"still running after quit: {left}")
            notes += stop_processes(left, grace_s=3.0)
        shutil.rmtree(self._root, ignore_errors=True)
        return notes


class EnforcerProbe:
    """The agent's ``MpsEnforcer`` against a daemon, with each command's reply kept and read back."""

    def __init__(
        self,
        *,
        control: MpsControl,
        gpu: GpuInfo,
        limit_mb: int,
        percentage: int,
        now: Callable[[], datetime] = utc_now,
    ) -> None:
        self._control = control
        self._gpu = gpu
        self._limit_mb = limit_mb
        self._percentage = percentage
        self.events: list[Event] = []
        self._pids: dict[str, list[int]] = {}
        self.rows: list[tuple[str, str, str]] = []  # (command, reply or error, result)
        self._enforcer = MpsEnforcer(
            control=control,
            gpus=[gpu],
            client_pids=lambda w: self._pids.get(w.key, []),
            emit=self._record,
            defaults=MpsDefaults(active_thread_percentage=percentage, pinned_mem_mb=limit_mb),
            now=now,
        )

    def _record(self, event: Event) -> None:
        self.events.append(event)
        if event.action == "mps.command_failed":
            self.rows.append((str(event.detail["command"]), str(event.detail["error"]), "refused"))
        elif "command" in event.detail:
            self.rows.append((str(event.detail["command"]), str(event.detail["reply"]) or "(empty)", "accepted"))
        else:
            self.rows.append((event.action, str(event.detail.get("effect", "")), "reported"))

    def send_defaults(self, *, ordinal: int) -> None:
        """The enforcer's defaults (the GPU named by UUID); the documented ordinal form if that is refused."""
        self._enforcer.apply([])
        if any(e.action == "mps.command_failed" for e in self.events):
            self.send(f"set_default_device_pinned_mem_limit {ordinal} {self._limit_mb}M")
        self.read_back("get_default_active_thread_percentage", float(self._percentage))

    def grant(self, pid: int) -> None:
        """A grant for the client ``pid`` (at the limit and the percentage): the server's commands."""
        workload = PidAttributor().attribute(pid=pid)
        self._pids[workload.key] = [pid]
        sm = self._percentage / 100 * self._gpu.sm_count
        self._enforcer.apply([Grant(workload=workload, gpu=self._gpu.uuid, mem_mb=float(self._limit_mb), sm=sm)])
        for server in self.servers_of(pid):
            self.read_back(f"get_active_thread_percentage {server}", float(self._percentage))
            self.read_back(f"get_device_pinned_mem_limit {server} {self._gpu.uuid}", f"{self._limit_mb}M")

    def servers_of(self, pid: int) -> list[int]:
        return [
            int(s.detail["server_pid"])
            for s in self.events
            if s.action == "mps.set_active_thread_percentage" and pid in self._pids_of(s)
        ]

    def _pids_of(self, event: Event) -> list[int]:
        return [p for key in event.detail.get("workloads", []) for p in self._pids.get(str(key), [])]

    def send(self, line: str) -> str | None:
        try:
            reply = self._control.send(line)
        except MpsCommandError as error:
            self.rows.append((line, str(error), "refused"))
            return None
        self.rows.append((line, reply or "(empty)", "accepted"))
        return reply

    def read_back(self, line: str, expected: float | str) -> None:
        reply = self.send(line)
        if reply is None:
            return
        matches = _same(reply, expected)
        self.rows[-1] = (line, reply, "matches" if matches else f"expected {expected}")

    def checks(self) -> list[Check]:
        refused = [c for c, _, r in self.rows if r == "refused"]
        mismatched = [c for c, _, r in self.rows if r.startswith("expected")]
        unmanaged = [e for e in self.events if e.action == "mps.unmanaged_process"]
        return [
            Check("enforcer commands accepted", not refused, "refused: " + "; ".join(refused) if refused else
                  f"{sum(1 for _, _, r in self.rows if r == 'accepted')} accepted"),
            Check("limits read back as set", not mismatched, "differ: " + "; ".join(mismatched) if mismatched else
                  f"{sum(1 for _, _, r in self.rows if r == 'matches')} read-backs match"),
            Check("client found under its MPS server", not unmanaged,
                  "the enforcer saw the load as no MPS client" if unmanaged else "get_client_list named the load"),
        ]

    def table(self) -> Table:
        return Table(("command", "reply", "result"), tuple(self.rows))


def _same(reply: str, expected: float | str) -> bool:
    if isinstance(expected, str):
        return reply.strip() == expected
    try:
        return abs(float(reply.strip()) - expected) < 0.05
    except ValueError:
        return False


def _client_checks(under: LoadOutcome, over: LoadOutcome, *, limit_mb: int) -> list[Check]:
    over_error = (over.error or {}).get("error")
    return [
        Check(f"a client under the {limit_mb} MiB limit runs", under.returncode == 0 and under.done is not None,
              under.describe()),
        Check(f"a client over the {limit_mb} MiB limit gets {OUT_OF_MEMORY}", over_error == OUT_OF_MEMORY,
              over.describe()),
    ]


def run_mps_stage(
    *,
    control: Sequence[str],
    gpu: GpuInfo,
    ordinal: int,
    limit_mb: int,
    percentage: int,
    library: str,
    timeout_s: float = 60.0,
) -> StageResult:
    """The whole MPS stage; a missing ``control`` executable is a skip, not a failure."""
    if shutil.which(control[0]) is None:
        return StageResult("mps", SKIP, f"{control[0]} not found: the MPS control daemon is not installed")
    daemon = PrivateMpsDaemon(control=control)
    checks: list[Check] = []
    probe: EnforcerProbe | None = None
    try:
        daemon.start()
        checks.append(Check("private control daemon started", True, f"pipe and log under {daemon.pipe_directory.parent}"))
        probe = EnforcerProbe(control=daemon.control(), gpu=gpu, limit_mb=limit_mb, percentage=percentage)
        probe.send_defaults(ordinal=ordinal)
        under = _client(daemon, probe, ordinal=ordinal, mb=limit_mb // 2, library=library, timeout_s=timeout_s)
        over = LoadProcess(ordinal=ordinal, mb=limit_mb * 2, seconds=1, library=library, env=daemon.env)
        with over:
            over_outcome = over.finish(timeout_s)
        checks += _client_checks(under, over_outcome, limit_mb=limit_mb)
        checks += probe.checks()
    except MpsStartError as error:
        checks.append(Check("private control daemon started", False, str(error)))
    finally:
        shutdown = daemon.close()
    checks.append(Check("daemon quit and cleaned up", shutdown == ["quit accepted"], "; ".join(shutdown)))
    tables = [("Commands sent to the private daemon", probe.table())] if probe is not None else []
    return stage_from_checks("mps", checks, tables=tables)


def _client(
    daemon: PrivateMpsDaemon, probe: EnforcerProbe, *, ordinal: int, mb: int, library: str, timeout_s: float
) -> LoadOutcome:
    """A client under the limit, granted by the enforcer while it runs (its server then exists)."""
    with LoadProcess(ordinal=ordinal, mb=mb, seconds=timeout_s, library=library, env=daemon.env) as load:
        if load.wait_ready(timeout_s):
            probe.grant(load.pid)
        load.stop()
        return load.finish(timeout_s)
