"""A tenant against its operator's idle policy: no request of its own changes it or gets around
it (the tenant's API ignores what it was not asked for; the admin is for staff only)."""

from decimal import Decimal

import pytest
from django.test import Client

from accounts.roles import Role
from console.idle.models import OperatorPolicy


@pytest.fixture
def operator_policy(tenant):
    return OperatorPolicy.objects.create(
        tenant=tenant, window_minutes=Decimal(30), action="stop", allow_keep_running=False
    )


def test_the_tenants_api_cannot_reach_the_operators_policy(
    tenant, make_member, token_client, operator_policy
):
    owner = token_client(make_member(tenant, Role.OWNER))
    sneaky = {"operator_policy": {"window_minutes": "600", "action": "notify"}, "tenant": 99}
    answer = owner.put("/api/v1/idle-policy/", sneaky, format="json")
    assert answer.status_code == 200
    assert answer.json()["operator_policy"]["window_minutes"] == "30.00"
    operator_policy.refresh_from_db()
    assert (operator_policy.window_minutes, operator_policy.action) == (Decimal(30), "stop")
    assert owner.delete("/api/v1/idle-policy/").status_code == 200
    assert OperatorPolicy.objects.filter(pk=operator_policy.pk).exists()


def test_the_admin_is_for_operators_only(tenant, make_member, operator_policy):
    owner = Client()
    owner.force_login(make_member(tenant, Role.OWNER).user)
    url = f"/admin/idle/operatorpolicy/{operator_policy.pk}/change/"
    answer = owner.post(url, {"tenant": tenant.pk, "window_minutes": "600", "action": "notify"})
    assert answer.status_code == 302 and "/admin/login/" in answer["Location"]
    operator_policy.refresh_from_db()
    assert operator_policy.window_minutes == Decimal(30)
