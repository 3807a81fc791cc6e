"""The idle policies' pages: the instance page shows the policy in force and when it acts, with
the keep-running button once warned; the tenant's settings page; who may change what."""

import time
from decimal import Decimal

import pytest

from accounts.roles import Role
from console.idle import services
from console.idle.models import InstancePolicy, OperatorPolicy, TenantPolicy
from tests.clients import signed_in
from tests.idle.test_watch import running, samples  # noqa: F401 - the fixture
from tests.instances.helpers import make_instance

pytestmark = pytest.mark.usefixtures("no_tasks")


def test_the_instance_page_shows_the_policy_and_when_it_acts_then_keeps_it_running(
    running,  # noqa: F811
    tenant,
    member,
):
    OperatorPolicy.objects.create(
        tenant=tenant, window_minutes=Decimal(1), warning_minutes=Decimal("0.5")
    )
    page = signed_in(member)
    now = time.time()
    samples(running, 0.0, now - 200, now)
    shown = page.get(f"/instances/{running.pk}/").content.decode()
    assert "In force: stop when under 5 % GPU and no ssh, terminal, ports use for 1 min" in shown
    assert 'data-testid="idle-acts"' in shown and 'data-testid="keep-running"' not in shown
    assert services.evaluate(running.pk, now) == "warn"
    shown = page.get(f"/instances/{running.pk}/").content.decode()
    assert "<strong>Warned:</strong>" in shown and 'data-testid="keep-running"' in shown
    kept = page.post(f"/idle/instances/{running.pk}/keep-running/", follow=True)
    assert "keeps running" in kept.content.decode()
    assert 'data-testid="keep-running"' not in kept.content.decode()


def test_the_instance_form_refuses_what_weakens_the_operators(running, tenant, member):  # noqa: F811
    OperatorPolicy.objects.create(tenant=tenant, window_minutes=Decimal(30))
    page = signed_in(member)
    fields = {"window_minutes": "60", "threshold_percent": "5", "action": "stop",
              "warning_minutes": "10", "count_gpu": "on"}  # fmt: skip
    refused = page.post(f"/idle/instances/{running.pk}/policy/", fields, follow=True)
    assert "at most 30" in refused.content.decode()
    assert not InstancePolicy.objects.exists()
    saved = page.post(
        f"/idle/instances/{running.pk}/policy/", {**fields, "window_minutes": "20"}, follow=True
    )
    assert "is saved" in saved.content.decode()
    assert InstancePolicy.objects.get().window_minutes == Decimal(20)


def test_the_tenants_page_is_for_its_admins_to_change(tenant, make_member):
    admin, viewer = make_member(tenant, Role.ADMIN), make_member(tenant, Role.VIEWER)
    fields = {"window_minutes": "45", "threshold_percent": "5", "action": "notify",
              "warning_minutes": "10"}  # fmt: skip
    assert signed_in(viewer).get("/idle/").status_code == 200
    signed_in(viewer).post("/idle/", fields)
    assert not TenantPolicy.objects.exists()
    saved = signed_in(admin).post("/idle/", fields, follow=True)
    assert "is saved" in saved.content.decode()
    assert TenantPolicy.objects.get().action == "notify"


def test_another_tenants_instance_is_not_found(catalog, other_tenant, member):
    foreign = make_instance(catalog, other_tenant, state="running")
    page = signed_in(member)
    assert page.post(f"/idle/instances/{foreign.pk}/keep-running/").status_code == 404
    assert page.post(f"/idle/instances/{foreign.pk}/policy/", {"clear": "1"}).status_code == 404
