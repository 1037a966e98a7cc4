"""The demo's paired report, fast: the demo's fleet metered for a few simulated hours, then reported.

    python bench/demo_savings.py [--hours 3] [--nodes 3] [--agent-arg=ARG ...] [--keep-db] [--json-out FILE]

DATABASE_URL and REDIS_URL must be set (`python -m config.embedded -- python bench/demo_savings.py`
provides them). It never touches DATABASE_URL's database: it drops and creates
`<dbname>_demo_savings` on that server and drops it at the end (unless --keep-db). One run:

1. migrate and `manage.py load_demo` (the demo's tiers, tenants and A100 rate card), a node token
   per demo node, and each node's scenario exactly as `make demo` writes it (config/demo.py: same
   nodes, seeds and tenants; agents.backends.sim.demo_fleet places the pods);
2. the real agent on each node, run as the demo's history runs it (config.demo.history_agent_args:
   sim backend, 60 s ticks and samples, the agent's default policy, uploading to gunicorn), for
   `--hours` simulated hours from midnight two days ago (UTC), all nodes at once; each `--agent-arg`
   is added to the agent's command line, to measure another agent policy (`--agent-arg=--predictor=current-use`);
3. `manage.py rollup_usage`, then `manage.py paired_report --json` of that day, and prints the
   organisation's figures (dynamic as run against every static alternative: feasible or not, cost,
   cards at the busiest minute) and the paired per-workload figures.

It answers "is dynamic below every static baseline on the demo's fleet?" in about a minute
instead of a `make demo` run; the demo's report covers whole days and its burst node's hours too,
which this leaves out (docs/billing.md, The demo's paired report).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from agents.backends.sim import demo_fleet  # noqa: E402 - after the path fix above
from bench.ingest import (  # noqa: E402
    ServerConfig,
    bench_database,
    child_env,
    drop_bench_database,
    gunicorn,
    manage,
    recreate_database,
    with_database,
)
from config.demo import NODES, TENANTS, history_agent_args  # noqa: E402


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hours", type=int, default=3, help="simulated hours per node (1-24)")
    parser.add_argument("--nodes", type=int, default=len(NODES), help=f"how many of the demo's {len(NODES)} nodes")
    parser.add_argument("--agent-arg", action="append", default=[], metavar="ARG",
                        help="added to every agent's command line (another policy: --agent-arg=--predictor=current-use)")
    parser.add_argument("--keep-db", action="store_true", help="keep the database for a look afterwards")
    parser.add_argument("--json-out", type=Path, help="also write the whole report as JSON here")
    args = parser.parse_args(argv)
    if not 1 <= args.hours <= 24:
        parser.error("--hours must be from 1 to 24")
    if not 1 <= args.nodes <= len(NODES):
        parser.error(f"--nodes must be from 1 to {len(NODES)}")
    return args


def meter(env: dict[str, str], url: str, work: Path, *, nodes: list[str], start: datetime, seconds: int,
          agent_args: list[str]) -> None:
    """Every node's agent over [start, start + seconds), at once, as the demo's history runs them."""
    procs = []
    for node, scenario in demo_fleet(nodes, tenants=TENANTS).items():
        token_file, scenario_file = work / f"{node}.token", work / f"{node}.scenario.json"
        token_file.write_text(manage(env, "create_node_token", node).strip().splitlines()[-1] + "\n")
        scenario_file.write_text(json.dumps(scenario))
        args = history_agent_args(sys.executable, url=url, token_file=token_file, scenario_file=scenario_file,
                                  start=start, seconds=seconds, spool=work / f"{node}.sqlite") + agent_args
        with (work / f"{node}.log").open("wb") as log:  # the agents' INFO lines, shown if one fails
            procs.append((node, subprocess.Popen(args, cwd=REPO, env=env, stdout=log,
                                                 stderr=subprocess.STDOUT)))
    for node, proc in procs:
        if proc.wait() != 0:
            tail = (work / f"{node}.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"the agent of {node} exited with {proc.returncode}:\n{tail}")


def _money(value: str | None) -> str:
    return "—" if value is None else f"{Decimal(value):,.2f}"


def print_report(report: dict[str, Any], *, hours: int, nodes: int, seconds: float) -> None:
    fleet, summary, currency = report["fleet"], report["summary"], report["currency"]
    dynamic = Decimal(fleet["dynamic"]["cost"])
    print(f"demo fleet: {nodes} node(s) x 8 A100 80GB, {report['workloads']} workloads, {hours} simulated hour(s); "
          f"{seconds:.0f} s in all")
    print(f"\norganisation ({currency}): every card-minute that held a workload")
    print("| allocation | feasible | cost | vs dynamic | cards at its busiest minute |")
    print("|---|---|---:|---:|---:|")
    print(f"| dynamic (as run) | yes | {_money(fleet['dynamic']['cost'])} | | "
          f"{fleet['dynamic']['peak_cards']} of {fleet['dynamic']['fleet_cards_at_peak']} |")
    for name, alt in fleet["alternatives"].items():
        cost = alt["cost"]
        versus = "" if cost is None else f"{(dynamic / Decimal(cost) - 1) * 100:+.1f} %"
        print(f"| {name} | {'yes' if alt['feasible'] else 'no'} | {_money(cost)} | {versus} | "
              f"{alt['peak_cards']} of {alt['fleet_cards_at_peak']} |")
    print(f"\nheadline baseline: {fleet['baseline']}, reduction {fleet['reduction_pct']}")
    print(f"\nper workload, what the ledger charged against each alternative's slice ({currency}):")
    print(f"dynamic charged {_money(summary['dynamic_cost'])}; " + "; ".join(
        f"{a} {_money(c)} ({summary['chargeback_reduction_pct'][a]:+.1f} %)" for a, c in summary["static_cost"].items()))
    print(f"containers per card {summary['containers_per_card']:.2f}, memory utilisation dynamic "
          f"{summary['memory_utilisation_dynamic_pct']:.1f} %, SM utilisation dynamic "
          f"{summary['sm_utilisation_dynamic_pct']:.1f} %")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    admin_url, name = bench_database(os.environ["DATABASE_URL"])
    name = name.removesuffix("_bench") + "_demo_savings"
    recreate_database(admin_url, name)
    env = child_env(with_database(admin_url, name))
    nodes = NODES[: args.nodes]
    day = (datetime.now(UTC) - timedelta(days=2)).replace(hour=0, minute=0, second=0, microsecond=0)
    began = time.monotonic()
    try:
        manage(env, "migrate", "--noinput")
        manage(env, "load_demo", *(arg for node in nodes for arg in ("--node", node)))
        with tempfile.TemporaryDirectory(prefix="demo-savings-") as work, \
                gunicorn(env, ServerConfig("sync", 2, 1)) as server:
            meter(env, f"http://127.0.0.1:{server.port}", Path(work), nodes=nodes, start=day,
                  seconds=args.hours * 3600, agent_args=args.agent_arg)
        manage(env, "rollup_usage")
        output = manage(env, "paired_report", "--from", f"{day:%Y-%m-%d}", "--to",
                        f"{day + timedelta(days=1):%Y-%m-%d}", "--json")
        report = json.loads(output[output.index("{"):])
    finally:
        if not args.keep_db:
            drop_bench_database(admin_url, name)
    if args.json_out:
        args.json_out.write_text(json.dumps(report, indent=1))
    print_report(report, hours=args.hours, nodes=len(nodes), seconds=time.monotonic() - began)
    return 0


if __name__ == "__main__":
    sys.exit(main())
