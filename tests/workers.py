"""The suite on several processes (pytest-xdist): `make test` runs `pytest -n 3 --dist loadgroup`.
Loaded with `-p tests.workers` (pyproject.toml's addopts), before pytest-django reads the settings.

What each worker gets of its own:

- its test database: pytest-django's `test_<name>_gwN`, from DATABASE_URL;
- its Redis db, counted down from REDIS_URL's: the Celery broker, the cache and the auth
  throttle's counters live there, and one worker's flushes must not reach another's. The demos
  the tests start take the dbs below the workers' (`redis_db`), so two runs on one server with
  REDIS_URLs far enough apart never meet either.

What the scheduler is told: every test on the shared demo (the `demo` fixture) is in the
xdist group "demo", which runs on one worker and starts first (its tests sort first): it is the
longest part of the suite, and everything else fits beside it. Tests that time what they do
against the machine's load (`serial` below) share a group too, so they never run beside each other.
"""

from __future__ import annotations

import os
import urllib.parse

import pytest

# Redis's default `databases`; the dbs count down from REDIS_URL's and wrap at 0.
REDIS_DATABASES = 16
# Roles below the workers' dbs, in this order.
_DEMO_ROLES = ("shared-demo", "soak")

# Tests that assert on wall time, a subprocess's start-up or a lock wait: they run in one group,
# one after another on one worker, so two of them on a 2-core machine never measure each other.
SERIAL_GROUP = "load-sensitive"
SERIAL = (
    "tests/agents/test_shutdown.py::",  # an agent's start-up inside a few seconds' budget
    "tests/bench/test_fleet_bench.py::",  # the fleet harness: its gunicorn and rollup processes waited for within deadlines
    # A guard on the fuzzing's wall time (the in-process schemathesis test has none: it is only slow).
    "tests/billing/test_openapi.py::test_schemathesis_on_a_live_server_",
    "tests/billing/test_retention.py::test_a_drop_gives_way_",  # ANALYZE within 2 s
    "tests/test_soak.py::",  # the whole product under faults, on deadlines
)
# Tests that took 2 s or more on this 2-core machine (pytest --durations, docs/architecture.md's
# section on tests), besides those on a demo: `make test-quick` leaves them out.
SLOW = (
    *SERIAL,
    "tests/agents/test_gpu_check.py::test_mps_stage_without_a_driver_fails_on_its_clients_and_still_cleans_up",
    "tests/agents/test_loop.py::test_granted_per_gpu_per_second_never_exceeds_capacity_in_produced_batches",
    "tests/agents/test_prediction.py::test_online_calibration_holds_the_under_prediction_rate_at_the_target",
    "tests/allocator/test_fairshare.py::test_a_tick_depends_on_the_workloads_not_on_their_order",
    "tests/allocator/test_fairshare.py::test_a_tick_grants_no_workload_more_than_its_demand_nor_less_memory_than_it_uses",
    "tests/allocator/test_fairshare.py::test_a_tick_meets_every_guarantee_whenever_the_gpu_can",
    "tests/allocator/test_fairshare.py::test_a_tick_never_grants_more_than_a_gpu_has",
    "tests/allocator/test_fairshare.py::test_a_tick_shares_each_resource_as_fair_share_does_on_the_same_claims",
    "tests/allocator/test_fgd_experiment.py::test_bestfit_on_the_default_trace_lands_near_the_papers_93",
    "tests/allocator/test_fgd_experiment.py::test_fgd_on_the_default_trace_lands_near_the_papers_95_4",
    "tests/allocator/test_rebalance.py::test_no_plan_of_a_small_pool_frees_more_or_evicts_fewer_for_as_much",
    "tests/billing/test_admin_rate_cards.py::test_each_broken_rule_is_a_400_with_its_message_and_changes_nothing",
    "tests/billing/test_allocation_api.py::test_any_parameters_answer_200_or_a_400_naming_one",
    "tests/billing/test_celery_and_health.py::",
    "tests/billing/test_credit_notes.py::test_an_issued_invoice_copies_issuer_terms_and_tax_",
    "tests/billing/test_daily_ledger.py::test_days_are_the_exact_sums_of_hours_after_rollups_of_random_batches",
    "tests/billing/test_explore.py::test_a_member_sees_only_its_tenant_however_the_query_is_crafted",
    "tests/billing/test_explore.py::test_every_level_adds_up_to_the_row_that_opened_it",
    "tests/billing/test_finance_dashboard.py::test_dashboard_query_count_does_not_grow_",
    "tests/billing/test_focus_dataset.py::test_the_dataset_adds_up_to_the_card_cost_of_every_gpu_hour_",
    "tests/billing/test_focus_validator.py::",
    "tests/billing/test_forecast.py::",
    "tests/billing/test_ingest_fields.py::test_any_valid_label_set_round_trips_",
    "tests/billing/test_ingest_hostile.py::test_any_batch_the_api_accepts_rolls_up",
    "tests/billing/test_ledger_integrity.py::test_healthz_turns_degraded_when_the_rollup_falls_behind",
    "tests/billing/test_openapi.py::test_schemathesis_against_the_running_app_finds_no_server_error",
    "tests/billing/test_login_lockout.py::",
    "tests/billing/test_node_identity.py::test_an_agent_pods_token_uploads_for_its_node_and_registers_the_node_audited",
    "tests/billing/test_node_self.py::",
    "tests/billing/test_portal.py::test_member_of_one_tenant_is_sent_to_it_and_of_two_sees_only_those",
    "tests/billing/test_pricing.py::test_charges_plus_idle_equal_the_whole_card_exactly_and_nothing_is_negative",
    "tests/billing/test_retention.py::test_the_demo_beat_schedules_retention_and_analysis",
    "tests/billing/test_retention.py::test_the_migration_partitions_existing_minute_rows_by_day_and_keeps_every_row",
    "tests/billing/test_rollup_sharded.py::",
    "tests/billing/test_scoped_budgets.py::test_a_tenants_namespace_budgets_add_up_to_its_own",
    "tests/billing/test_service_metrics_gunicorn.py::",
    "tests/billing/test_spend_equivalence.py::test_the_preview_from_closed_days_and_hours_is_the_hour_based_close",
    "tests/billing/test_undelivered.py::test_a_report_is_open_until_a_redrive_delivers_it_",
    "tests/billing/test_unpriced.py::test_the_migration_approves_every_model_a_rate_card_names",
    "tests/billing/test_unpriced.py::test_the_nodes_page_healthz_and_metrics_flag_gpus_",
    "tests/billing/test_web_polish.py::test_someone_in_finance_and_admin_lands_on_the_finance_page",
    "tests/billing/test_webhook_tls.py::",
    "tests/deploy/test_monitoring.py::test_a_real_agents_exposition_passes_promtool",
    "tests/deploy/test_monitoring.py::test_each_alert_fires_on_its_case_and_not_on_a_healthy_system",
    "tests/deploy/test_production_settings.py::test_cluster_callers_reach_the_web_container_over_http_by_pod_ip_or_service_name",
    "tests/hostile/test_auth.py::",
    "tests/hostile/test_downloads.py::test_every_csv_the_product_serves_is_inert",
    "tests/hostile/test_downloads.py::test_every_node_controlled_name_of_a_batch_is_refused_at_ingest",
    "tests/hostile/test_inputs.py::test_no_page_parameter_or_form_field_answers_a_server_error",
    "tests/hostile/test_known_cases.py::",
    "tests/hostile/test_nodes.py::",
    "tests/hostile/test_unpriced.py::",
    "tests/test_agent_tokenreview.py::test_the_agent_uploads_with_its_service_account_token_through_tokenreview_and_loses_nothing_in_an_outage",
    "tests/test_layering.py::test_no_module_outside_the_ledger_names_a_ledger_table_in_sql",
    "tests/test_translations.py::",
    "tests/billing/test_saved_views.py::test_two_workers_at_once_send_each_occurrence_once",
    "tests/billing/test_energy_prices.py::test_the_portal_shows_cost_and_co2e_beside_kwh_and_its_csv_writes_them",
)


def _base_redis_url() -> str:
    return os.environ.get("VGPU_TEST_REDIS_URL") or os.environ.get("REDIS_URL", "")


def _worker_index() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(worker.removeprefix("gw")) if worker.startswith("gw") else 0


def _worker_count() -> int:
    return int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)


def _db_of(url: str) -> int:
    path = urllib.parse.urlsplit(url).path.strip("/")
    return int(path) if path.isdigit() else 0


def _with_db(url: str, db: int) -> str:
    return urllib.parse.urlunsplit(urllib.parse.urlsplit(url)._replace(path=f"/{db}"))


def redis_db(role: str) -> int:
    """The Redis db of a demo (or the soak) this run starts: below every worker's, the same
    number in every worker."""
    offset = _worker_count() + _DEMO_ROLES.index(role)
    return (_db_of(_base_redis_url()) - offset) % REDIS_DATABASES


def _give_this_worker_its_redis_db() -> None:
    base = _base_redis_url()
    if not base:
        return  # settings refuse to start without REDIS_URL and say why
    # The run's REDIS_URL, for redis_db() in this process and any it starts.
    os.environ["VGPU_TEST_REDIS_URL"] = base
    os.environ["REDIS_URL"] = _with_db(base, (_db_of(base) - _worker_index()) % REDIS_DATABASES)


# At import, before pytest-django imports config.settings (which reads REDIS_URL once).
_give_this_worker_its_redis_db()


def _fixtures(item: pytest.Item) -> tuple[str, ...]:
    return tuple(getattr(item, "fixturenames", ()))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks before xdist reads them (it runs after this, tryfirst): the shared demo's tests in the
    "demo" group, the load-sensitive ones in theirs."""
    for item in items:
        fixtures = _fixtures(item)
        if "demo" in fixtures:
            item.add_marker(pytest.mark.demo)
        if item.nodeid.startswith(SERIAL):
            item.add_marker(pytest.mark.serial)
        if item.get_closest_marker("demo") or item.nodeid.startswith(SLOW):
            item.add_marker(pytest.mark.slow)
        if "demo" in fixtures:
            item.add_marker(pytest.mark.xdist_group("demo"))
        elif item.get_closest_marker("serial"):
            item.add_marker(pytest.mark.xdist_group(SERIAL_GROUP))


# How much a worker off the suite's longest chains gives way (os.nice; `make test` nices lint as
# much). The run is CPU-bound on a 2-core machine and its length is the shared demo's chain (its
# start-up, then its tests one after another on one worker); the other tests only have to fit beside
# it. At the same priority a third worker took a third of the CPU, from the demo and its browser as
# much as from anything, and the chain grew by as much. At nice 5 it gets about a third of the share
# of a process at 0 when the CPU is contended, and every cycle the chains leave idle (the demo's
# history, their sleeps), and all of it once they are done. Not more: tests on it still wait on
# subprocesses they start (a Celery worker, gunicorn) within deadlines. The load-sensitive group is
# not niced: it asserts on wall time.
OFF_THE_CHAIN_NICE = 5


class _OnWorkers:
    """After every other plugin's collection hook, on a worker of `--dist loadgroup`."""

    def __init__(self) -> None:
        self._first_test_seen = False

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        """The scheduler hands out each group whole, with a worker's first tests: a worker whose
        first test is in neither chain's group never runs one, and gives way (OFF_THE_CHAIN_NICE)."""
        if self._first_test_seen:
            return
        self._first_test_seen = True
        if not (item.get_closest_marker("demo") or item.get_closest_marker("serial")):
            os.nice(OFF_THE_CHAIN_NICE)

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        # The scheduler hands out the groups first (the largest first), then single tests in
        # collection order: the slow ones first, so none of them starts last and keeps the run waiting.
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)
        self._group_suffix(items)

    @staticmethod
    def _group_suffix(items: list[pytest.Item]) -> None:
        """pytest-xdist 3.8 tells the controller a test's group by appending `@group` to the
        test's `_nodeid` on the worker; pytest 9.2 keeps its node ids in `_id` (a structured
        NodeId) and no longer reads `_nodeid`, so every group would silently fall apart into single
        tests (upstream: "--dist=loadgroup silently stops grouping on pytest main", pytest-xdist).
        This runs after xdist's own hook and moves its `_nodeid` into `_id`; with a pytest that
        still reads `_nodeid` the two agree and nothing changes."""
        from _pytest.nodeid import coerce_node_id  # pytest >= 9.2 only, where the ids moved

        for item in items:
            legacy = item.__dict__.get("_nodeid")
            if isinstance(legacy, str) and legacy != item.nodeid and hasattr(item, "_id"):
                item._id = coerce_node_id(legacy)  # see the class docstring


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER") and config.getvalue("loadgroup"):
        config.pluginmanager.register(_OnWorkers(), "vgpu-xdist-workers")
