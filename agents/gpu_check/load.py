"""The load generator as a process of its own (``python -m agents.gpu_check load``) and its parent's handle.

The load prints one JSON object per line on stdout, so its parent learns when to look and
what happened without parsing prose:

- ``{"event": "ready", "pid", "gpu", "mb", "blocks", "sm_count"}``: memory held, first kernel queued;
- ``{"event": "done", "allocated_mb", "blocks", "launches", "seconds", "min_block_iterations"}``;
- ``{"event": "error", "call", "error", "text"}``: a driver call failed (``error`` is the driver's
  name, e.g. ``CUDA_ERROR_OUT_OF_MEMORY``), or ``"error": "no-driver"`` without one.

SIGTERM ends the load after the current kernel slice, as a normal ``done``.
"""

from __future__ import annotations

import ctypes
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from agents.cuda_driver import DEFAULT_LIBRARY, CudaDriver, CudaError, CudaUnavailable

__all__ = ["EXIT_CUDA_ERROR", "EXIT_NO_DRIVER", "LoadOutcome", "LoadProcess", "run_load"]

EXIT_NO_DRIVER = 3
EXIT_CUDA_ERROR = 4


def _say(record: Mapping[str, Any]) -> None:
    print(json.dumps(record, sort_keys=True), flush=True)


def run_load(
    *,
    library: str = DEFAULT_LIBRARY,
    ordinal: int,
    mb: int,
    sms: int | None,
    seconds: float,
    loader: Callable[[str], Any] = ctypes.CDLL,
) -> int:
    """The ``load`` subcommand: hold ``mb`` MiB and keep ``sms`` SMs (default: all) busy.

    ``loader`` opens the driver library (``agents.fakes.cuda_driver.FakeLibcuda`` in tests)."""
    stop = threading.Event()

    def on_term(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        cuda = CudaDriver(library, loader=loader)
        cuda.init()
        device = cuda.device(ordinal)
        blocks = sms if sms is not None else device.sm_count
        result = cuda.run_load(
            ordinal=ordinal,
            mb=mb,
            blocks=blocks,
            seconds=seconds,
            on_ready=lambda: _say(
                {"event": "ready", "pid": os.getpid(), "gpu": device.uuid, "mb": mb, "blocks": blocks,
                 "sm_count": device.sm_count}
            ),
            should_stop=stop.is_set,
        )
    except CudaUnavailable as error:
        _say({"event": "error", "call": "dlopen", "error": "no-driver", "text": str(error)})
        print(f"gpu-check load: {error}", file=sys.stderr)
        return EXIT_NO_DRIVER
    except CudaError as error:
        _say({"event": "error", "call": error.call, "error": error.name, "text": error.text})
        print(f"gpu-check load: {error}", file=sys.stderr)
        return EXIT_CUDA_ERROR
    finally:
        signal.signal(signal.SIGTERM, previous)
    _say({"event": "done", "allocated_mb": result.allocated_mb, "blocks": result.blocks, "launches": result.launches,
          "seconds": result.seconds, "min_block_iterations": result.min_block_iterations})
    return 0


@dataclass
class LoadOutcome:
    """What a load process said and how it ended."""

    returncode: int | None = None  # None: still running, or killed by us after a timeout
    ready: dict[str, Any] | None = None
    done: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    stderr: str = ""
    killed: bool = False
    unparsed: list[str] = field(default_factory=list)  # stdout lines that were not JSON records

    def describe(self) -> str:
        if self.error is not None:
            return f"{self.error.get('call')}: {self.error.get('error')}: {self.error.get('text')}"
        if self.killed:
            return "killed after a timeout"
        if self.done is not None:
            return (f"held {self.done['allocated_mb']} MiB, {self.done['launches']} launches of "
                    f"{self.done['blocks']} blocks in {self.done['seconds']} s")
        return f"exit {self.returncode}: {self.stderr.strip()[-300:] or 'no output'}"


class LoadProcess:
    """``python -m agents.gpu_check load …`` as a child, read line by line; killed if it outstays."""

    def __init__(
        self,
        *,
        ordinal: int,
        mb: int,
        sms: int | None = None,
        seconds: float,
        library: str = DEFAULT_LIBRARY,
        env: Mapping[str, str] | None = None,
    ) -> None:
        argv = [sys.executable, "-m", "agents.gpu_check", "load", "--device", str(ordinal), "--mb", str(mb),
                "--seconds", str(seconds), "--libcuda", library]
        if sms is not None:
            argv += ["--sms", str(sms)]
        self._stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - closed in finish()
        self._process = subprocess.Popen(  # noqa: S603 - this interpreter running this package
            argv, stdout=subprocess.PIPE, stderr=self._stderr, text=True, env={**os.environ, **(env or {})}
        )
        self.pid = self._process.pid
        self.outcome = LoadOutcome()
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, name=f"load-{self.pid}", daemon=True).start()

    def _pump(self) -> None:
        assert self._process.stdout is not None  # noqa: S101 - stdout=PIPE above
        for line in self._process.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def _take(self, record: dict[str, Any]) -> None:
        event = record.get("event")
        if event in ("ready", "done", "error"):
            setattr(self.outcome, str(event), record)

    def _read_until(self, deadline: float, *, stop_at_ready: bool) -> bool:
        """Read records until ``ready`` (when asked) or the end of output; False on timeout."""
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return False
            if line is None:
                self._lines.put(None)  # the end stays visible to a later read
                return True
            try:
                self._take(json.loads(line))
            except (json.JSONDecodeError, AttributeError):
                self.outcome.unparsed.append(line.rstrip())
            if stop_at_ready and self.outcome.ready is not None:
                return True

    def wait_ready(self, timeout_s: float) -> bool:
        """True once the load holds its memory and runs; False if it failed or stayed silent."""
        self._read_until(time.monotonic() + timeout_s, stop_at_ready=True)
        return self.outcome.ready is not None

    def stop(self) -> None:
        """Ask the load to end after its current kernel slice."""
        if self._process.poll() is None:
            self._process.send_signal(signal.SIGTERM)

    def finish(self, timeout_s: float) -> LoadOutcome:
        """Wait for the end (killing the process after ``timeout_s``) and return what it said."""
        if not self._read_until(time.monotonic() + timeout_s, stop_at_ready=False):
            self._process.kill()
            self.outcome.killed = True
        try:
            self.outcome.returncode = self._process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self.outcome.killed = True
            self.outcome.returncode = self._process.wait()
        self._stderr.seek(0)
        self.outcome.stderr = self._stderr.read()
        self._stderr.close()
        return self.outcome

    def __enter__(self) -> LoadProcess:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._process.poll() is None:
            self._process.kill()
            self._process.wait()
