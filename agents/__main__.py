"""Command line of the node agent (console script ``vgpu-agent``).

``vgpu-agent run`` meters and uploads until SIGTERM/SIGINT (exit 0), or, with
``--once-seconds N``, meters N simulated seconds on a fake clock (ending now by
default), uploads what it can and exits: 0 when the spool is drained, 75
(EX_TEMPFAIL) when batches stay pending for a later run.
``vgpu-agent scenario`` prints a demo scenario for the sim backend.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from functools import partial
from pathlib import Path
from types import FrameType

import requests

from agents.backends.sim import SLA_TIERS, SimBackend, demo_scenario, load_scenario
from agents.clock import SystemClock, ceil_to_seconds, from_us, to_us, utc_now
from agents.credentials import TokenError, read_token
from agents.enforcers import DryRunEnforcer
from agents.interfaces import Clock, GpuBackend
from agents.loop import Agent, AgentConfig
from agents.spool import Spool
from agents.testing import FakeClock
from agents.uploader import RetryPolicy, Uploader

__all__ = ["EXIT_PENDING", "main"]

log = logging.getLogger("agents")

EXIT_PENDING = 75  # EX_TEMPFAIL: --once-seconds left batches in the spool
_UNIX_EPOCH = from_us(0)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stderr,
    )
    if args.command == "scenario":
        return _scenario(args)
    try:
        return _run(args)
    except _Fatal as error:
        print(f"vgpu-agent: error: {error}", file=sys.stderr)
        return 1


class _Fatal(Exception):
    """A start-up problem reported as one line, without a traceback."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vgpu-agent", description="vGPU Ledger node agent")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="meter GPUs and upload usage batches")
    run.add_argument("--server", required=True, help="base URL of the service, e.g. http://ledger:8000")
    run.add_argument("--token-file", required=True, type=Path, help="file holding the node token")
    run.add_argument("--backend", choices=["nvml", "sim"], default="nvml")
    run.add_argument("--scenario", type=Path, help="scenario JSON (required with --backend sim)")
    run.add_argument("--node", default=os.environ.get("NODE_NAME"), help="node name (sim: scenario's)")
    run.add_argument("--spool", type=Path, help="spool database (default .data/agent/<node>.sqlite)")
    run.add_argument("--tick-ms", type=int, default=500, help="allocation tick, ms")
    run.add_argument("--meter-ms", type=int, default=1000, help="usage sample width, whole seconds in ms")
    run.add_argument(
        "--batch-seconds", type=int, default=60,
        help="batch window width, s (default 60: a fifth of the ingest CPU per sample of 10 s batches, docs/benchmarks.md)",
    )
    run.add_argument("--timeout-s", type=float, default=10.0, help="HTTP timeout per upload, s")
    run.add_argument("--gzip", action=argparse.BooleanOptionalAction, default=True)
    run.add_argument(
        "--once-seconds",
        type=int,
        help="meter N simulated seconds on a fake clock, upload, exit (for tests and replays)",
    )
    run.add_argument(
        "--start",
        type=_aware_datetime,
        help="with --once-seconds: first metered second, ISO-8601 with offset (default: now - N)",
    )

    scenario = commands.add_parser("scenario", help="print a demo scenario for --backend sim")
    scenario.add_argument("--node", required=True)
    scenario.add_argument("--seed", type=int, required=True)
    scenario.add_argument("--gpus", type=int, default=8, help="number of A100 80GB cards")
    scenario.add_argument(
        "--tenants",
        type=_tenants,
        required=True,
        help=f"slug:tier pairs, comma-separated; tiers: {', '.join(SLA_TIERS)}",
    )
    return parser


def _aware_datetime(text: str) -> datetime:
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        raise argparse.ArgumentTypeError(f"{text!r} has no UTC offset")
    return moment


def _tenants(text: str) -> list[tuple[str, str]]:
    pairs: list[tuple[str, str]] = []
    for item in text.split(","):
        slug, sep, tier = item.strip().partition(":")
        if not sep or not slug or tier not in SLA_TIERS:
            raise argparse.ArgumentTypeError(f"{item!r}: expected slug:tier with tier in {SLA_TIERS}")
        pairs.append((slug, tier))
    return pairs


def _scenario(args: argparse.Namespace) -> int:
    document = demo_scenario(args.node, seed=args.seed, gpu_count=args.gpus, tenants=args.tenants)
    json.dump(document, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


def _backend(args: argparse.Namespace) -> tuple[GpuBackend, str]:
    if args.backend == "sim":
        if args.scenario is None:
            raise _Fatal("--backend sim needs --scenario FILE (see: vgpu-agent scenario --help)")
        try:
            scenario = load_scenario(args.scenario)
        except OSError as error:
            raise _Fatal(f"scenario {args.scenario}: {error.strerror}") from error
        except ValueError as error:
            raise _Fatal(str(error)) from error
        # Profiles run on absolute time, so a restarted agent continues the same trace.
        return SimBackend(scenario, epoch=_UNIX_EPOCH), args.node or scenario.node
    from agents.backends.nvml import NvmlBackend, NvmlUnavailable

    if not args.node:
        raise _Fatal("--backend nvml needs --node NAME (or NODE_NAME in the environment)")
    try:
        return NvmlBackend(), args.node
    except NvmlUnavailable as error:
        raise _Fatal(str(error)) from error


def _run(args: argparse.Namespace) -> int:
    try:
        read_token(args.token_file)
    except TokenError as error:
        raise _Fatal(str(error)) from error
    backend, node = _backend(args)
    try:
        config = AgentConfig(node=node, tick_ms=args.tick_ms, meter_ms=args.meter_ms, batch_seconds=args.batch_seconds)
        retry = RetryPolicy(timeout_s=args.timeout_s)
    except ValueError as error:
        raise _Fatal(str(error)) from error
    spool_path = args.spool or Path(".data") / "agent" / f"{node}.sqlite"
    spool = Spool(spool_path, node=node, now=utc_now, compress=args.gzip)
    uploader = Uploader(
        spool=spool,
        server=args.server,
        token=partial(read_token, args.token_file),
        session=requests.Session(),
        retry=retry,
    )
    try:
        if args.once_seconds is not None:
            return _run_once(args, config=config, backend=backend, spool=spool, uploader=uploader)
        return _run_forever(config=config, backend=backend, spool=spool, uploader=uploader)
    finally:
        spool.close()


def _run_once(
    args: argparse.Namespace,
    *,
    config: AgentConfig,
    backend: GpuBackend,
    spool: Spool,
    uploader: Uploader,
) -> int:
    seconds = args.once_seconds
    if seconds < 1:
        raise _Fatal(f"--once-seconds must be >= 1, got {seconds}")
    period = timedelta(seconds=config.period_s)
    if args.start is not None:
        start = ceil_to_seconds(args.start, seconds=config.period_s)
    else:
        start = from_us(to_us(utc_now()) // 1_000_000 * 1_000_000) - timedelta(seconds=seconds)
        start = ceil_to_seconds(start, seconds=config.period_s)
    if spool.last_window_end is not None and start < spool.last_window_end:
        start = ceil_to_seconds(spool.last_window_end, seconds=config.period_s)
    until = start + max(period, timedelta(seconds=seconds) // period * period)
    if until > utc_now() + timedelta(seconds=1):
        log.warning("event=window_in_future until=%s detail='the server may reject it'", until)
    clock = FakeClock(start=start)
    agent = _agent(config=config, backend=backend, clock=clock, spool=spool, uploader=uploader)
    with _stop_on_signals() as stop:
        agent.run(stop=stop, start=start, until=until)
    pending = uploader.flush_once()
    log.info("event=once_done pending=%d dead=%d", pending, spool.count(state="dead"))
    return 0 if pending == 0 else EXIT_PENDING


def _run_forever(*, config: AgentConfig, backend: GpuBackend, spool: Spool, uploader: Uploader) -> int:
    crashed: list[BaseException] = []

    with _stop_on_signals() as stop:

        def upload() -> None:
            try:
                uploader.run()
            except Exception as error:  # logged with traceback, then the agent stops and exits 1
                crashed.append(error)
                log.exception("event=uploader_crashed")
                stop.set()

        worker = threading.Thread(target=upload, name="uploader", daemon=True)
        worker.start()
        agent = _agent(config=config, backend=backend, clock=SystemClock(), spool=spool, uploader=uploader)
        try:
            agent.run(stop=stop)
        finally:
            uploader.stop()
            worker.join()
    if crashed:
        return 1
    pending = uploader.flush_once()
    log.info("event=agent_exit pending=%d", pending)
    return 0


def _agent(*, config: AgentConfig, backend: GpuBackend, clock: Clock, spool: Spool, uploader: Uploader) -> Agent:
    return Agent(
        config=config,
        backend=backend,
        clock=clock,
        enforcer=DryRunEnforcer(),
        spool=spool,
        on_batch=lambda _seq: uploader.notify(),
    )


@contextmanager
def _stop_on_signals() -> Iterator[threading.Event]:
    """An event set by SIGTERM/SIGINT; previous handlers are restored afterwards."""
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stop  # signal handlers can only be installed from the main thread
        return

    def handler(signum: int, _frame: FrameType | None) -> None:
        log.info("event=shutdown_requested signal=%s", signal.Signals(signum).name)
        stop.set()

    previous: dict[int, Callable[[int, FrameType | None], object] | int | None] = {
        s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)
    }
    try:
        yield stop
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


if __name__ == "__main__":
    sys.exit(main())
