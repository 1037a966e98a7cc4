"""In flight (issue 14), removed at merge: `Scope` moved to billing.scope so that services and
queries can both use it without services importing queries. queries/portal.py, bench/web_pages.py
and some tests (other engineers' files) still import it from here."""

from billing.scope import ADMIN_GROUP, FINANCE_GROUP, Scope, get_scope

__all__ = ["ADMIN_GROUP", "FINANCE_GROUP", "Scope", "get_scope"]
