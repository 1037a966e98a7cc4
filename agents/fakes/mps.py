"""A fake MPS control daemon over real OS pipes, shipped with the code (docs/design.md, House rules).

Two halves, like the real thing:

- ``FakeMpsControlDaemon`` runs in the test process. It owns a FIFO named
  ``control`` in its pipe directory (the real daemon's ``CUDA_MPS_PIPE_DIRECTORY``),
  reads command lines from it in a thread, parses them with the documented
  grammar (strictly: unknown commands and malformed or out-of-range arguments
  are error replies) and keeps the state a test inspects: the defaults, one
  server per user id with its limits, and the clients with the limits they
  took **when they connected** (``connect_client``), which later commands do
  not change.
- ``python -m agents.fakes.mps [--pipe DIR]`` is the front end, a stand-in
  for ``nvidia-cuda-mps-control`` without ``-d``: it reads commands from stdin,
  one per line, forwards each through the pipe directory (default
  ``$CUDA_MPS_PIPE_DIRECTORY``, else ``/tmp/nvidia-mps``), prints replies on
  stdout, errors on stderr, and exits 1 if any command failed. So
  ``MpsControlCli(command=(python, "-m", "agents.fakes.mps"), pipe_directory=DIR)``
  runs exactly the code path that drives the real daemon.

Wire format inside the pipe directory: a request is one line
``<reply FIFO name>\\t<command>\\n`` (shorter than ``PIPE_BUF``, so concurrent
front ends never interleave); the reply FIFO receives ``ok\\n<text>`` or
``error\\n<text>`` and is closed.

Reply texts: ``set_*active_thread_percentage`` and the ``get_`` counterparts
print the percentage with one decimal (``25.0``), as the real daemon does;
``get_server_list`` and ``get_client_list`` print one PID per line; pinned
memory limits print as set (``2048M``), ``0`` when none is set.
"""

from __future__ import annotations

import argparse
import errno
import itertools
import os
import re
import select
import stat
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

__all__ = ["FakeMpsClient", "FakeMpsControlDaemon", "FakeMpsServer", "MpsGrammarError", "PipeMpsControl", "main"]

CONTROL_FIFO = "control"
_SERVER_PIDS_START = 40_000  # fake servers are not processes; their PIDs only need to be distinct
_MAX_REQUEST = 4096  # PIPE_BUF on Linux: a write this short is atomic
_PID = re.compile(r"[1-9][0-9]{0,9}")
_PERCENTAGE = re.compile(r"[0-9]{1,3}(\.[0-9]+)?")
_DEVICE = re.compile(r"[0-9]{1,3}|(GPU|MIG)-[0-9A-Za-z/-]+")
_MEM_VALUE = re.compile(r"([1-9][0-9]{0,9})([MG])")


class MpsGrammarError(ValueError):
    """A command the real daemon would refuse; its message is the error reply."""


@dataclass
class FakeMpsClient:
    pid: int
    server_pid: int
    active_thread_percentage: float  # frozen at connection
    pinned_mem_limits: dict[str, str]  # device -> value, frozen at connection


@dataclass
class FakeMpsServer:
    pid: int
    uid: int
    active_thread_percentage: float  # for clients that connect from now on
    pinned_mem_limits: dict[str, str]  # device -> value, for clients that connect from now on
    clients: dict[int, FakeMpsClient] = field(default_factory=dict)


class FakeMpsControlDaemon:
    """The control daemon's state machine behind a FIFO in ``pipe_directory``; a context manager."""

    def __init__(self, pipe_directory: Path | str) -> None:
        self.pipe_directory = Path(pipe_directory)
        self.default_active_thread_percentage = 100.0
        self.default_pinned_mem_limits: dict[str, str] = {}
        self.servers: dict[int, FakeMpsServer] = {}
        self.commands: list[str] = []  # every command received through the pipe, in order
        self._server_pids = itertools.count(_SERVER_PIDS_START)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._read_fd = -1
        self._keep_fd = -1  # a writer of our own: readers see no EOF between front ends
        self._stopping = threading.Event()
        self.quit_received = threading.Event()

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> FakeMpsControlDaemon:
        self.pipe_directory.mkdir(parents=True, exist_ok=True)
        fifo = self.pipe_directory / CONTROL_FIFO
        if fifo.exists() and not stat.S_ISFIFO(fifo.stat().st_mode):
            raise FileExistsError(f"{fifo} exists and is not a FIFO")
        if not fifo.exists():
            os.mkfifo(fifo, 0o600)
        self._read_fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        self._keep_fd = os.open(fifo, os.O_WRONLY)
        self._thread = threading.Thread(target=self._serve, name="fake-mps-control", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            os.write(self._keep_fd, b"\n")  # wake the reader
            self._thread.join(timeout=5)
            self._thread = None
        for fd in (self._read_fd, self._keep_fd):
            if fd >= 0:
                os.close(fd)
        self._read_fd = self._keep_fd = -1
        (self.pipe_directory / CONTROL_FIFO).unlink(missing_ok=True)

    def __enter__(self) -> FakeMpsControlDaemon:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def control(self) -> PipeMpsControl:
        """An ``MpsControl`` that speaks the front end's wire protocol from this process: the same
        pipe and parser without a process per command (``MpsControlCli`` tests cover that path)."""
        return PipeMpsControl(self.pipe_directory)

    # -- what CUDA clients do (test side) ------------------------------------------------------

    def connect_client(self, pid: int, *, uid: int = 1000) -> int:
        """A CUDA process connects: its user's server (spawned with the defaults if none) serves
        it, and it takes that server's current limits. Returns the server PID."""
        with self._lock:
            server = next((s for s in self.servers.values() if s.uid == uid), None)
            if server is None:
                server = FakeMpsServer(
                    pid=next(self._server_pids),
                    uid=uid,
                    active_thread_percentage=self.default_active_thread_percentage,
                    pinned_mem_limits=dict(self.default_pinned_mem_limits),
                )
                self.servers[server.pid] = server
            if any(pid in s.clients for s in self.servers.values()):
                raise ValueError(f"client {pid} is already connected")
            server.clients[pid] = FakeMpsClient(
                pid=pid,
                server_pid=server.pid,
                active_thread_percentage=server.active_thread_percentage,
                pinned_mem_limits=dict(server.pinned_mem_limits),
            )
            return server.pid

    def disconnect_client(self, pid: int) -> None:
        """The process exits; a server left without clients exits too."""
        with self._lock:
            for server in list(self.servers.values()):
                if server.clients.pop(pid, None) is not None:
                    if not server.clients:
                        del self.servers[server.pid]
                    return
        raise KeyError(f"no client {pid}")

    def client(self, pid: int) -> FakeMpsClient:
        with self._lock:
            for server in self.servers.values():
                if pid in server.clients:
                    return server.clients[pid]
        raise KeyError(f"no client {pid}")

    # -- the documented command grammar --------------------------------------------------------

    def execute(self, line: str) -> str:
        """Run one command line; raises ``MpsGrammarError`` with the error reply."""
        words = line.split()
        if not words:
            raise MpsGrammarError("empty command")
        name, args = words[0], words[1:]
        with self._lock:
            if name == "get_server_list":
                _arity(name, args, 0)
                return "\n".join(str(pid) for pid in sorted(self.servers))
            if name == "get_client_list":
                _arity(name, args, 1)
                return "\n".join(str(pid) for pid in sorted(self._server(args[0]).clients))
            if name == "set_default_active_thread_percentage":
                _arity(name, args, 1)
                self.default_active_thread_percentage = _percentage(args[0])
                return f"{self.default_active_thread_percentage:.1f}"
            if name == "get_default_active_thread_percentage":
                _arity(name, args, 0)
                return f"{self.default_active_thread_percentage:.1f}"
            if name == "set_active_thread_percentage":
                _arity(name, args, 2)
                server = self._server(args[0])
                server.active_thread_percentage = _percentage(args[1])
                return f"{server.active_thread_percentage:.1f}"
            if name == "get_active_thread_percentage":
                _arity(name, args, 1)
                return f"{self._server(args[0]).active_thread_percentage:.1f}"
            if name == "set_default_device_pinned_mem_limit":
                _arity(name, args, 2)
                self.default_pinned_mem_limits[_device(args[0])] = _mem_value(args[1])
                return ""
            if name == "get_default_device_pinned_mem_limit":
                _arity(name, args, 1)
                return self.default_pinned_mem_limits.get(_device(args[0]), "0")
            if name == "set_device_pinned_mem_limit":
                _arity(name, args, 3)
                server = self._server(args[0])
                server.pinned_mem_limits[_device(args[1])] = _mem_value(args[2])
                return ""
            if name == "get_device_pinned_mem_limit":
                _arity(name, args, 2)
                return self._server(args[0]).pinned_mem_limits.get(_device(args[1]), "0")
            if name == "quit":
                _arity(name, args, 0)
                # The daemon exits: settings made with set_default_* are lost.
                self.default_active_thread_percentage = 100.0
                self.default_pinned_mem_limits.clear()
                self.quit_received.set()
                return ""
        raise MpsGrammarError(f"Unrecognized command: {name}")

    def _server(self, word: str) -> FakeMpsServer:
        if not _PID.fullmatch(word):
            raise MpsGrammarError(f"Invalid PID: {word}")
        server = self.servers.get(int(word))
        if server is None:
            raise MpsGrammarError(f"Server {word} not found")
        return server

    # -- the pipe ------------------------------------------------------------------------------

    def _serve(self) -> None:
        buffer = b""
        while not self._stopping.is_set():
            ready, _, _ = select.select([self._read_fd], [], [], 0.5)
            if not ready:
                continue
            try:
                chunk = os.read(self._read_fd, 65536)
            except BlockingIOError:
                continue
            buffer += chunk
            while b"\n" in buffer:
                raw, buffer = buffer.split(b"\n", 1)
                if raw:
                    self._answer(raw.decode("utf-8", errors="replace"))

    def _answer(self, request: str) -> None:
        reply_name, sep, line = request.partition("\t")
        if not sep or "/" in reply_name or not reply_name.startswith("reply-"):
            return  # not a front end's request; the real daemon drops bad connections too
        line = line.strip()
        self.commands.append(line)
        try:
            text, status = self.execute(line), "ok"
        except MpsGrammarError as error:
            text, status = str(error), "error"
        _write_reply(self.pipe_directory / reply_name, f"{status}\n{text}".encode())


def _arity(name: str, args: Sequence[str], expected: int) -> None:
    if len(args) != expected:
        raise MpsGrammarError(f"{name}: expected {expected} argument(s), got {len(args)}")


def _percentage(word: str) -> float:
    if not _PERCENTAGE.fullmatch(word) or not 0 < float(word) <= 100:
        raise MpsGrammarError(f"Invalid active thread percentage: {word} (a number in (0, 100])")
    return float(word)


def _device(word: str) -> str:
    if not _DEVICE.fullmatch(word):
        raise MpsGrammarError(f"Invalid device: {word} (an ordinal or a GPU-/MIG- UUID)")
    return word


def _mem_value(word: str) -> str:
    if not _MEM_VALUE.fullmatch(word):
        raise MpsGrammarError(f"Invalid memory limit: {word} (an integer followed by M or G, e.g. 900M)")
    return word


def _write_reply(path: Path, payload: bytes) -> None:
    # The front end opens its reply FIFO for reading right after sending; wait for it briefly.
    deadline = time.monotonic() + 2.0
    while True:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError as error:
            if error.errno not in (errno.ENXIO, errno.ENOENT) or time.monotonic() > deadline:
                return  # the front end went away; nobody to answer
            time.sleep(0.001)
    try:
        os.set_blocking(fd, True)
        view = memoryview(payload)
        while view:
            view = view[os.write(fd, view) :]
    except BrokenPipeError:
        pass  # the front end exited before reading its reply; nothing to deliver
    finally:
        os.close(fd)


# -- the front end (``python -m agents.fakes.mps``) ---------------------------------------------


def _forward(pipe_directory: Path, line: str, tag: str) -> tuple[bool, str]:
    reply_name = f"reply-{os.getpid()}-{tag}"  # unique per request in flight
    reply_path = pipe_directory / reply_name
    request = f"{reply_name}\t{line}\n".encode()
    if len(request) > _MAX_REQUEST:
        return False, "command too long"
    os.mkfifo(reply_path, 0o600)
    try:
        try:
            control = os.open(pipe_directory / CONTROL_FIFO, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as error:
            # ENXIO: the FIFO has no reader, i.e. no daemon; ENOENT: no FIFO at all.
            return False, f"Cannot find MPS control daemon process ({error.strerror})"
        try:
            os.write(control, request)
        finally:
            os.close(control)
        with open(reply_path, "rb") as reply:  # blocks until the daemon opens it for writing
            status, _, text = reply.read().decode().partition("\n")
    finally:
        reply_path.unlink(missing_ok=True)
    return status == "ok", text


class PipeMpsControl:
    """``MpsControl`` over the fake daemon's pipe, in-process (see ``FakeMpsControlDaemon.control``)."""

    def __init__(self, pipe_directory: Path) -> None:
        self._pipe_directory = pipe_directory
        self._serial = itertools.count()

    def send(self, command: str) -> str:
        from agents.mps import MpsCommandError  # noqa: PLC0415 - here: the front end must start without the agent's imports

        ok, text = _forward(self._pipe_directory, command, f"{threading.get_ident()}-{next(self._serial)}")
        if not ok:
            raise MpsCommandError(f"{command!r} failed: {text}")
        return text


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agents.fakes.mps", description=__doc__.split("\n")[0])
    parser.add_argument("--pipe", type=Path, default=None, help="pipe directory (default $CUDA_MPS_PIPE_DIRECTORY)")
    args = parser.parse_args(argv)
    pipe_directory = args.pipe or Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps"))  # noqa: S108 - the real daemon's documented default
    failed = False
    for serial, raw in enumerate(sys.stdin):
        line = raw.strip()
        if not line:
            continue
        ok, text = _forward(pipe_directory, line, str(serial))
        if ok:
            if text:
                print(text, flush=True)
        else:
            failed = True
            print(text, file=sys.stderr, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
