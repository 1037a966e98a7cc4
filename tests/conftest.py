"""Shared fixtures. Tests run on real Postgres and Redis: DATABASE_URL / REDIS_URL, or the
embedded servers that `make test` starts (python -m config.embedded)."""

from __future__ import annotations

import functools
import gzip
import json
import os
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar

import hypothesis
import pytest
from django.conf import settings as django_settings
from django.contrib.auth.hashers import make_password
from django.contrib.auth.models import Group, User
from django.test import Client
from django.test.testcases import QuietWSGIRequestHandler
from django.utils import translation

from billing.ledger.models import GpuHour, UsageHour
from billing.ledger.rollup import rebuild_days
from billing.models import Tenant, TenantMembership
from billing.services.budgets.spend import BudgetEvent, BudgetTransition
from billing.services.identity.tokens import IssuedToken, issue_node_token
from tests import clock, workers
from tests import flush as test_flush
from tests.demo_process import Demo, demo_environment, running_demo

if TYPE_CHECKING:
    from tests.test_slim_agent import AgentInstall

# Hypothesis times each example (a 200 ms deadline, the too_slow health check). On a shared machine
# running the suite in several processes, that measures the load, not the code: a property is
# checked on the same examples either way, and speed is measured in bench/, not in tests.
hypothesis.settings.register_profile(
    "suite", deadline=None, suppress_health_check=[hypothesis.HealthCheck.too_slow])
hypothesis.settings.load_profile("suite")

# The live_server fixture's handler writes a response's headers and its body in two sends; with
# Nagle's algorithm on, the body waits for the client's delayed ACK of the headers (about 40 ms on
# Linux), so every request to it took 40 ms more than its view: 66 ms for a 2 ms refusal, most of
# the wall time of the tests that send it a thousand requests (the hostile-input probe, `st run`).
QuietWSGIRequestHandler.disable_nagle_algorithm = True

# The flush after each transactional test leaves content types and permissions in place instead of
# deleting and rebuilding the same rows (tests/flush.py): most of each such test's teardown.
test_flush.install()


class GpuSpec(TypedDict):
    """A card's model and size, as the agent reports it and as tests create its Gpu row."""

    model: str
    memory_mb: int
    sm_count: int


A100: GpuSpec = {"model": "NVIDIA A100-SXM4-80GB", "memory_mb": 81920, "sm_count": 108}


# Two workloads sharing GPU 0: 10 % and 20 % of the card (memory and SMs alike).
SHARED_GPU_WORKLOADS = [
    {"gpu": 0, "tenant": "acme", "pod": "bert-1", "sla_tier": "gold", "mem_used": 8192.0, "mem_granted": 8192.0,
     "sm_used": 10.8, "sm_granted": 10.8},
    {"gpu": 0, "tenant": "globex", "pod": "llm-1", "sla_tier": "silver", "mem_used": 16384.0,
     "mem_granted": 16384.0, "sm_used": 21.6, "sm_granted": 21.6},
]


@pytest.fixture
def one_usd_per_gpu_second(db):
    """An A100 rate card at 3600 USD per GPU-hour, so charges read as GPU-seconds."""
    from decimal import Decimal

    from billing.models import RateCard

    return RateCard.objects.create(gpu_model=A100["model"], currency="USD", price_per_gpu_hour=Decimal("3600"),
                                   effective_from=datetime(2020, 1, 1, tzinfo=UTC), source_url="https://example.org")


@pytest.fixture
def node_token(db) -> IssuedToken:
    return issue_node_token(node_name="gpu-node-1", now=clock.now(), actor_label="test")


# The slim agent's test (tests/test_slim_agent.py) installs the agent with pip, which needs no demo:
# after the demo's start-up it was minutes of the suite's longest chain.
SLIM_AGENT_TEST = "tests/test_slim_agent.py::"


@pytest.fixture(scope="session")
def slim_agent_install(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentInstall]:
    """The agent's install in a fresh venv, started in the background (the demo fixture starts it
    first when the slim agent's test is in the run, so the two overlap)."""
    from tests.test_slim_agent import start_agent_install

    install = start_agent_install(tmp_path_factory.mktemp("slim-agent"))
    yield install
    if install.proc.poll() is None:
        install.proc.kill()
        install.proc.wait()


@pytest.fixture(scope="session")
def demo(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    """One `make demo` for every test that reads the running product (browser journeys, the page
    sums walk, the slim agent, the allocation API): a demo takes minutes to start and simulate its
    history, and each one more was minutes more of the suite. Serially its tests run last
    (pytest_collection_modifyitems), so it never runs beside the rest; under pytest-xdist they are
    one group, which starts first (tests/workers.py): it is the longest part of the suite."""
    data = tmp_path_factory.mktemp("shared-demo")
    # A simulated day of this month before today gives the charts over time something to draw
    # (on the 1st there is none, as `make test-dates` runs it); each more day is about 40 s of the
    # demo's start-up, on the suite's longest path. `make screenshots` asks for a week.
    days = int(os.environ.get("VGPU_BROWSER_HISTORY_DAYS", "1"))
    if any(item.nodeid.startswith(SLIM_AGENT_TEST) for item in request.session.items):
        request.getfixturevalue("slim_agent_install")  # runs while the demo starts (SLIM_AGENT_TEST)
    with demo_environment(data, name=f"vgpu_shared_demo_{os.getpid()}", redis_db=workers.redis_db("shared-demo"),
                          history_days=days) as env:
        # A web worker's first request imports the whole service (scipy included); on a loaded
        # machine that outlasts gunicorn's default 30 s worker timeout, and the demo never gets healthy.
        env["GUNICORN_CMD_ARGS"] = "--timeout 300"
        with running_demo(env, startup_timeout_s=600) as running:
            running.wait_for_history(timeout_s=600)
            running.wait_for_recent_days(timeout_s=600)
            yield running


# The shared demo's last test: it lowers a budget below the spend and stops the demo with Ctrl-C.
DEMO_STOPPED_BY = "tests/test_demo.py::"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests on the shared demo last, in their own order: the demo starts with the first of them
    and stops at the end of the session, so it never loads the machine under the other tests.
    The test that stops it comes last of all."""
    items.sort(key=lambda item: ("demo" in getattr(item, "fixturenames", ()), item.nodeid.startswith(DEMO_STOPPED_BY)))


def pytest_collection_finish(session: pytest.Session) -> None:
    """From here on tests may read the clock (tests/clock.py refuses while collecting)."""
    clock.collection_finished()


# The password of the users tests create (user_in, new_user). Few tests log in with it; most sign in
# with force_login.
USER_PASSWORD = "pw-not-used-123"


@functools.cache
def _hashed_user_password() -> str:
    """USER_PASSWORD as the settings' first hasher stores it, hashed once per process: each Argon2id
    hash is about 0.07 s of CPU (billing/services/identity/passwords.py), and the suite creates well
    over a thousand users, which was a tenth of the CPU of its unit tests. Every user gets the same
    stored value, as create_user would give it: the same hasher, parameters and password, only the
    salt shared. tests/billing/test_passwords.py checks create_user's own hashing."""
    return make_password(USER_PASSWORD)


def new_user(username: str, **fields: Any) -> User:
    """A user whose password is USER_PASSWORD (see _hashed_user_password)."""
    return User.objects.create(username=username, password=_hashed_user_password(), **fields)


def user_in(group: str | None = None, tenant: str | None = None, *, tenants: tuple[str, ...] = ()) -> User:
    """A user in `group` (finance, platform-admin) and/or a member of `tenant` / `tenants`
    (created when missing); their password is USER_PASSWORD."""
    slugs = (*tenants, *((tenant,) if tenant else ()))
    user = new_user(f"u-{group}-{'-'.join(slugs)}")
    if group:
        user.groups.add(Group.objects.get_or_create(name=group)[0])
    for slug in slugs:
        TenantMembership.objects.create(user=user, tenant=Tenant.objects.get_or_create(slug=slug,
                                                                                      defaults={"name": slug})[0])
    return user


def state_transitions(events: list[BudgetEvent]) -> list[BudgetTransition]:
    """evaluate_budgets' events where they must all be state transitions (no forecast crossing)."""
    transitions = [e for e in events if isinstance(e, BudgetTransition)]
    assert len(transitions) == len(events), events
    return transitions


HourRow = TypeVar("HourRow", UsageHour, GpuHour)


def with_day(row: HourRow) -> HourRow:
    """Derive the day ledger for a hour row a test wrote by hand (the rollup derives days itself)."""
    day = row.hour.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    rebuild_days(start=day, end=day + timedelta(days=1), gpu_uuid=row.gpu_uuid)
    return row


def healthz_as_admin() -> Any:
    """GET /healthz as a staff session: only admins see the per-check detail (billing.web.health)."""
    user, _ = User.objects.get_or_create(username="healthz-admin", defaults={"is_staff": True})
    client = Client()
    client.force_login(user)
    return client.get("/healthz")


def iso(t: datetime) -> str:
    return t.astimezone(UTC).isoformat().replace("+00:00", "Z")


def make_batch(
    *,
    node: str = "gpu-node-1",
    seq: int = 1,
    start: datetime,
    seconds: int = 10,
    gpus: int = 1,
    workloads: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A valid batch: `seconds` 1-second samples per workload. Workload dicts give the GPU
    index and per-second rates (mem_used, mem_granted, sm_used, sm_granted, pcie)."""
    gpu_list = [{"uuid": f"GPU-{node}-{i}", **A100} for i in range(gpus)]
    workloads = workloads if workloads is not None else [
        {"gpu": 0, "tenant": "acme", "pod": "bert-1", "mem_used": 312.5, "mem_granted": 512.0,
         "sm_used": 7.8, "sm_granted": 13.5, "pcie": 3.1},
    ]
    samples = [
        {
            "start": iso(start + timedelta(seconds=s)), "seconds": 1, "gpu": gpu_list[w["gpu"]]["uuid"],
            "tenant": w["tenant"], "namespace": w.get("namespace", f"{w['tenant']}-prod"), "pod": w["pod"],
            "container": "server", "pod_uid": w.get("pod_uid", f"uid-{w['pod']}"),
            "sla_tier": w.get("sla_tier", "gold"),
            "mem_used_mb_s": w["mem_used"], "mem_granted_mb_s": w["mem_granted"],
            "sm_used_s": w["sm_used"], "sm_granted_s": w["sm_granted"], "pcie_mb": w.get("pcie", 0.0),
        }
        for s in range(seconds)
        for w in workloads
    ]
    return {
        "schema": "vgpu-ledger/usage-batch/v1",
        "node": node,
        "batch_seq": seq,
        "window": {"start": iso(start), "end": iso(start + timedelta(seconds=seconds))},
        "gpus": gpu_list,
        "samples": samples,
    }


@pytest.fixture
def post_batch(client: Client, node_token: IssuedToken) -> Callable[..., Any]:
    def post(payload: Any, *, token: str | None = None, gzip_body: bool = False, raw: bytes | None = None,
             content_type: str = "application/json", **headers: str) -> Any:
        body = raw if raw is not None else json.dumps(payload).encode()
        extra: dict[str, Any] = {"HTTP_AUTHORIZATION": f"Bearer {token or node_token.token}"} if token != "" else {}
        if gzip_body:
            body = gzip.compress(body)
            extra["HTTP_CONTENT_ENCODING"] = "gzip"
        for k, v in headers.items():
            extra[f"HTTP_{k.upper()}"] = v
        return client.generic("POST", "/api/v1/usage/batches", body, content_type=content_type, **extra)

    return post


@pytest.fixture
def mid_month(time_machine) -> datetime:
    """Holds this process's clock (ticking) at noon on the 15th of the current month, for tests of
    "this month" that are not about a month's edges (those have tests of their own). Only for
    tests that run in this process: a subprocess keeps the real clock."""
    today = clock.now()
    noon = datetime(today.year, today.month, 15, 12, tzinfo=UTC)
    time_machine.move_to(noon, tick=True)
    return noon


@pytest.fixture
def minute_start() -> datetime:
    """A whole UTC minute a little in the past, so windows are never in the future."""
    return clock.now().replace(second=0, microsecond=0) - timedelta(minutes=10)


@pytest.fixture(autouse=True)
def _truncate_raw_samples_after_transactional_tests(request, django_db_blocker):
    """Django's flush after a transactional test empties model tables only; the raw sample
    table is not a model, so empty it too, or its rows would leak into later rollups.

    The day partitions such a test created (raw samples, minutes) are committed too, and a later
    test that lists partitions (retention) would find them: they are dropped, back to what the
    migrations leave (the minute tables' DEFAULT partitions only). Serially pytest-django runs the
    transactional tests last, which hid this; a pytest-xdist worker runs tests in any order.

    A page built in such a test reads beside itself on side connections (committed rows can share
    its snapshot, billing.queries.snapshot): they are closed, so none is left on the test database."""
    yield
    marker = request.node.get_closest_marker("django_db")
    transactional = bool(marker and marker.kwargs.get("transaction")) or bool(
        {"transactional_db", "live_server", "celery_worker", "ingest_server"} & set(request.fixturenames)
    )
    if transactional:
        from django.db import connection

        from billing.ledger import partitions
        from billing.queries import snapshot

        with django_db_blocker.unblock(), connection.cursor() as cur:
            cur.execute("TRUNCATE billing_raw_sample")
            cur.execute(
                "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                "JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = ANY(%s) AND c.relname NOT LIKE %s",
                [[partitions.RAW_TABLE, *partitions.MINUTE_TABLES], "%\\_default"],
            )
            for (name,) in cur.fetchall():
                cur.execute(f'DROP TABLE IF EXISTS "{name}"')
        partitions._known.clear()
        snapshot.close_side_threads()


@pytest.fixture(autouse=True)
def _tenants_as_the_samples_claim(settings):
    """Most tests post samples of tenant `acme` in namespace `acme-prod` with no namespace listed on
    any tenant (make_batch); they test metering and billing, not the mapping, so they run with the
    opt-in rule that trusts the claim for unlisted namespaces. The shipped default ("namespace") is
    what the demo runs and what tests/billing/test_node_self.py and tests/hostile/test_nodes.py set."""
    settings.VGPU_TENANT_UNMAPPED = "claim"


@pytest.fixture(autouse=True)
def _each_test_starts_in_english():
    """A request by a user whose language is Chinese activates it for the thread, and Django leaves
    it active after the test client's response: the next test on that worker read its messages in
    Chinese. Every test starts in the default language."""
    translation.activate(django_settings.LANGUAGE_CODE)


@pytest.fixture(autouse=True)
def _forget_per_process_ingest_caches():
    """Ingest remembers, per process, partitions it created and inventory it wrote recently;
    flushes between tests remove those rows, so each test starts with empty memories."""
    from billing.ledger import batches, partitions
    from billing.services.identity import tokens

    batches._seen.clear()
    partitions._known.clear()
    tokens._used.clear()
    _forget_auth_throttle()


def _forget_auth_throttle() -> None:
    """Failed-token counters live in Redis per client address, and every test client is
    127.0.0.1: without this, one test's bad tokens would throttle the next test's."""
    import redis
    from django.conf import settings

    from billing.services.identity import auth_throttle

    auth_throttle._refreshed.clear()
    client = redis.Redis.from_url(settings.REDIS_URL)
    keys = list(client.scan_iter(match="*vgpu:auth-*", count=1000))
    if keys:
        client.delete(*keys)
