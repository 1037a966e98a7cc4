"""``nvidia-smi``'s answers, parsed: the independent reading the NVML backend is held against.

``nvidia-smi`` reads the same driver through its own copy of NVML, and prints what it cannot
read as ``[N/A]`` or ``[Not Supported]`` (``[Insufficient Permissions]`` for memory of other
users' processes); those become ``None`` here, never 0, so a missing value is never mistaken
for an idle GPU. Values parse with or without ``nounits`` (``1536`` or ``1536 MiB``).
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "COMPUTE_APPS_QUERY",
    "GPU_QUERY",
    "ComputeApp",
    "GpuUtilisation",
    "NvidiaSmi",
    "NvidiaSmiError",
    "PmonRow",
    "parse_compute_apps",
    "parse_gpus",
    "parse_pmon",
    "parse_value",
]

COMPUTE_APPS_QUERY = "pid,gpu_uuid,used_memory"
GPU_QUERY = "uuid,utilization.gpu,memory.used,memory.total"
_UNITS = {"MiB": 1.0, "GiB": 1024.0, "KiB": 1 / 1024, "%": 1.0, "": 1.0}
_VALUE = re.compile(r"(-?[0-9]+(?:\.[0-9]+)?)\s*(MiB|GiB|KiB|%)?")


class NvidiaSmiError(RuntimeError):
    """``nvidia-smi`` is missing, failed, or printed something this parser does not know."""


@dataclass(frozen=True, slots=True)
class ComputeApp:
    pid: int
    gpu_uuid: str
    used_memory_mb: float | None  # MiB; None: [N/A] / [Not Supported] / withheld


@dataclass(frozen=True, slots=True)
class GpuUtilisation:
    uuid: str
    utilization_percent: float | None  # share of the last sample period with a kernel running
    memory_used_mb: float | None
    memory_total_mb: float | None


@dataclass(frozen=True, slots=True)
class PmonRow:
    gpu_index: int
    pid: int
    sm_percent: float | None  # None: "-", no sample for this process in the period
    command: str


def parse_value(text: str) -> float | None:
    """One CSV cell: a number with an optional MiB/GiB/KiB/% unit, in MiB or %; bracketed words are None."""
    cell = text.strip()
    if (cell.startswith("[") and cell.endswith("]")) or cell in ("", "-", "N/A"):
        return None
    match = _VALUE.fullmatch(cell)
    if match is None:
        raise NvidiaSmiError(f"not a number nvidia-smi prints: {cell!r}")
    return float(match.group(1)) * _UNITS[match.group(2) or ""]


def _rows(text: str, columns: int, query: str) -> list[list[str]]:
    rows = []
    for line in text.splitlines():
        if not line.strip() or line.startswith("No running"):
            continue  # older drivers print "No running processes found" for an empty list
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != columns:
            raise NvidiaSmiError(f"expected {columns} columns ({query}), got {line!r}")
        rows.append(cells)
    return rows


def parse_compute_apps(text: str) -> list[ComputeApp]:
    """``--query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader[,nounits]``."""
    return [
        ComputeApp(pid=int(pid), gpu_uuid=uuid, used_memory_mb=parse_value(memory))
        for pid, uuid, memory in _rows(text, 3, COMPUTE_APPS_QUERY)
    ]


def parse_gpus(text: str) -> list[GpuUtilisation]:
    """``--query-gpu=uuid,utilization.gpu,memory.used,memory.total --format=csv,noheader[,nounits]``."""
    return [
        GpuUtilisation(
            uuid=uuid,
            utilization_percent=parse_value(util),
            memory_used_mb=parse_value(used),
            memory_total_mb=parse_value(total),
        )
        for uuid, util, used, total in _rows(text, 4, GPU_QUERY)
    ]


def parse_pmon(text: str) -> list[PmonRow]:
    """``nvidia-smi pmon -c 1 -s u``: columns found by name in the first ``#`` line, since drivers
    add columns (``jpg``, ``ofa``) over time; ``command`` is last and may hold spaces."""
    header: list[str] | None = None
    rows = []
    for line in text.splitlines():
        if line.startswith("#"):
            header = header or line.lstrip("#").split()
            continue
        if not line.strip():
            continue
        if header is None or not {"gpu", "pid", "sm"} <= set(header):
            raise NvidiaSmiError(f"pmon printed a row before a header naming gpu, pid and sm: {line!r}")
        cells = line.split(maxsplit=len(header) - 1)
        if len(cells) < len(header) - 1:
            raise NvidiaSmiError(f"pmon row has {len(cells)} cells for {len(header)} columns: {line!r}")
        row = dict(zip(header, cells, strict=False))
        if row["pid"] == "-":
            continue  # a GPU with no process in this period
        rows.append(
            PmonRow(
                gpu_index=int(row["gpu"]),
                pid=int(row["pid"]),
                sm_percent=parse_value(row["sm"]),
                command=row.get("command", ""),
            )
        )
    return rows


class NvidiaSmi:
    """Runs ``nvidia-smi`` (``executable``: a path or a name on PATH) and parses its answers."""

    def __init__(self, executable: str = "nvidia-smi", *, timeout_s: float = 20.0) -> None:
        self.executable = executable
        self._timeout_s = timeout_s

    def compute_apps(self) -> list[ComputeApp]:
        return parse_compute_apps(self._run([f"--query-compute-apps={COMPUTE_APPS_QUERY}", "--format=csv,noheader,nounits"]))

    def gpus(self) -> list[GpuUtilisation]:
        return parse_gpus(self._run([f"--query-gpu={GPU_QUERY}", "--format=csv,noheader,nounits"]))

    def pmon(self, gpu_uuid: str) -> list[PmonRow]:
        """One pmon sample (about a second) of the GPU's processes' SM use."""
        return parse_pmon(self._run(["pmon", "-c", "1", "-s", "u", "-i", gpu_uuid]))

    def version(self) -> str:
        """The driver version, as nvidia-smi prints it."""
        return self._run(["--query-gpu=driver_version", "--format=csv,noheader"]).splitlines()[0].strip()

    def _run(self, args: Sequence[str]) -> str:
        return run_driver_tool([self.executable, *args], timeout_s=self._timeout_s, error=NvidiaSmiError)


def run_driver_tool(
    argv: Sequence[str],
    *,
    timeout_s: float,
    error: type[Exception],
    env: Mapping[str, str] | None = None,
    after_failure: Callable[[], str] = lambda: "",
) -> str:
    """Stdout of one of the driver's tools (nvidia-smi, nvidia-cuda-mps-control), or `error` saying
    what went wrong: not installed, no answer in time, or a non-zero exit with what it said (and
    `after_failure()`, e.g. the tail of the tool's own log)."""
    command = " ".join(argv)
    try:
        done = subprocess.run(  # noqa: S603 - the driver's own tool, no shell
            list(argv), env=None if env is None else dict(env), capture_output=True, text=True,
            timeout=timeout_s, check=False,
        )
    except FileNotFoundError:
        raise error(f"{argv[0]} not found (it comes with the NVIDIA driver)") from None
    except subprocess.TimeoutExpired:
        raise error(f"{command}: no answer within {timeout_s} s") from None
    if done.returncode != 0:
        said = (done.stderr.strip() or done.stdout.strip())[:300]
        raise error(f"{command} failed (exit {done.returncode}): {said} {after_failure()}".rstrip())
    return done.stdout
