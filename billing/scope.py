"""Who may see what. Tenant visibility is enforced in the queries and services that read, never only in
templates. A pure module (models only) below both billing.queries and billing.services, so either
may take a Scope (pyproject.toml, the layers contract)."""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser, User

from billing.models import TenantMembership

__all__ = ["ADMIN_GROUP", "FINANCE_GROUP", "Scope", "get_scope"]

FINANCE_GROUP = "finance"
ADMIN_GROUP = "platform-admin"


@dataclass(frozen=True)
class Scope:
    """`tenants is None` means every tenant (finance, admins); otherwise only these slugs."""

    tenants: frozenset[str] | None
    is_finance: bool
    is_admin: bool

    @property
    def sees_platform(self) -> bool:
        return self.tenants is None


def get_scope(user: AbstractBaseUser | AnonymousUser) -> Scope:
    if not isinstance(user, User) or not user.is_authenticated:
        return Scope(tenants=frozenset(), is_finance=False, is_admin=False)
    groups = set(user.groups.values_list("name", flat=True))
    is_admin = bool(getattr(user, "is_superuser", False)) or ADMIN_GROUP in groups
    is_finance = FINANCE_GROUP in groups
    if is_admin or is_finance:
        return Scope(tenants=None, is_finance=is_finance, is_admin=is_admin)
    slugs = TenantMembership.objects.filter(user=user).values_list("tenant__slug", flat=True)
    return Scope(tenants=frozenset(slugs), is_finance=False, is_admin=False)
