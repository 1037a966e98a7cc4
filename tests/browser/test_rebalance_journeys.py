"""An admin approves a rebalance plan in a real browser against `make demo`, in English and in
Simplified Chinese: "Approve and execute…" opens a confirmation page that names
exactly the nodes to cordon and the pods to evict; Confirm (a POST with CSRF) approves it; the
demo's Celery worker executes it, and the page and the audit log show the outcome as the database
records it. The demo has no Kubernetes API server, so the execution fails, and must say so.

The demo's three nodes are full at their workloads' peaks, so no node of theirs can be emptied and
their plan moves nothing: a spare node with one small pod joins for the journey (a node token and
a batch over the real API), the node a plan can hand back with one eviction."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg2
import pytest
import requests
from playwright.sync_api import Page, expect

from tests import clock
from tests.browser.test_polish_journeys import measure_layout
from tests.conftest import make_batch

pytestmark = [pytest.mark.browser, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
# What the page calls each outcome, per language (the plan's status as the model names it).
STATUS_LABEL = {"en": {"failed": "failed", "done": "done"}, "zh-hans": {"failed": "失败", "done": "已完成"}}
WAIT_MS = 20_000  # the demo shares its machine with the suite: pages can take seconds


SPARE = "sim-a100-spare"
_spare_metered_until: list[datetime] = []  # a GPU-second is metered once: the next batch starts after


def _spare_node(demo: Any) -> None:
    """A node with one small pod (0.5 GB, 10 % of the SMs) on one of its two A100s, metered for
    up to the last 30 seconds (after what an earlier call metered), so that the plan proposed next
    empties it."""
    token = subprocess.run([sys.executable, "manage.py", "create_node_token", SPARE], cwd=ROOT,
                           env={**os.environ, **demo.env}, capture_output=True, text=True, check=True,
                           timeout=60).stdout.strip()
    clock.wait_until_the_month_holds(timedelta(seconds=40))
    start = max([clock.now().replace(microsecond=0) - timedelta(seconds=30), *_spare_metered_until])
    while (clock.now() - start).total_seconds() < 10:
        time.sleep(1)
    seconds = min(30, int((clock.now() - start).total_seconds()))
    _spare_metered_until[:] = [start + timedelta(seconds=seconds)]
    batch = make_batch(node=SPARE, seq=int(start.timestamp()), start=start, seconds=seconds, gpus=2, workloads=[
        {"gpu": 0, "tenant": "acme", "pod": "spare-bert", "pod_uid": "uid-spare-bert", "mem_used": 500.0,
         "mem_granted": 500.0, "sm_used": 10.8, "sm_granted": 10.8}])
    resp = requests.post(f"{demo.base}/api/v1/usage/batches", json=batch, timeout=30,
                         headers={"Authorization": f"Bearer {token}"})
    assert resp.status_code == 201, resp.text
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        with psycopg2.connect(demo.env["DATABASE_URL"]) as conn, conn.cursor() as cur:
            cur.execute("select count(*) from billing_usageminute u join billing_node n on n.id = u.node_id "
                        "where n.name = %s and u.minute >= date_trunc('minute', %s::timestamptz)", [SPARE, start])
            (rows,) = cur.fetchone()
        conn.close()
        if rows:
            return
        time.sleep(1)
    raise AssertionError("the spare node's minutes were not rolled up within 90 s")


def _propose(demo: Any) -> int:
    """A fresh proposed plan, as the hourly task stores one (the management command)."""
    done = subprocess.run([sys.executable, "manage.py", "propose_rebalance"], cwd=ROOT, env={**os.environ, **demo.env},
                          capture_output=True, text=True, timeout=180, check=True)
    match = re.search(r"^plan (\d+):", done.stdout, re.M)
    assert match, done.stdout + done.stderr
    return int(match.group(1))


def _plan(demo: Any, plan_id: int) -> dict[str, Any]:
    with psycopg2.connect(demo.env["DATABASE_URL"]) as conn, conn.cursor() as cur:
        cur.execute("select status, error, moves, summary from billing_rebalanceplan where id = %s", [plan_id])
        row = cur.fetchone()
    conn.close()
    assert row is not None, plan_id
    return dict(zip(("status", "error", "moves", "summary"), row, strict=True))


def _language(page: Page, code: str) -> None:
    page.select_option("form.lang select", code)
    expect(page.locator("html")).to_have_attribute("lang", code, timeout=WAIT_MS)


def _ended(demo: Any, plan_id: int, timeout_s: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    plan = _plan(demo, plan_id)
    while plan["status"] in ("approved", "executing") and time.monotonic() < deadline:
        time.sleep(1)
        plan = _plan(demo, plan_id)
    assert plan["status"] in ("failed", "done"), f"plan {plan_id} still {plan['status']} after {timeout_s} s"
    return plan


@pytest.mark.parametrize("language", ["en", "zh-hans"])
def test_admin_approves_through_the_confirmation_page_and_sees_the_outcome(sign_in, demo, language):
    _spare_node(demo)
    plan_id = _propose(demo)
    planned = _plan(demo, plan_id)
    assert planned["status"] == "proposed"
    # It claims the spare node only, both its GPUs, for the one eviction that empties it.
    assert planned["summary"]["freed_nodes"] == [SPARE]
    assert planned["summary"]["gpus_released"] == 2
    assert [m["pod"] for m in planned["moves"]] == ["spare-bert"]
    s = sign_in("admin")
    page = s.page
    _language(page, language)
    try:
        s.goto("/rebalance/")
        page.get_by_test_id(f"rebalance-review-{plan_id}").click()
        page.wait_for_url(f"**/rebalance/{plan_id}/approve/")
        expect(page.get_by_test_id("rebalance-confirm")).to_be_visible(timeout=WAIT_MS)
        # The confirmation page names exactly what the execution will touch; nothing ran yet.
        assert page.get_by_test_id("confirm-cordon").all_inner_texts() == planned["summary"]["freed_nodes"]
        pods = page.locator("[data-testid=confirm-eviction] td:first-child").all_inner_texts()
        assert pods == [f"{m['namespace']}/{m['pod']}" for m in planned["moves"]]
        assert _plan(demo, plan_id)["status"] == "proposed"
        s.shot(f"rebalance-confirm-{language}")
        # The page the width walk cannot reach on the demo's own fleet, measured as it measures pages.
        assert measure_layout(page, f"admin {language} {page.url}") == []

        # Cancel leaves the plan proposed; Confirm approves it.
        page.get_by_test_id("rebalance-cancel").click()
        page.wait_for_url("**/rebalance/")
        assert _plan(demo, plan_id)["status"] == "proposed"
        page.get_by_test_id(f"rebalance-review-{plan_id}").click()
        page.wait_for_url(f"**/rebalance/{plan_id}/approve/")
        page.get_by_test_id("rebalance-confirm").click()
        page.wait_for_url("**/rebalance/")
        expect(page.get_by_test_id("message").first).to_contain_text(str(plan_id), timeout=WAIT_MS)

        ended = _ended(demo, plan_id)
        page.reload()
        expect(page.get_by_test_id(f"rebalance-status-{plan_id}")).to_have_text(STATUS_LABEL[language][ended["status"]],
                                                                              timeout=WAIT_MS)
        if ended["status"] == "failed":
            # The reason as recorded, on the page (the demo: no Kubernetes API client).
            expect(page.get_by_test_id(f"rebalance-failure-{plan_id}")).to_contain_text(ended["error"], timeout=WAIT_MS)
            outcome = "failed"
        else:
            expect(page.get_by_test_id(f"rebalance-outcome-{plan_id}")).to_be_visible(timeout=WAIT_MS)
            outcome = "partial" if ended["error"] else "succeeded"
        s.shot(f"rebalance-outcome-{language}")

        s.goto("/audit/?action=rebalance.")
        row = page.locator("[data-testid=audit-log] tbody tr").filter(has_text=f"rebalance_plan:{plan_id}")
        expect(row.filter(has_text=f"rebalance.{outcome}")).to_have_count(1, timeout=WAIT_MS)
        expect(row.filter(has_text="rebalance.approve")).to_have_count(1, timeout=WAIT_MS)
    finally:
        _language(page, "en")  # the language is kept per user: leave the admin as other journeys expect
