"""The ``mps`` enforcer: grants become CUDA MPS limits through ``nvidia-cuda-mps-control``.

What MPS can and cannot do (NVIDIA, "Multi-Process Service", MPS v2 control
commands; ``docs/enforcement.md`` has the full account):

- Limits are per **MPS server**, and there is one server per Linux user id:
  ``set_active_thread_percentage <server PID> <pct>`` and
  ``set_device_pinned_mem_limit <server PID> <dev> <value>`` take the *server's*
  PID, not a client's.
- A client takes its server's limits **when it connects** (creates its CUDA
  context under MPS). "All clients created with that server afterwards will
  observe the new limit. Existing clients are not affected." Nothing in the
  control interface lowers or raises the SM share or pinned-memory limit of a
  client that is already running.
- ``set_default_active_thread_percentage`` and
  ``set_default_device_pinned_mem_limit`` only affect servers spawned later,
  and are lost when the control daemon quits.

So this enforcer keeps each workload's MPS server configured with the
workload's current grant, for the clients that connect next; running
processes are held to their grants by the ``watchdog`` enforcer. Each command
sent is an event (``mps.<command>``) whose detail names the running clients
that it does *not* affect.
"""

from __future__ import annotations

import logging
import math
import os
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from agents.clock import utc_now
from agents.events import EmitEvent, Event
from agents.interfaces import GpuInfo, Grant, Workload

__all__ = [
    "DEFAULT_CONTROL_COMMAND",
    "ClientPids",
    "MpsCommandError",
    "MpsControl",
    "MpsControlCli",
    "MpsDefaults",
    "MpsEnforcer",
    "active_thread_percentage",
    "pinned_mem_limit",
]

log = logging.getLogger(__name__)

DEFAULT_CONTROL_COMMAND: tuple[str, ...] = ("nvidia-cuda-mps-control",)

ClientPids = Callable[[Workload], Sequence[int]]
"""Host PIDs of a workload's GPU processes (the loop builds it from NVML processes + attribution)."""


class MpsCommandError(Exception):
    """The control daemon could not be reached, rejected a command, or answered unexpectedly."""


class MpsControl(Protocol):
    """One command line to the MPS control daemon, one reply back."""

    def send(self, command: str) -> str: ...


class MpsControlCli:
    """``MpsControl`` through the ``nvidia-cuda-mps-control`` front end, one process per command.

    This is the documented way to talk to a running daemon
    (``echo <command> | nvidia-cuda-mps-control``): the front end connects through
    ``CUDA_MPS_PIPE_DIRECTORY``, forwards each stdin line and prints the reply.
    One process per command keeps replies unambiguous (the interactive shell has
    no reply terminator). ``command`` is configurable so tests run the same code
    against ``python -m agents.fakes.mps``.
    """

    def __init__(
        self,
        *,
        command: Sequence[str] = DEFAULT_CONTROL_COMMAND,
        pipe_directory: Path | str | None = None,
        timeout_s: float = 5.0,
    ) -> None:
        if not command:
            raise ValueError("command must name the control executable")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        self._command = tuple(command)
        self._env = dict(os.environ)
        if pipe_directory is not None:
            self._env["CUDA_MPS_PIPE_DIRECTORY"] = str(pipe_directory)
        self._timeout_s = timeout_s

    def send(self, command: str) -> str:
        if not command or command != command.strip() or "\n" in command or "\r" in command:
            raise ValueError(f"an MPS command is one non-blank line without outer spaces, got {command!r}")
        try:
            done = subprocess.run(  # noqa: S603 - fixed executable from configuration, no shell
                self._command,
                input=command + "\n",
                capture_output=True,
                text=True,
                env=self._env,
                timeout=self._timeout_s,
                check=False,
            )
        except FileNotFoundError:
            raise MpsCommandError(
                f"{self._command[0]} not found: install the NVIDIA driver utilities or use --enforcer watchdog/dry-run"
            ) from None
        except subprocess.TimeoutExpired:
            raise MpsCommandError(
                f"{command!r}: no reply within {self._timeout_s} s (is the daemon running?)"
            ) from None
        if done.returncode != 0:
            said = (done.stderr.strip() or done.stdout.strip())[:500]
            raise MpsCommandError(f"{command!r} failed (exit {done.returncode}): {said}")
        return done.stdout.strip()


def active_thread_percentage(sm: float, sm_count: int) -> int:
    """SM share -> MPS active thread percentage: rounded up so the grant fits, within 1..100."""
    if sm_count <= 0:
        raise ValueError(f"sm_count must be > 0, got {sm_count}")
    if not math.isfinite(sm) or sm < 0:
        raise ValueError(f"sm must be finite and >= 0, got {sm!r}")
    # 1e-9 absorbs float noise (e.g. 27.000000000000004 SMs of 108 is 25 %, not 26 %).
    return max(1, min(100, math.ceil(sm / sm_count * 100 - 1e-9)))


def pinned_mem_limit(mem_mb: float) -> str:
    """Memory grant in MiB -> the control daemon's value syntax (integer + ``M``), rounded up, >= 1M."""
    if not math.isfinite(mem_mb) or mem_mb < 0:
        raise ValueError(f"mem_mb must be finite and >= 0, got {mem_mb!r}")
    return f"{max(1, math.ceil(mem_mb - 1e-9))}M"


@dataclass(frozen=True, slots=True)
class MpsDefaults:
    """Limits for servers the daemon spawns later (a user id with no server yet)."""

    active_thread_percentage: int = 100  # MPS's own default
    pinned_mem_mb: int | None = None  # per client on every GPU (capped at the card); None: no limit

    def __post_init__(self) -> None:
        if not 1 <= self.active_thread_percentage <= 100:
            raise ValueError(f"active_thread_percentage must be in 1..100, got {self.active_thread_percentage}")
        if self.pinned_mem_mb is not None and self.pinned_mem_mb < 1:
            raise ValueError(f"pinned_mem_mb must be >= 1 or None, got {self.pinned_mem_mb}")


@dataclass(frozen=True, slots=True)
class _Command:
    key: tuple[str, ...]  # what the command configures; its value is remembered under this key
    line: str
    target: str
    detail: Mapping[str, Any]


class MpsEnforcer:
    """``Enforcer`` that keeps MPS limits in line with grants; sends only what changed.

    Per tick: the defaults (once, and again after ``forget``); then the daemon's
    server -> client map (``get_server_list``, ``get_client_list``); then, per
    server that serves a granted workload, its active thread percentage and its
    pinned-memory limit on each granted GPU. A server shared by several
    workloads (same user id) gets the largest of their grants, so that none is
    capped below its grant; the ``mps.shared_server`` event says so.
    A command that fails is reported once (``mps.command_failed``) and retried
    on later ticks.
    """

    def __init__(
        self,
        *,
        control: MpsControl,
        gpus: Sequence[GpuInfo],
        client_pids: ClientPids,
        emit: EmitEvent,
        defaults: MpsDefaults | None = None,
        now: Callable[[], datetime] = utc_now,
    ) -> None:
        self._control = control
        self._gpus = {g.uuid: g for g in gpus}
        self._client_pids = client_pids
        self._emit = emit
        self._defaults = defaults if defaults is not None else MpsDefaults()
        self._now = now
        self._sent: dict[tuple[str, ...], str] = {}  # command key -> the value in force
        self._failed: dict[tuple[str, ...], str] = {}  # command key -> the line whose failure was reported
        self._shared: dict[int, tuple[str, ...]] = {}  # server PID -> workloads reported as sharing it
        self._unmanaged: set[tuple[str, int]] = set()  # (workload key, pid) not an MPS client, last tick

    def forget(self) -> None:
        """Resend everything on the next ``apply`` (e.g. after the control daemon restarted)."""
        self._sent.clear()
        self._failed.clear()

    def apply(self, grants: Sequence[Grant]) -> None:  # noqa: PLR0912 - the control daemon's commands, in the order it needs them
        for command in self._default_commands():
            self._send_if_changed(command)
        if not grants:
            return
        try:
            clients_of = self._clients_by_server()
        except MpsCommandError as error:
            self._report_failure(("topology",), "get_server_list", "mps-control", error)
            return
        self._failed.pop(("topology",), None)
        server_of = {pid: server for server, pids in clients_of.items() for pid in pids}
        unmanaged: set[tuple[str, int]] = set()
        pids_of: dict[str, list[int]] = {}  # one lookup per workload, however many GPUs it uses
        by_server: dict[int, dict[str, list[Grant]]] = {}
        for grant in grants:
            if grant.gpu not in self._gpus:
                raise ValueError(f"grant for unknown GPU {grant.gpu!r} (known: {', '.join(sorted(self._gpus))})")
            if grant.workload.key not in pids_of:
                pids_of[grant.workload.key] = sorted(set(self._client_pids(grant.workload)))
            for pid in pids_of[grant.workload.key]:
                server = server_of.get(pid)
                if server is None:
                    unmanaged.add((grant.workload.key, pid))
                    continue
                by_server.setdefault(server, {}).setdefault(grant.workload.key, []).append(grant)
        for workload_key, pid in sorted(unmanaged - self._unmanaged):
            self._report_unmanaged(workload_key, pid)
        self._unmanaged = unmanaged  # reported once while it lasts; PIDs are recycled
        for server, workloads in sorted(by_server.items()):
            self._report_sharing(server, workloads)
            for command in self._server_commands(server, workloads, running=clients_of[server]):
                self._send_if_changed(command)
        live = {str(s) for s in clients_of}
        for key in [k for k in self._sent if k[0] == "server" and k[1] not in live]:
            del self._sent[key]  # a server that exited; a new one with the same PID starts from defaults
        for server in [s for s in self._shared if s not in clients_of]:
            del self._shared[server]

    def _default_commands(self) -> list[_Command]:
        pct = self._defaults.active_thread_percentage
        commands = [
            _Command(
                key=("default", "active_thread_percentage"),
                line=f"set_default_active_thread_percentage {pct}",
                target="mps-control",
                detail={"percentage": pct, "applies_to": "MPS servers spawned after this command"},
            )
        ]
        if self._defaults.pinned_mem_mb is not None:
            for uuid, gpu in sorted(self._gpus.items()):
                value = pinned_mem_limit(min(self._defaults.pinned_mem_mb, gpu.memory_mb))
                commands.append(
                    _Command(
                        key=("default", "pinned_mem", uuid),
                        line=f"set_default_device_pinned_mem_limit {uuid} {value}",
                        target=f"gpu/{uuid}",
                        detail={
                            "gpu": uuid,
                            "limit": value,
                            "applies_to": "clients of MPS servers spawned after this command",
                        },
                    )
                )
        return commands

    def _server_commands(
        self, server: int, workloads: Mapping[str, list[Grant]], *, running: Sequence[int]
    ) -> list[_Command]:
        percentage = max(
            active_thread_percentage(g.sm, self._gpus[g.gpu].sm_count) for gs in workloads.values() for g in gs
        )
        common = {
            "server_pid": server,
            "workloads": sorted(workloads),
            "running_clients_unaffected": sorted(running),
            "applies_to": "clients that connect to this server after this command",
        }
        commands = [
            _Command(
                key=("server", str(server), "active_thread_percentage"),
                line=f"set_active_thread_percentage {server} {percentage}",
                target=f"mps-server/{server}",
                detail={**common, "percentage": percentage},
            )
        ]
        mem_by_gpu: dict[str, float] = {}
        for gs in workloads.values():
            for g in gs:
                mem_by_gpu[g.gpu] = max(mem_by_gpu.get(g.gpu, 0.0), g.mem_mb)
        for uuid, mem_mb in sorted(mem_by_gpu.items()):
            value = pinned_mem_limit(min(mem_mb, self._gpus[uuid].memory_mb))
            commands.append(
                _Command(
                    key=("server", str(server), "pinned_mem", uuid),
                    line=f"set_device_pinned_mem_limit {server} {uuid} {value}",
                    target=f"mps-server/{server}",
                    detail={**common, "gpu": uuid, "limit": value},
                )
            )
        return commands

    def _clients_by_server(self) -> dict[int, list[int]]:
        servers = _pids(self._control.send("get_server_list"), "get_server_list")
        return {s: _pids(self._control.send(f"get_client_list {s}"), f"get_client_list {s}") for s in servers}

    def _send_if_changed(self, command: _Command) -> None:
        if self._sent.get(command.key) == command.line:
            return
        try:
            reply = self._control.send(command.line)
        except MpsCommandError as error:
            self._sent.pop(command.key, None)
            self._report_failure(command.key, command.line, command.target, error)
            return
        self._sent[command.key] = command.line
        self._failed.pop(command.key, None)
        name = command.line.split(" ", 1)[0]
        log.info("event=mps_command command=%r reply=%r", command.line, reply)
        self._emit(
            Event(
                at=self._now(),
                action=f"mps.{name}",
                target=command.target,
                detail={**command.detail, "command": command.line, "reply": reply[:500]},
            )
        )

    def _report_failure(self, key: tuple[str, ...], line: str, target: str, error: MpsCommandError) -> None:
        log.warning("event=mps_command_failed command=%r error=%r", line, str(error))
        if self._failed.get(key) == line:
            return  # reported already; retried quietly every tick
        self._failed[key] = line
        self._emit(
            Event(
                at=self._now(),
                action="mps.command_failed",
                target=target,
                detail={"command": line, "error": str(error)[:500], "retry": "every tick until it succeeds"},
            )
        )

    def _report_sharing(self, server: int, workloads: Mapping[str, list[Grant]]) -> None:
        names = tuple(sorted(workloads))
        if len(names) < 2 or self._shared.get(server) == names:
            return
        self._shared[server] = names
        log.warning("event=mps_shared_server server_pid=%d workloads=%s", server, ",".join(names))
        self._emit(
            Event(
                at=self._now(),
                action="mps.shared_server",
                target=f"mps-server/{server}",
                detail={
                    "server_pid": server,
                    "workloads": list(names),
                    "effect": "MPS limits are per server (one per user id): the largest grant applies to all",
                },
            )
        )

    def _report_unmanaged(self, workload_key: str, pid: int) -> None:
        log.warning("event=mps_unmanaged_process workload=%s pid=%d", workload_key, pid)
        self._emit(
            Event(
                at=self._now(),
                action="mps.unmanaged_process",
                target=workload_key,
                detail={"pid": pid, "effect": "not an MPS client: no MPS limit applies to it"},
            )
        )


def _pids(reply: str, command: str) -> list[int]:
    words = reply.split()
    if not all(w.isdigit() for w in words):
        raise MpsCommandError(f"{command!r}: expected PIDs, got {reply[:200]!r}")
    return [int(w) for w in words]
