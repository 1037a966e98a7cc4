"""Logging in: where a login's time goes, before and after storing passwords with Argon2id and
answering the login with the role's own page.

    python bench/login.py [--runs 15] [--busy 0 2] [--write-docs]

DATABASE_URL and REDIS_URL must be set (run it under `python -m config.embedded -- ...`, which
provides them). The benchmark drops and creates `<dbname>_loginbench` on the same server, migrates
it, and drops it at the end.

1. CPU seconds of one password check, in this process, median of --runs: Django's default hasher
   before (PBKDF2-SHA256, 1,000,000 iterations) and ours (billing.services.identity.passwords).
2. A login over HTTP, as a browser does it, against gunicorn on loopback with the product's
   gunicorn settings and 3 sync workers (as `make demo` runs it): GET the login page (not timed:
   the person has it open), then timed: POST the form and follow every redirect until the role's
   page has arrived (finance: the cost dashboard, over an empty ledger, so the page itself costs
   little and the login's own work shows). Two servers, the same code otherwise:
   - before: bench/login_before_settings.py, Django's default PASSWORD_HASHERS (PBKDF2 first) and
     Django's own LoginView (answers "/", which redirects to the role's page), the user's password
     stored with PBKDF2;
   - after: config.settings as shipped, the password stored with Argon2id.
   Logins alternate between the two servers, so both see the same noise.
3. `--busy N` repeats step 2 with N processes spinning on the CPU beside it: `make demo` keeps its
   agents, Celery worker and beat, rollups and live pages busy on the same cores, and the issue was
   measured there (1.1-4.9 s). Each figure is the median, 90th percentile and worst of --runs logins.

A benchmark is not a test: it reports numbers and never fails on speed.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import re
import shlex
import statistics
import sys
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # `python bench/login.py` puts bench/, not the repository, on the path

from bench.ingest import (  # noqa: E402 - after the path fix above
    Server,
    ServerConfig,
    child_env,
    gunicorn,
    machine_info,
    manage,
    recreate_database,
    setup_django,
    with_database,
    write_docs,
)

SECTION_TITLE = "## Login"
PASSWORD = "bench-login-Password-1"  # noqa: S105 - a throwaway user in a throwaway database
SERVER = ServerConfig("sync", 3, 1)  # make demo's web process (config/demo.py)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Timing:
    """Seconds of --runs samples: median, 90th percentile, worst."""

    samples: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def p90(self) -> float:
        ordered = sorted(self.samples)
        return ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]

    @property
    def worst(self) -> float:
        return max(self.samples)


@dataclass(frozen=True)
class LoginRun:
    variant: str
    busy: int
    post: Timing  # the POST alone (the password check, the session, axes' bookkeeping)
    total: Timing  # the POST and every redirect until the role's page has arrived
    hops: int  # redirects followed after the POST's answer


def hash_cpu_seconds(runs: int) -> dict[str, Timing]:
    """CPU seconds of one check_password per hasher, this process only."""
    from django.contrib.auth.hashers import check_password, make_password

    out = {}
    for label, hasher in (("PBKDF2-SHA256, 1,000,000 iterations (before)", "pbkdf2_sha256"),
                          ("Argon2id, 32 MiB, 2 passes, 1 lane (after)", "argon2")):
        encoded = make_password(PASSWORD, hasher=hasher)
        samples = []
        for _ in range(runs):
            started = time.process_time()
            assert check_password(PASSWORD, encoded)
            samples.append(time.process_time() - started)
        out[label] = Timing(tuple(samples))
    return out


def store_password(username: str, hasher: str) -> None:
    from django.contrib.auth.hashers import make_password
    from django.contrib.auth.models import Group, User

    user = User.objects.get_or_create(username=username)[0]
    user.groups.add(Group.objects.get_or_create(name="finance")[0])
    User.objects.filter(pk=user.pk).update(password=make_password(PASSWORD, hasher=hasher))


def one_login(base: str, username: str) -> tuple[float, float, int]:
    """(POST seconds, POST and redirects seconds, redirects followed) of one login in a new session."""
    session = requests.Session()
    form = session.get(f"{base}/accounts/login/", timeout=60)
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text)
    assert token, form.text[:500]
    started = time.perf_counter()
    answer = session.post(f"{base}/accounts/login/", timeout=60, allow_redirects=False,
                          data={"username": username, "password": PASSWORD, "csrfmiddlewaretoken": token.group(1)},
                          headers={"Referer": f"{base}/accounts/login/"})
    post_s = time.perf_counter() - started
    hops = 0
    while answer.status_code == 302:
        hops += 1
        answer = session.get(urllib.parse.urljoin(base, answer.headers["Location"]), timeout=60, allow_redirects=False)
    total_s = time.perf_counter() - started
    assert answer.status_code == 200, (answer.status_code, answer.url)
    assert "/accounts/login/" not in answer.url, answer.url
    return post_s, total_s, hops


def _spin() -> None:
    while True:
        pass


@contextlib.contextmanager
def busy(processes: int) -> Iterator[None]:
    """`processes` processes spinning on the CPU until the block ends."""
    spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(processes)]
    for p in spinners:
        p.start()
    try:
        yield
    finally:
        for p in spinners:
            p.terminate()
            p.join()


def measure_logins(servers: dict[str, tuple[Server, str]], runs: int, busy_processes: int) -> list[LoginRun]:
    samples: dict[str, list[tuple[float, float, int]]] = {v: [] for v in servers}
    with busy(busy_processes):
        for server, username in servers.values():
            one_login(f"http://127.0.0.1:{server.port}", username)  # warm-up: the worker's first import
        for _ in range(runs):
            for variant, (server, username) in servers.items():  # alternating, so both see the same noise
                samples[variant].append(one_login(f"http://127.0.0.1:{server.port}", username))
    return [LoginRun(variant, busy_processes, Timing(tuple(s[0] for s in got)), Timing(tuple(s[1] for s in got)),
                     max(s[2] for s in got)) for variant, got in samples.items()]


def report(machine: dict[str, str], hashes: dict[str, Timing], logins: list[LoginRun], argv: list[str],
           load: tuple[float, float, float]) -> str:
    command = "python -m config.embedded -- .venv/bin/python bench/login.py " + shlex.join(argv)
    lines = [SECTION_TITLE, "", f"Measured {datetime.now(UTC):%Y-%m-%d %H:%M} UTC with", "", "```", command.strip(), "```",
             "", "Machine:", "", *(f"- {k}: {v}" for k, v in machine.items()),
             f"- load average when the run started: {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f} (1, 5, 15 min; "
             "other work on the machine, not the benchmark's)", "",
             "CPU seconds of one password check (this process, median):", "",
             "| hasher | CPU s, median | worst |", "|---|---:|---:|"]
    lines += [f"| {label} | {t.median:.3f} | {t.worst:.3f} |" for label, t in hashes.items()]
    lines += ["", "A login over HTTP (gunicorn, 3 sync workers, loopback), seconds from submitting the form until "
              "the role's page has arrived; the POST alone beside it:", "",
              "| variant | CPU spinners beside it | redirects | POST median | total median | total p90 | total worst | "
              "total, after ÷ before |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for b in sorted({r.busy for r in logins}):
        runs = {r.variant: r for r in logins if r.busy == b}
        for variant, r in runs.items():
            ratio = f"{r.total.median / runs['before'].total.median:.0%}" if variant == "after" else ""
            lines.append(f"| {variant} | {b} | {r.hops} | {r.post.median:.3f} | {r.total.median:.3f} | {r.total.p90:.3f} | "
                         f"{r.total.worst:.3f} | {ratio} |")
    return "\n".join([*lines, "", *analysis(hashes, logins)]) + "\n"


def analysis(hashes: dict[str, Timing], logins: list[LoginRun]) -> list[str]:
    before_cpu, after_cpu = (t.median for t in hashes.values())
    quiet = min(r.busy for r in logins)
    by = {(r.variant, r.busy): r for r in logins}
    return [
        f"The password check is the login's CPU: {before_cpu:.2f} s with PBKDF2 against {after_cpu:.2f} s with "
        f"Argon2id ({after_cpu / before_cpu:.0%}). Wall time is that CPU times how many processes share the "
        "cores, so a busy host multiplies it: "
        + "; ".join(f"with {b} spinners beside it the login took {by[('before', b)].total.median:.2f} s before and "
                    f"{by[('after', b)].total.median:.2f} s after (medians)" for b in sorted({r.busy for r in logins}))
        + f". The POST alone went from {by[('before', quiet)].post.median:.2f} s to {by[('after', quiet)].post.median:.2f} s "
        f"and one redirect is gone (the chain through \"/\"). The rest of a login (the session, django-axes' "
        "bookkeeping of attempts and their queries) is a few hundredths of a second of CPU.",
    ]


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15, help="logins per variant and condition (default 15)")
    parser.add_argument("--busy", type=int, nargs="+", default=[0, 2],
                        help="CPU spinners beside the logins, one condition each (default: 0 2)")
    parser.add_argument("--write-docs", action="store_true", help="replace the section in docs/benchmarks.md")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    admin_url = os.environ.get("DATABASE_URL")
    if not admin_url or not os.environ.get("REDIS_URL"):
        log("DATABASE_URL and REDIS_URL must be set (run under `python -m config.embedded -- ...`)")
        return 2
    name = (urllib.parse.urlsplit(admin_url).path.lstrip("/") or "postgres") + "_loginbench"
    url = with_database(admin_url, name)
    recreate_database(with_database(admin_url, "postgres"), name)
    try:
        env = child_env(url)
        manage(env, "migrate", "--no-input")
        setup_django(env)
        load = os.getloadavg()
        log("password checks")
        hashes = hash_cpu_seconds(args.runs)
        store_password("bench-before", "pbkdf2_sha256")
        store_password("bench-after", "argon2")
        before_env = {**env, "DJANGO_SETTINGS_MODULE": "bench.login_before_settings"}
        logins: list[LoginRun] = []
        with gunicorn(before_env, SERVER) as before, gunicorn(env, SERVER) as after:
            servers = {"before": (before, "bench-before"), "after": (after, "bench-after")}
            for b in args.busy:
                log(f"logins, {b} CPU spinners beside them")
                logins += measure_logins(servers, args.runs, b)
        from django.db import connections

        connections.close_all()
        section = report(machine_info(url), hashes, logins, argv, load)
    finally:
        recreate_database(with_database(admin_url, "postgres"), name, drop_only=True)
    print(section)
    if args.write_docs:
        write_docs(section, SECTION_TITLE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
