"""Command line of the node agent (console script ``vgpu-agent``).

``vgpu-agent run`` meters and uploads until SIGTERM/SIGINT (exit 0), or, with
``--once-seconds N``, meters N simulated seconds on a fake clock (ending now by
default), uploads what it can and exits: 0 when the spool is drained, 75
(EX_TEMPFAIL) when batches stay pending for a later run.
``vgpu-agent scenario`` prints a demo scenario for the sim backend.
``vgpu-agent redrive`` resends a spool's undelivered batches after a fix (docs/agent.md).

A run wires: the backend (NVML attributed through Kubernetes and entitled by the pods'
requests, or a scenario), the policy client (polled on a thread; once before a
``--once-seconds`` run), the enforcer (``--enforcer``), the tick observers (watchdog,
``evict-best-effort``, metrics), the uploader and the event sink. Every flag: docs/agent.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shlex
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial
from pathlib import Path
from types import FrameType

import requests
import urllib3
from kubernetes import client as kube_client
from kubernetes import config as kube_config
from kubernetes.client.exceptions import ApiException

from agents.allocation import Policy
from agents.attribution import KubeAttributor, PidAttributor
from agents.backends.sim import SLA_TIERS, SimBackend, demo_scenario, load_scenario
from agents.budget_enforcement import BestEffortEvictor
from agents.clock import SystemClock, ceil_to_seconds, from_us, to_us, utc_now
from agents.credentials import TokenError, read_token
from agents.enforcers import DryRunEnforcer
from agents.entitlements import EntitledBackend, ProcessBackend
from agents.events import EventSink
from agents.fakes.clock import FakeClock
from agents.gpu_requests import GpuRequest, GpuRequestResolver
from agents.interfaces import Clock, Enforcer, GpuInfo, Predictor, TickObserver
from agents.kube import EvictionOutcome, KubeClientPods
from agents.loop import Agent, AgentConfig
from agents.metrics import AgentMetrics, MetricsServer, serve_metrics
from agents.mps import DEFAULT_CONTROL_COMMAND, MpsControlCli, MpsEnforcer
from agents.owners import DEFAULT_LABEL_KEYS, ControllerResolver, parse_label_keys
from agents.policy_client import PolicyClient
from agents.prediction import (
    DEFAULT_HEADROOM,
    DEFAULT_PREDICTOR,
    DEFAULT_UNDERPREDICTION_TARGET,
    PREDICTOR_CHOICES,
    Calibration,
    MarginPredictor,
    WorkloadPredictors,
    agent_predictor,
)
from agents.spool import DEFAULT_SAMPLE_RETENTION, Spool, SpooledBatch, SpoolKind, spool_node
from agents.undelivered import UndeliveredReporter
from agents.uploader import Outcome, RetryPolicy, SendResult, Uploader
from agents.watchdog import Evict, WatchdogAction, WatchdogEnforcer, WatchdogPolicy

__all__ = ["EXIT_PENDING", "main"]

log = logging.getLogger("agents")

EXIT_PENDING = 75  # EX_TEMPFAIL: --once-seconds left batches in the spool
_ENFORCERS = ("dry-run", "mps", "watchdog")
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
        if args.command == "redrive":
            return _redrive(args)
        if args.command == "export-samples":
            return _export_samples(args)
        return _run(args)
    except _Fatal as error:
        print(f"vgpu-agent: error: {error}", file=sys.stderr)
        return 1


class _Fatal(Exception):
    """A start-up problem reported as one line, without a traceback."""


def _parser() -> argparse.ArgumentParser:  # noqa: PLR0915 - one add_argument per option, in the order --help lists them
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
    run.add_argument("--wire", choices=["v1", "v2"], default="v2",
                     help="batch protocol: v2 (default) sends integrals per workload-minute, v1 per-second samples "
                          "(docs/protocol.md)")
    run.add_argument("--sample-retention-days", type=float, default=DEFAULT_SAMPLE_RETENTION.days,
                     help="days the spool keeps per-second samples for an audit (export-samples)")
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
    predict = run.add_argument_group("prediction (docs/prediction.md)")
    predict.add_argument(
        "--predictor",
        choices=PREDICTOR_CHOICES,
        default=DEFAULT_PREDICTOR,
        help="peak predictor per workload (default margin: the workload's last-minute peak x a margin calibrated "
        "toward its SLA tier's miss targets; lstm: memory the LSTM, SMs last value + margin)",
    )
    predict.add_argument(
        "--headroom",
        type=float,
        help="demand = predicted peak x (1 + this), >= 0 (default: the predictor's own, "
        + ", ".join(f"{kind} {value:g}" for kind, value in DEFAULT_HEADROOM.items())
        + ")",
    )
    predict.add_argument(
        "--online-calibration",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="hold each workload's under-prediction rate at --underprediction-target by moving its margin",
    )
    predict.add_argument(
        "--underprediction-target",
        type=float,
        default=DEFAULT_UNDERPREDICTION_TARGET,
        help="under-prediction rate online calibration holds, in (0, 1)",
    )
    policy = run.add_argument_group("policy (GET /api/v1/nodes/{node}/policy)")
    policy.add_argument("--policy-interval-s", type=float, default=10.0, help="policy poll interval, s")
    policy.add_argument(
        "--policy-cache", type=Path, help="last known policy, JSON (default: <spool>.policy.json next to the spool)"
    )
    enforce = run.add_argument_group("enforcement (docs/enforcement.md)")
    enforce.add_argument(
        "--enforcer",
        type=_enforcers,
        default=frozenset({"dry-run"}),
        help="dry-run, mps, watchdog, or mps,watchdog (default dry-run: log grants, act on nothing)",
    )
    enforce.add_argument(
        "--mps-control",
        default=" ".join(DEFAULT_CONTROL_COMMAND),
        help="MPS control front end, split like a shell line (default nvidia-cuda-mps-control)",
    )
    enforce.add_argument(
        "--mps-pipe-directory", type=Path, help="CUDA_MPS_PIPE_DIRECTORY of the node's control daemon"
    )
    enforce.add_argument("--watchdog-action", choices=[a.value for a in WatchdogAction], default="evict")
    enforce.add_argument("--watchdog-grace-s", type=float, default=30.0, help="how long an excess may last, s")
    enforce.add_argument(
        "--watchdog-tolerance", type=float, default=0.1, help="over when use > grant x (1 + this)"
    )
    enforce.add_argument("--watchdog-kill-grace-s", type=float, default=10.0, help="signal: SIGTERM -> SIGKILL, s")
    enforce.add_argument(
        "--watchdog-check-sm", action="store_true", help="also act on SM use above grant (default: memory only)"
    )
    kube = run.add_argument_group("Kubernetes (attribution, requests, evictions)")
    kube.add_argument(
        "--kube-api",
        help="API server URL (default: in-cluster service account, else ~/.kube/config; sim: none unless given)",
    )
    kube.add_argument("--no-kube", action="store_true", help="nvml without Kubernetes: processes are unattributed")
    kube.add_argument(
        "--proc-root", type=Path, default=Path("/proc"), help="the host's /proc (hostPID), for PID -> cgroup"
    )
    group = run.add_argument_group("grouping (optional batch fields, docs/protocol.md)")
    group.add_argument(
        "--cluster",
        type=_cluster,
        default=os.environ.get("VGPU_AGENT_CLUSTER", ""),
        help="the Kubernetes cluster this node is in, sent with every batch (default $VGPU_AGENT_CLUSTER; empty: none)",
    )
    group.add_argument(
        "--labels",
        type=_label_keys,
        default=_label_keys(os.environ.get("VGPU_AGENT_LABELS", ",".join(DEFAULT_LABEL_KEYS))),
        help="pod label keys sent with each sample, comma-separated (default $VGPU_AGENT_LABELS, else "
        f"{','.join(DEFAULT_LABEL_KEYS)}; empty: none). Each distinct value is a group: name few",
    )
    observe = run.add_argument_group("metrics")
    observe.add_argument("--metrics-port", type=int, default=0, help="Prometheus /metrics port (default 0: off)")
    observe.add_argument("--metrics-address", default="127.0.0.1", help="address /metrics binds to")

    redrive = commands.add_parser(
        "redrive", help="resend undelivered batches of a spool after a fix (409: under a fresh batch_seq)"
    )
    redrive.add_argument("--spool", required=True, type=Path, help="the spool database")
    redrive.add_argument("--server", help="base URL of the service (required unless --list)")
    redrive.add_argument("--token-file", type=Path, help="file holding the node token (required unless --list)")
    redrive.add_argument(
        "--batch-seq", type=int, action="append", help="only this undelivered batch (repeatable; default: all)"
    )
    redrive.add_argument("--list", action="store_true", help="list the undelivered batches, change nothing")
    redrive.add_argument("--timeout-s", type=float, default=10.0, help="HTTP timeout per request, s")

    export = commands.add_parser(
        "export-samples", help="write the per-second samples a spool keeps, as JSON lines, for an audit")
    export.add_argument("--spool", required=True, type=Path, help="the spool database")
    export.add_argument("--from", dest="start", required=True, type=_aware_datetime,
                        help="first instant, ISO-8601 with offset (e.g. 2026-11-30T00:00:00Z)")
    export.add_argument("--to", dest="end", required=True, type=_aware_datetime, help="end instant, excluded")
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


_CLUSTER = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")  # what the service accepts (docs/protocol.md)


def _cluster(text: str) -> str:
    if text and not _CLUSTER.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r}: a cluster name is 1-253 letters, digits and . _ - "
                                         "beginning with a letter or digit")
    return text


def _label_keys(text: str) -> tuple[str, ...]:
    try:
        return parse_label_keys(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from error


def _enforcers(text: str) -> frozenset[str]:
    chosen = frozenset(part.strip() for part in text.split(","))
    if not chosen <= set(_ENFORCERS) or ("dry-run" in chosen and len(chosen) > 1):
        raise argparse.ArgumentTypeError(f"{text!r}: expected dry-run, mps, watchdog or mps,watchdog")
    return chosen


def _scenario_backend(args: argparse.Namespace) -> SimBackend:
    if args.scenario is None:
        raise _Fatal("--backend sim needs --scenario FILE (see: vgpu-agent scenario --help)")
    try:
        scenario = load_scenario(args.scenario)
    except OSError as error:
        raise _Fatal(f"scenario {args.scenario}: {error.strerror}") from error
    except ValueError as error:
        raise _Fatal(str(error)) from error
    # Profiles run on absolute time, so a restarted agent continues the same trace.
    return SimBackend(scenario, epoch=_UNIX_EPOCH, label_keys=args.labels)


def _load_nvml() -> object:
    """The initialised NVML module, first thing in nvml mode: no GPU is the first error to report."""
    from agents.backends.nvml import NvmlUnavailable, load_nvml  # noqa: PLC0415 - pynvml loads only in nvml mode

    try:
        return load_nvml()
    except NvmlUnavailable as error:
        raise _Fatal(str(error)) from error


def _kube(args: argparse.Namespace, *, node: str) -> KubeClientPods | None:
    """``--kube-api URL``; for NVML also in-cluster or kubeconfig; none with ``--no-kube`` (or sim without a URL)."""
    if args.no_kube or (args.backend == "sim" and args.kube_api is None):
        return None
    if args.kube_api is not None:
        configuration = kube_client.Configuration()
        configuration.host = args.kube_api.rstrip("/")
        return KubeClientPods(api_client=kube_client.ApiClient(configuration), node=node)
    try:
        return KubeClientPods.from_environment(node=node)
    except kube_config.ConfigException as error:
        raise _Fatal(f"no Kubernetes configuration ({error}); pass --kube-api URL or --no-kube") from error


@dataclass
class _Parts:
    """What one run of the agent is made of; ``close`` releases it in reverse order."""

    node: str
    config: AgentConfig
    spool: Spool
    uploader: Uploader
    policy: PolicyClient
    events: EventSink
    kube: KubeClientPods | None = None
    metrics: AgentMetrics | None = None
    metrics_server: MetricsServer | None = None
    closers: list[Callable[[], None]] = field(default_factory=list)

    def close(self) -> None:
        for close in reversed(self.closers):
            close()


def _run(args: argparse.Namespace) -> int:
    try:
        read_token(args.token_file)
    except TokenError as error:
        raise _Fatal(str(error)) from error
    sim = _scenario_backend(args) if args.backend == "sim" else None
    node = args.node or (sim.scenario.node if sim is not None else None)
    if not node:
        raise _Fatal("--backend nvml needs --node NAME (or NODE_NAME in the environment)")
    nvml = _load_nvml() if sim is None else None
    try:
        config = AgentConfig(node=node, tick_ms=args.tick_ms, meter_ms=args.meter_ms, batch_seconds=args.batch_seconds,
                             cluster=args.cluster, wire=args.wire)
        retry = RetryPolicy(timeout_s=args.timeout_s)
        watchdog_policy = WatchdogPolicy(
            action=WatchdogAction(args.watchdog_action),
            tolerance=args.watchdog_tolerance,
            grace_s=args.watchdog_grace_s,
            kill_grace_s=args.watchdog_kill_grace_s,
            check_sm=args.watchdog_check_sm,
        )
    except ValueError as error:
        raise _Fatal(str(error)) from error
    if not args.policy_interval_s > 0:
        raise _Fatal(f"--policy-interval-s must be > 0, got {args.policy_interval_s}")
    if args.once_seconds is not None and args.once_seconds < 1:
        raise _Fatal(f"--once-seconds must be >= 1, got {args.once_seconds}")
    spool_path = args.spool or Path(".data") / "agent" / f"{node}.sqlite"
    token = partial(read_token, args.token_file)
    # A replay (history, backfill) gets a sequence space of its own: it may run beside the live agent.
    kind: SpoolKind = "replay" if args.once_seconds is not None else "live"
    try:
        spool = Spool(spool_path, node=node, now=utc_now, compress=args.gzip, kind=kind,
                      sample_retention=timedelta(days=args.sample_retention_days))
    except ValueError as error:
        raise _Fatal(str(error)) from error
    metrics = AgentMetrics() if args.metrics_port else None
    reporter = UndeliveredReporter(spool=spool, server=args.server, node=node, token=token, retry=retry)
    parts = _Parts(
        node=node,
        config=config,
        spool=spool,
        uploader=Uploader(
            spool=spool,
            server=args.server,
            token=token,
            session=requests.Session(),
            retry=retry,
            on_result=None if metrics is None else partial(_count_upload_error, metrics),
            report_undelivered=reporter.report_if_due,
        ),
        policy=PolicyClient(
            server=args.server,
            node=node,
            token=token,
            cache_path=args.policy_cache or spool_path.with_name(f"{spool_path.stem}.policy.json"),
            base=_base_policy(args),
            session=requests.Session(),
            interval_s=args.policy_interval_s,
            timeout_s=args.timeout_s,
        ),
        events=EventSink(server=args.server, node=node, token=token, session=requests.Session(), retry=retry),
        metrics=metrics,
    )
    parts.closers.append(spool.close)
    try:
        parts.kube = _kube(args, node=node)
        if parts.kube is not None:
            parts.closers.append(parts.kube.stop)
        if metrics is not None:
            metrics.watch_spool(spool)
            metrics.watch_policy(age_s=parts.policy.age_s, etag=lambda: parts.policy.current().etag)
            try:
                parts.metrics_server = serve_metrics(metrics, address=args.metrics_address, port=args.metrics_port)
            except OSError as error:
                raise _Fatal(f"metrics on {args.metrics_address}:{args.metrics_port}: {error.strerror}") from error
            parts.closers.append(parts.metrics_server.close)
            log.info("event=metrics_serving url=%s", parts.metrics_server.url)
        backend = sim if sim is not None else _node_backend(args, parts, nvml=nvml)
        if args.once_seconds is not None:
            return _run_once(args, parts=parts, backend=backend, sim=sim, watchdog_policy=watchdog_policy)
        return _run_forever(args, parts=parts, backend=backend, sim=sim, watchdog_policy=watchdog_policy)
    finally:
        parts.close()


def _node_backend(args: argparse.Namespace, parts: _Parts, *, nvml: object) -> ProcessBackend:
    """NVML readings attributed to pods and entitled by their requests (``PidAttributor`` without Kubernetes)."""
    from agents.backends.nvml import NvmlBackend  # noqa: PLC0415 - pynvml loads only in nvml mode

    kube = parts.kube
    if kube is None:
        unattributed = NvmlBackend(attributor=PidAttributor(), nvml=nvml)
        parts.closers.append(unattributed.close)
        return unattributed
    try:
        kube.start()  # lists the node's pods and namespaces; an unreachable API server fails here
    except (ApiException, urllib3.exceptions.HTTPError) as error:
        raise _Fatal(f"Kubernetes API: {error}; pass --kube-api URL or --no-kube") from error
    policy = parts.policy
    attributor = KubeAttributor(
        pods=kube,
        tenant_default_tier=lambda tenant: policy.current().default_tier(tenant),
        proc_root=args.proc_root,
        label_keys=args.labels,
        controllers=ControllerResolver(read=kube.read_controller),
    )
    backend = NvmlBackend(attributor=attributor, nvml=nvml)
    parts.closers.append(backend.close)
    # The policy document carries no default request per tenant: unrequested work is promised nothing.
    resolver = GpuRequestResolver(pods=kube, tenant_default=lambda _tenant: GpuRequest())
    return EntitledBackend(backend, resolver=resolver)


def _evict_callable(*, kube: KubeClientPods | None, sim: SimBackend | None) -> Evict | None:
    """How this node evicts a pod: the Eviction API; in sim mode the pod's workloads also stop."""
    if sim is None:
        return None if kube is None else kube.evict

    def evict(*, namespace: str, pod: str, reason: str, message: str, pod_uid: str | None = None) -> object:
        outcome: object = EvictionOutcome.EVICTED
        if kube is not None:
            outcome = kube.evict(namespace=namespace, pod=pod, reason=reason, message=message, pod_uid=pod_uid)
        if outcome in (EvictionOutcome.EVICTED, EvictionOutcome.GONE):
            removed = sim.remove_pod(namespace=namespace, pod=pod)
            log.info("event=sim_pod_stopped pod=%s/%s workloads=%d", namespace, pod, removed)
        return outcome

    return evict


def _agent(
    args: argparse.Namespace,
    *,
    parts: _Parts,
    backend: ProcessBackend,
    sim: SimBackend | None,
    clock: Clock,
    watchdog_policy: WatchdogPolicy,
) -> Agent:
    enforcers: frozenset[str] = args.enforcer
    emit = parts.events.emit
    evict = _evict_callable(kube=parts.kube, sim=sim)
    observers: list[TickObserver] = []
    if "watchdog" in enforcers:
        if watchdog_policy.action is WatchdogAction.EVICT and evict is None:
            raise _Fatal("--watchdog-action evict needs the Kubernetes API; use --watchdog-action signal with --no-kube")
        observers.append(
            WatchdogEnforcer(
                policy=watchdog_policy, clock=clock, emit=emit, processes=backend.processes, evict=evict
            )
        )
    policy = parts.policy
    if enforcers != {"dry-run"}:
        if evict is None:
            log.warning("event=budget_evictions_unavailable detail='no Kubernetes API: evict-best-effort is not applied'")
        else:
            observers.append(
                BestEffortEvictor(
                    tenants=lambda: policy.current().evict_best_effort_tenants, evict=evict, emit=emit, clock=clock,
                    namespaces=lambda: policy.current().evict_best_effort_namespaces,
                )
            )
    predictor = _predictor(args, gpus=backend.inventory(), policy=policy.allocation_policy)
    # The Agent puts a per-workload predictor first among the observers: it forgets the workloads
    # that left before the others see the tick.
    if isinstance(predictor, WorkloadPredictors | MarginPredictor) and parts.metrics is not None:
        parts.metrics.watch_predictions(predictor.stats)
    if parts.metrics is not None:
        observers.append(parts.metrics)
    enforcer: Enforcer = DryRunEnforcer()
    if "mps" in enforcers:
        enforcer = MpsEnforcer(
            control=MpsControlCli(command=shlex.split(args.mps_control), pipe_directory=args.mps_pipe_directory),
            gpus=backend.inventory(),
            client_pids=backend.processes,
            emit=emit,
        )
    uploader = parts.uploader
    return Agent(
        config=parts.config,
        backend=backend,
        clock=clock,
        enforcer=enforcer,
        spool=parts.spool,
        predictor=predictor,
        on_batch=lambda _seq: uploader.notify(),
        policy=policy.allocation_policy,
        observers=observers,
        on_tick_seconds=None if parts.metrics is None else parts.metrics.record_tick,
        checkpoint=args.once_seconds is None,
    )


def _predictor(args: argparse.Namespace, *, gpus: Sequence[GpuInfo], policy: Callable[[], Policy]) -> Predictor:
    """``--predictor``: the margin policy (default), per-workload predictors from the shipped bundle, or current use."""
    try:
        calibration = Calibration(enabled=args.online_calibration, target=args.underprediction_target)
    except ValueError as error:
        raise _Fatal(f"--underprediction-target: {error}") from error
    return agent_predictor(args.predictor, gpus=gpus, targets=lambda tier: policy().miss_target_for(tier),
                           calibration=calibration)


def _base_policy(args: argparse.Namespace) -> Policy:
    """The node's policy before the service's document: ``--headroom``, else the predictor's own."""
    headroom = args.headroom if args.headroom is not None else DEFAULT_HEADROOM[args.predictor]
    try:
        return Policy(headroom=headroom)
    except ValueError as error:
        raise _Fatal(f"--headroom: {error}") from error


def _count_upload_error(metrics: AgentMetrics, result: SendResult) -> None:
    if result.outcome is not Outcome.SENT:
        metrics.record_upload_error(result.outcome.value)


def _run_once(
    args: argparse.Namespace,
    *,
    parts: _Parts,
    backend: ProcessBackend,
    sim: SimBackend | None,
    watchdog_policy: WatchdogPolicy,
) -> int:
    config, spool = parts.config, parts.spool
    seconds = args.once_seconds
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
    # One poll before the run: the simulated seconds pass faster than any polling interval.
    parts.policy.poll()
    clock = FakeClock(start=start)
    agent = _agent(args, parts=parts, backend=backend, sim=sim, clock=clock, watchdog_policy=watchdog_policy)
    with _stop_on_signals() as stop:
        agent.run(stop=stop, start=start, until=until)
    pending = parts.uploader.flush_once()
    events = parts.events.flush()
    log.info(
        "event=once_done pending=%d undelivered=%d events_sent=%d events_pending=%d",
        pending,
        spool.count_undelivered(),
        events.sent,
        events.pending,
    )
    return 0 if pending == 0 else EXIT_PENDING


def _run_forever(
    args: argparse.Namespace,
    *,
    parts: _Parts,
    backend: ProcessBackend,
    sim: SimBackend | None,
    watchdog_policy: WatchdogPolicy,
) -> int:
    crashed: list[BaseException] = []
    uploader, events, policy = parts.uploader, parts.events, parts.policy
    clock = SystemClock()
    agent = _agent(args, parts=parts, backend=backend, sim=sim, clock=clock, watchdog_policy=watchdog_policy)

    with _stop_on_signals() as stop:

        def guarded(name: str, work: Callable[[], None]) -> Callable[[], None]:
            def body() -> None:
                try:
                    work()
                except Exception as error:  # logged with traceback, then the agent stops and exits 1
                    crashed.append(error)
                    log.exception("event=%s_crashed", name)
                    stop.set()

            return body

        workers = [
            threading.Thread(target=guarded("uploader", uploader.run), name="uploader", daemon=True),
            threading.Thread(target=guarded("event_sink", events.run), name="event-sink", daemon=True),
            threading.Thread(target=guarded("policy_client", policy.run), name="policy-client", daemon=True),
        ]
        for worker in workers:
            worker.start()
        try:
            agent.run(stop=stop)
        finally:
            uploader.stop()
            events.stop()
            policy.stop()
            for worker in workers:
                worker.join()
    if crashed:
        return 1
    pending = uploader.flush_once()
    final = events.flush()  # the last actions (e.g. an eviction just before SIGTERM) reach the audit log
    log.info("event=agent_exit pending=%d events_pending=%d", pending, final.pending)
    return 0


def _export_samples(args: argparse.Namespace) -> int:
    """One JSON object per line: each per-second sample in [--from, --to) with its batch_seq."""
    try:
        node = spool_node(args.spool)
        spool = Spool(args.spool, node=node, now=utc_now)
        try:
            for sample in spool.export_samples(start=args.start, end=args.end):
                sys.stdout.write(json.dumps(sample, separators=(",", ":")) + "\n")
        finally:
            spool.close()
    except ValueError as error:
        raise _Fatal(str(error)) from error
    return 0


def _redrive(args: argparse.Namespace) -> int:
    """Resend undelivered batches: 0 all delivered, 75 some still pending, 1 some refused again."""
    try:
        node = spool_node(args.spool)
    except ValueError as error:
        raise _Fatal(str(error)) from error
    spool = Spool(args.spool, node=node, now=utc_now)
    try:
        undelivered = [b for b in spool.list_batches(state="dead") if b.superseded_by is None]
        if args.batch_seq:
            unknown = sorted(set(args.batch_seq) - {b.batch_seq for b in undelivered})
            if unknown:
                raise _Fatal(f"not undelivered batches of {args.spool}: {', '.join(map(str, unknown))}")
            undelivered = [b for b in undelivered if b.batch_seq in set(args.batch_seq)]
        if args.list:
            for b in undelivered:
                print(_describe(b))
            print(f"{len(undelivered)} undelivered batch(es) in {args.spool} (node {node})")
            return 0
        if args.server is None or args.token_file is None:
            raise _Fatal("redrive needs --server and --token-file (or --list)")
        try:
            read_token(args.token_file)
        except TokenError as error:
            raise _Fatal(str(error)) from error
        token = partial(read_token, args.token_file)
        retry = RetryPolicy(timeout_s=args.timeout_s)
        reporter = UndeliveredReporter(spool=spool, server=args.server, node=node, token=token, retry=retry)
        uploader = Uploader(
            spool=spool, server=args.server, token=token, retry=retry, report_undelivered=reporter.report_if_due
        )
        # A 409 means the service holds this number for other content: only a fresh number can land.
        resent = {b.batch_seq: spool.redrive(b.batch_seq, renumber=b.last_status == 409) for b in undelivered}
        uploader.flush_once()
        states = {b.batch_seq: b for b in spool.list_batches()}
        outcome = 0
        for old, new in resent.items():
            now_as = states.get(new)
            state = "sent" if now_as is None else now_as.state  # retention may already have dropped it
            print(f"batch_seq={old} sent_as={new} state={state} status={now_as.last_status if now_as else ''}")
            if state == "dead":
                outcome = 1
            elif state == "pending" and outcome == 0:
                outcome = EXIT_PENDING
        print(f"{len(resent)} batch(es) re-driven to {args.server}")
        return outcome
    finally:
        spool.close()


def _describe(batch: SpooledBatch) -> str:
    reported = "reported" if batch.reported_at is not None else "not reported"
    reason = (batch.last_error or "").replace("\n", " ")[:160]
    return (
        f"batch_seq={batch.batch_seq} window={batch.window_start.isoformat()}/{batch.window_end.isoformat()}"
        f" bytes={len(batch.body)} status={batch.last_status} {reported} reason={reason!r}"
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
