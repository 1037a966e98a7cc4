"""An admin approves a rebalance plan in a real browser against `make demo`, in English and in
Simplified Chinese: "Approve and execute…" opens a confirmation page that names
exactly the nodes to cordon and the pods to evict; Confirm (a POST with CSRF) approves it; the
demo's Celery worker executes it, and the page and the audit log show the outcome as the database
records it. The demo has no Kubernetes API server, so the execution fails, and must say so.

The demo's pods are packed by their predicted reservations onto fewer cards than its three nodes
have (agents.backends.sim.demo_fleet), so the plan empties one of the demo's own nodes by moving
its few pods onto the cards left free on the others."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg2
import pytest
from playwright.sync_api import Page, expect

from config.demo import NODES
from tests.browser.test_polish_journeys import measure_layout

pytestmark = [pytest.mark.browser, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
# What the page calls each outcome, per language (the plan's status as the model names it).
STATUS_LABEL = {"en": {"failed": "failed", "done": "done"}, "zh-hans": {"failed": "失败", "done": "已完成"}}
WAIT_MS = 20_000  # the demo shares its machine with the suite: pages can take seconds


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
    plan_id = _propose(demo)
    planned = _plan(demo, plan_id)
    assert planned["status"] == "proposed"
    # It claims whole demo nodes, all 8 GPUs of each, and evicts only their pods.
    freed = planned["summary"]["freed_nodes"]
    assert freed, planned["summary"]
    assert set(freed) <= set(NODES)
    assert planned["summary"]["gpus_released"] == 8 * len(freed)
    assert {m["from_node"] for m in planned["moves"]} == set(freed)
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
