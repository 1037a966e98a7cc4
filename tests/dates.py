"""`make test-dates`: the whole suite with the clock of the whole process tree at the instants where
billing code breaks: the first minute of a month, the last minute of a month, 1 January and
29 February.

Each run goes through Debian's `faketime` with a fixed offset from the real clock, so every process
the suite starts (the embedded Postgres and Redis, gunicorn, Celery, the agents, Chromium) agrees on
the faked instant and time goes on passing from it; a run that starts in the last minute of a month
crosses into the next one while it runs, as a real deployment would. Monotonic clocks stay real, so
timeouts measure real seconds.

    python -m tests.dates                          # the next of each edge, the whole suite each
    python -m tests.dates --at 2027-06-30T23:59:00Z -- tests/billing -x
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shutil
import subprocess
import sys
import time
from datetime import UTC, date, datetime

# (month, day, time of day): the next occurrence of each from today, so the faked clock is always
# ahead of the real one (a browser keeps a cookie whose expiry is ahead of its own clock). The first
# minute of a month that follows February, the last minute of a 30-day month, the first minute of a
# year, and noon on 29 February of the next leap year.
EDGES = ((3, 1, "00:00:00"), (4, 30, "23:59:00"), (1, 1, "00:00:00"), (2, 29, "12:00:00"))
_SUMMARY = re.compile(r"^(?:=+ )?(\d+ (?:passed|failed).*?) in [\d.]+s", re.MULTILINE)
_SITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "faketime_site")


def next_edges(today: date) -> list[datetime]:
    """The next instant at or after `today` for each of EDGES."""
    instants = []
    for month, day, at in EDGES:
        year = today.year
        while True:
            try:
                candidate = datetime.fromisoformat(f"{year:04d}-{month:02d}-{day:02d}T{at}+00:00")
            except ValueError:  # 29 February of a common year
                candidate = None
            if candidate is not None and candidate.date() > today:
                break
            year += 1
        instants.append(candidate)
    return instants


def parse_instant(text: str) -> datetime:
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not an ISO 8601 instant like 2027-03-01T00:00:00Z") from exc


def faked(instant: datetime, command: list[str]) -> tuple[list[str], dict[str, str]]:
    """`command` with the clock at `instant`: an offset from now, the same for every child."""
    # Rounded up: the clock starts at the instant or a moment after it, never before.
    offset = math.ceil((instant - datetime.now(UTC)).total_seconds())  # noqa: TID251 - the offset needs the real clock
    # Monotonic clocks stay real (timeouts measure real seconds); faketime_site/sitecustomize.py
    # works around libfaketime 0.9.10's time.sleep under that setting in every Python process.
    path = os.pathsep.join(p for p in (_SITE, os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "FAKETIME_DONT_FAKE_MONOTONIC": "1", "FAKETIME_DONT_RESET": "1", "PYTHONPATH": path}
    return ["faketime", "-f", f"{offset:+d}", *command], env


def run_at(instant: datetime, pytest_args: list[str], log_dir: str) -> tuple[bool, str, float]:
    """Runs the suite at `instant`; returns (passed, pytest's summary line, seconds)."""
    command, env = faked(instant, [sys.executable, "-m", "config.embedded", "--",
                                   sys.executable, "-m", "pytest", *pytest_args])
    probe, probe_env = faked(instant, ["date", "-u", "+%Y-%m-%dT%H:%M:%SZ"])
    clock = subprocess.run(probe, env=probe_env, capture_output=True, text=True, check=True).stdout.strip()
    log = os.path.join(log_dir, f"test-dates-{instant:%Y%m%dT%H%M}.log")
    print(f"== {instant:%Y-%m-%dT%H:%M:%SZ}: the process tree's clock reads {clock}; log {log}", flush=True)
    started = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            sys.stdout.write(line)
        code = proc.wait()
    with open(log) as written:
        text = written.read()
    found = _SUMMARY.findall(text)
    return code == 0, found[-1] if found else f"exit {code}, no pytest summary", time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--at", type=parse_instant, action="append",
                        help="an instant to run at (repeatable); default: the next of each of EDGES")
    parser.add_argument("--log-dir", default=".data", help="where each run's full log goes (default .data)")
    parser.add_argument("pytest_args", nargs="*", help="after --: arguments for pytest (default: the whole suite)")
    args = parser.parse_args(argv)
    if shutil.which("faketime") is None:
        parser.error("faketime is not installed (Debian: apt-get install faketime; `make test-dates` does it)")
    os.makedirs(args.log_dir, exist_ok=True)
    instants = args.at or next_edges(datetime.now(UTC).date())  # noqa: TID251 - today's real date
    results = [(instant, *run_at(instant, args.pytest_args, args.log_dir)) for instant in instants]
    print("\n| clock at (UTC) | result | pytest | minutes |\n|---|---|---|---|")
    for instant, passed, summary, seconds in results:
        print(f"| {instant:%Y-%m-%d %H:%M:%S} | {'pass' if passed else 'FAIL'} | {summary} | {seconds / 60:.1f} |")
    return 0 if all(passed for _, passed, _, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
