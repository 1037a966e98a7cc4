"""Polish a user notices: landing by role after login, styled 403/404/500 pages
with the site's navigation in both languages, the audit log as readable before/after, one date
format per language, and live pages that refresh their figures without a meta refresh."""

from __future__ import annotations

import re
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.http import HttpRequest, HttpResponse
from django.test import Client, RequestFactory
from django.urls import include, path
from django.utils import translation
from django.utils.formats import date_format
from django.views.defaults import server_error

from billing.models import AuditEvent, SlaTier, UserPreference
from billing.queries.audit import AuditValue, diff_snapshots
from billing.scope import ADMIN_GROUP, FINANCE_GROUP
from billing.services.demo import load_demo_data
from tests import clock
from tests.conftest import user_in

PASSWORD = "pw-not-used-123"  # tests.conftest.user_in's


def _boom(request: HttpRequest) -> HttpResponse:
    raise RuntimeError("a bug")


# This module is also the URLconf of the 500 test: the product's URLs plus one view that fails.
urlpatterns = [path("boom/", _boom), path("", include("billing.urls"))]


def _log_in(client: Client, user: User, *, next_url: str = "") -> str:
    """Log in through the login form, as a person does; the path the redirects end on."""
    data = {"username": user.get_username(), "password": PASSWORD}
    if next_url:
        data["next"] = next_url
    response = client.post("/accounts/login/", data, follow=True)
    assert response.status_code == 200
    return response.request["PATH_INFO"]


# --- landing after login ---------------------------------------------------------------------

@pytest.mark.django_db
@pytest.mark.parametrize(("group", "tenants", "landing"), [
    (FINANCE_GROUP, (), "/finance/"),
    (ADMIN_GROUP, (), "/nodes/"),
    (None, ("acme",), "/tenants/acme/"),
    (None, ("acme", "globex"), "/tenants/"),
])
def test_each_role_lands_on_its_own_page_after_logging_in(client, group, tenants, landing):
    assert _log_in(client, user_in(group, tenants=tenants)) == landing


@pytest.mark.django_db
@pytest.mark.parametrize(("group", "tenants", "landing"), [
    (FINANCE_GROUP, (), "/finance/"),
    (ADMIN_GROUP, (), "/nodes/"),
    (None, ("acme",), "/tenants/acme/"),
])
def test_the_login_answers_with_the_roles_page_itself(client, group, tenants, landing):
    """One redirect after the password check, not a chain through "/" (each hop a round trip)."""
    user = user_in(group, tenants=tenants)
    response = client.post("/accounts/login/", {"username": user.get_username(), "password": PASSWORD})
    assert response.status_code == 302
    assert response["Location"] == landing


@pytest.mark.django_db
def test_someone_in_finance_and_admin_lands_on_the_finance_page(client):
    user = user_in(FINANCE_GROUP)
    user.groups.add(*user_in(ADMIN_GROUP).groups.all())
    assert _log_in(client, user) == "/finance/"


@pytest.mark.django_db
def test_an_explicit_next_wins_over_the_role_landing(client):
    assert _log_in(client, user_in(None, "acme"), next_url="/budgets/") == "/budgets/"


@pytest.mark.django_db
def test_a_next_to_another_site_is_ignored_for_the_role_landing(client):
    assert _log_in(client, user_in(None, "acme"), next_url="https://evil.example/") == "/tenants/acme/"


# --- error pages ---------------------------------------------------------------------------

def _in_chinese(user: User) -> None:
    UserPreference.objects.update_or_create(user=user, defaults={"language": "zh-hans"})


@pytest.mark.django_db
def test_403_is_a_styled_page_with_the_users_navigation(client, settings):
    assert settings.DEBUG is False
    client.force_login(user_in(None, "acme"))
    response = client.get("/audit/")
    html = response.content.decode()
    assert response.status_code == 403
    assert "403.html" in [t.name for t in response.templates]
    assert 'data-testid="error-403"' in html
    assert "Your account may not open this page" in html
    assert 'data-testid="nav-my-tenant"' in html
    assert 'data-testid="nav-nodes"' not in html
    assert 'href="/"' in html
    assert 'data-testid="error-home"' in html
    assert '<p data-testid="error-reason">This page is for platform admins.</p>' in html


@pytest.mark.django_db
def test_403_of_a_finance_page_names_finance_and_a_views_own_message_is_shown(client):
    client.force_login(user_in(None, "acme"))
    assert "This page is for finance and platform admins." in client.get("/periods/").content.decode()
    assert "Rate cards are for finance (to read) and platform admins" in client.get("/rate-cards/").content.decode()


@pytest.mark.django_db
def test_403_and_404_speak_the_users_language(client):
    user = user_in(None, "acme")
    _in_chinese(user)
    client.force_login(user)
    forbidden, missing = client.get("/audit/").content.decode(), client.get("/no-such-page/").content.decode()
    assert 'lang="zh-hans"' in forbidden
    assert "你的账户无权打开此页面" in forbidden
    assert "此页面仅供平台管理员使用。" in forbidden
    assert "for admins" not in forbidden
    assert 'lang="zh-hans"' in missing
    assert "找不到页面" in missing
    assert "/no-such-page/" in missing


@pytest.mark.django_db
def test_404_is_styled_and_says_the_same_for_another_tenants_portal(client):
    client.force_login(user_in(None, "acme"))
    user_in(None, "globex")
    other, unknown = client.get("/tenants/globex/"), client.get("/tenants/nobody/")
    assert other.status_code == unknown.status_code == 404
    for response in (other, unknown):
        html = response.content.decode()
        assert 'data-testid="error-404"' in html
        assert 'data-testid="nav-my-tenant"' in html
    # The page names only the path asked for, so it says nothing about whether globex exists.
    def without_path_and_tokens(html: str, slug: str) -> str:
        return re.sub(r'name="csrfmiddlewaretoken" value="[^"]+"', "", html.replace(slug, "X"))

    assert (without_path_and_tokens(other.content.decode(), "globex")
            == without_path_and_tokens(unknown.content.decode(), "nobody"))


@pytest.mark.django_db
def test_anonymous_404_still_has_the_header_and_language_switch():
    response = Client(HTTP_ACCEPT_LANGUAGE="zh-hans").get("/no-such-page/")
    html = response.content.decode()
    assert response.status_code == 404
    assert "找不到页面" in html
    assert 'class="lang"' in html
    assert 'class="brand"' in html


@pytest.mark.django_db
@pytest.mark.urls("tests.billing.test_web_polish")
def test_500_is_styled_in_the_users_language():
    client = Client(raise_request_exception=False, HTTP_ACCEPT_LANGUAGE="zh-hans")
    response = client.get("/boom/")
    html = response.content.decode()
    assert response.status_code == 500
    assert 'data-testid="error-500"' in html
    assert 'lang="zh-hans"' in html
    assert "我们这边出错了" in html
    assert "css/app.css" in html


def test_500_renders_without_a_database_or_a_request_context():
    # No django_db mark: any database query while rendering would fail this test.
    with translation.override("en"):
        response = server_error(RequestFactory().get("/"))
    html = response.content.decode()
    assert response.status_code == 500
    assert "Something went wrong on our side" in html
    assert 'class="lang"' not in html  # the switch needs a CSRF token, which a 500 cannot have


# --- audit log -------------------------------------------------------------------------------

def test_minor_units_are_money_of_the_snapshots_currency():
    [total, currency, lines] = diff_snapshots(None, {"total_minor": 29020, "currency": "USD", "lines": 3})
    assert total.field == "total"
    assert total.after == AuditValue("money", Decimal("290.20"), "USD")
    assert total.before == AuditValue("none")
    assert total.changed
    assert currency.after == AuditValue("text", "USD")
    assert lines.after == AuditValue("text", "3")


def test_only_fields_that_differ_are_marked_changed():
    before = {"amount": "100.00", "currency": "EUR", "soft_threshold_pct": 80}
    after = {"amount": "250.00", "currency": "EUR", "soft_threshold_pct": 80, "owner": "lin"}
    changes = {c.field: c for c in diff_snapshots(before, after)}
    assert [c.field for c in changes.values()] == ["amount", "currency", "soft_threshold_pct", "owner"]
    assert changes["amount"].changed
    assert changes["owner"].changed
    assert not changes["currency"].changed
    assert not changes["soft_threshold_pct"].changed
    assert changes["amount"].before == AuditValue("money", Decimal("100.00"), "EUR")
    assert changes["owner"].before == AuditValue("none")


def test_instants_days_and_prices_are_typed_and_odd_values_kept_as_written():
    [at, day, price, odd, flag] = diff_snapshots(None, {
        "effective_from": "2026-12-01T00:00:00+00:00", "start": "2026-11-03", "price_per_gpu_hour": "2.125",
        "end": "2026-13-01", "enabled": True,
    })
    assert at.after == AuditValue("instant", datetime(2026, 12, 1, tzinfo=UTC))
    assert day.after == AuditValue("day", date(2026, 11, 3))
    assert price.after == AuditValue("rate", Decimal("2.125"), "")
    assert odd.after == AuditValue("text", "2026-13-01")
    assert flag.after == AuditValue("bool", True)


@pytest.fixture
def audited_invoice(db) -> AuditEvent:
    at = clock.now().replace(microsecond=0)
    return AuditEvent.objects.create(
        at=at, actor_label="system", action="invoice.finalized", object_type="invoice", object_id="INV-1",
        before=None, after={"total_minor": 2902012, "currency": "USD", "lines": 3,
                            "price_per_gpu_hour": "2.125", "finalized_at": at.isoformat()})


def _changes_row(html: str, field: str) -> str:
    match = re.search(rf'<tr class="(?:un)?changed" data-field="{field}">(.*?)</tr>', html, flags=re.S)
    assert match, field
    return match.group(1)


@pytest.mark.django_db
def test_audit_page_shows_fields_before_and_after_with_money_formatted(client, audited_invoice):
    client.force_login(user_in(ADMIN_GROUP))
    html = client.get("/audit/").content.decode()
    assert "total_minor" not in html
    assert "&#x27;total" not in html
    assert "{&#x27;" not in html
    total = _changes_row(html, "total")
    assert 'data-side="before">—<' in total
    assert 'data-side="after">29,020.12 USD<' in total
    assert 'data-side="after">2.125 USD<' in _changes_row(html, "price_per_gpu_hour")
    at = audited_invoice.at
    assert f'data-side="after">{at:%Y-%m-%d %H:%M:%S}<' in _changes_row(html, "finalized_at")


@pytest.mark.django_db
def test_audit_page_in_chinese_formats_dates_the_chinese_way(client, audited_invoice):
    user = user_in(ADMIN_GROUP)
    _in_chinese(user)
    client.force_login(user)
    html = client.get("/audit/").content.decode()
    at = audited_invoice.at
    chinese = f"{at.year}年{at.month}月{at.day}日 {at:%H:%M:%S}"
    assert f'data-side="after">{chinese}<' in _changes_row(html, "finalized_at")
    assert f">{chinese}</time>" in html
    assert 'data-side="after">29,020.12 USD<' in _changes_row(html, "total")


# --- one date format per language -------------------------------------------------------------

@pytest.mark.parametrize(("language", "day", "instant", "month"), [
    ("en", "2026-12-01", "2026-12-01 09:05", "2026-12"),
    ("zh-hans", "2026年12月1日", "2026年12月1日 09:05", "2026年12月"),
])
def test_each_language_has_one_date_format(language, day, instant, month):
    at = datetime(2026, 12, 1, 9, 5, tzinfo=UTC)
    with translation.override(language):
        assert date_format(at.date(), "DATE_FORMAT") == date_format(at.date(), "SHORT_DATE_FORMAT") == day
        assert date_format(at, "DATETIME_FORMAT") == date_format(at, "SHORT_DATETIME_FORMAT") == instant
        assert date_format(at, "YEAR_MONTH_FORMAT") == month


def test_templates_name_date_formats_instead_of_writing_patterns():
    """A pattern written in a template (|date:"Y-m-d") would show the same date two ways on a page."""
    root = Path(__file__).resolve().parents[2] / "templates"
    pattern = re.compile(r"\|(?:date|time):[\"']([^\"']+)[\"']")
    allowed = {"c", "DATE_FORMAT", "DATETIME_FORMAT", "TIME_FORMAT", "YEAR_MONTH_FORMAT", "MONTH_DAY_FORMAT",
               "SHORT_DATE_FORMAT", "SHORT_DATETIME_FORMAT", r"Y-m-d\TH:i"}  # c and datetime-local: machine values
    written = {f"{p.relative_to(root)}: {m}" for p in root.rglob("*.html")
               for m in pattern.findall(p.read_text(encoding="utf-8")) if m not in allowed}
    assert written == set()


# --- live figures ----------------------------------------------------------------------------

@pytest.mark.django_db
def test_the_live_finance_page_refreshes_its_figures_by_script_not_by_meta_refresh(client, one_usd_per_gpu_second):
    client.force_login(user_in(FINANCE_GROUP))
    html = client.get("/finance/").content.decode()  # this month: still running, so live
    assert '<meta name="live-refresh" content="15">' in html
    assert "js/live.js" in html
    assert 'http-equiv="refresh"' not in html
    # The period form is outside the live region, so a refresh never touches what is typed there.
    form, region = html.index('<form method="get" class="period">'), html.index('<div data-live="dashboard">')
    assert html.index("</form>", form) < region
    # Nothing in the region one types in or chooses from (live.js would then leave the region as it
    # is): the savings card's button posts hidden fields only, which a refresh may replace.
    live = html[region:html.index("</main>")]
    assert re.findall(r"<input\b[^>]*>", live), "the savings card's button is in the live region"
    assert all('type="hidden"' in field for field in re.findall(r"<input\b[^>]*>", live)), live
    assert "<select" not in live
    assert "<textarea" not in live


@pytest.mark.django_db
def test_a_finished_period_is_not_live(client, one_usd_per_gpu_second):
    client.force_login(user_in(FINANCE_GROUP))
    html = client.get("/finance/", {"start": "2025-01-01", "end": "2025-01-31"}).content.decode()
    assert 'name="live-refresh"' not in html
    assert "data-live-note" not in html


# --- what cannot be undone looks it; names the product seeded are translated -----------------------

# Labels of buttons that retire, revoke, reject, end or evict: outlined in red (class "danger"),
# never the blue of Save. The credit note's own confirmation is the one step that issues.
_DESTRUCTIVE = re.compile(r'<button[^>]*>\s*(?:{%[^%]*%})?\s*{% (?:trans|blocktrans)[^%]*"(Retire|Revoke|Reject|End the card'
                          r'|Move the end|Confirm: cordon)')


def test_buttons_that_cannot_be_undone_are_styled_as_destructive():
    found = 0
    for template in (Path(__file__).resolve().parents[2] / "templates").rglob("*.html"):
        for match in _DESTRUCTIVE.finditer(template.read_text(encoding="utf-8")):
            found += 1
            assert 'class="danger"' in match.group(0), (template.name, match.group(0))
    assert found >= 8  # revoke ×2, retire ×3, end, reject, evict


@pytest.mark.django_db
def test_the_seeded_tiers_are_named_in_the_readers_language_and_an_admins_name_as_typed(client):
    load_demo_data(now=clock.now())
    SlaTier.objects.create(slug="platinum", name="Platinum plus", weight=Decimal(8))
    admin = user_in(ADMIN_GROUP)
    client.force_login(admin)
    english = client.get("/sla-tiers/").content.decode()
    assert "Gold" in english
    assert "Latency-critical inference" in english
    _in_chinese(admin)
    chinese = client.get("/sla-tiers/").content.decode()
    for shown in ("金牌", "银牌", "铜牌", "尽力而为", "对延迟敏感的推理", "Platinum plus"):
        assert shown in chinese, shown
    assert ">Gold <" not in chinese
    finance = user_in(FINANCE_GROUP)
    _in_chinese(finance)
    client.force_login(finance)
    assert "未归属的进程" in client.get("/tenants/").content.decode()


@pytest.mark.django_db
def test_the_forms_tenant_choices_name_the_seeded_tenant_in_the_readers_language(client):
    """The budget and alert-rule forms' tenant select offers the tenant of unattributed processes in
    Chinese, as every page names it; a tenant an admin named is offered as named."""
    load_demo_data(now=clock.now())
    admin = user_in(ADMIN_GROUP)  # budgets are the admins', alert rules finance's and the admins'
    _in_chinese(admin)
    client.force_login(admin)
    for url in ("/budgets/new/", "/alerts/rules/new/"):
        page = client.get(url, HTTP_ACCEPT_LANGUAGE="zh-hans").content.decode()
        option = re.search(r'<option value="unattributed"[^>]*>([^<]*)</option>', page)
        assert option, url
        assert "未归属的进程" in option.group(1), url
        assert "Unattributed processes" not in page, url
        assert "Acme Robotics" in page, url  # an admin's name, as typed
    for url in ("/budgets/unattributed/", "/tenants/unattributed/billing/"):  # the headings name it alike
        page = client.get(url, HTTP_ACCEPT_LANGUAGE="zh-hans")
        assert page.status_code == 200, url
        assert "未归属的进程" in page.content.decode(), url
