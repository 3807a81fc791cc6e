"""Budgets: alerts at 50/80/100 % (once each), launches refused and instances stopped at
100 % when the tenant chose so."""

from decimal import Decimal

import pytest
import time_machine
from django.core import mail

from accounts.models import Quota
from accounts.roles import Role
from billing import budgets, services
from billing.models import BudgetAlert
from console.celery import app
from console.instances import outcomes
from console.instances.models import Instance, State
from tests.billing.conftest import at, move

pytestmark = pytest.mark.django_db

S = State


@pytest.fixture
def eager():
    import billing.tasks  # noqa: F401 (registers the tasks that budgets queue by name)

    app.conf.task_always_eager = True
    yield
    app.conf.task_always_eager = False


@pytest.fixture
def team(tenant, make_member):
    for role in (Role.OWNER, Role.ADMIN, Role.MEMBER, Role.VIEWER):
        make_member(tenant, role, username=f"{role}-one")
    return tenant


def set_budget(tenant, amount, action="alert"):
    return services.set_budget(tenant, Decimal(amount) if amount is not None else None, action)


def meter(now, capture):
    with time_machine.travel(now, tick=False), capture(execute=True):
        return services.run_meter()


def test_alerts_fire_once_each_to_owners_and_admins(
    world, team, eager, django_capture_on_commit_callbacks
):
    set_budget(team, "9.00")
    box = world.running(team, at(2026, 3, 2, 0))  # 0.90/h: 50 % after 5 h
    meter(at(2026, 3, 2, 4), django_capture_on_commit_callbacks)
    assert not BudgetAlert.objects.exists() and not mail.outbox
    for hour in (5, 6, 8, 9, 10, 11):
        meter(at(2026, 3, 2, hour), django_capture_on_commit_callbacks)
        meter(at(2026, 3, 2, hour), django_capture_on_commit_callbacks)  # twice: nothing new
    assert list(BudgetAlert.objects.order_by("threshold").values_list("threshold", flat=True)) == [
        50, 80, 100,
    ]  # fmt: skip
    assert len(mail.outbox) == 3
    assert [m.subject.split(" reached ")[1] for m in mail.outbox] == [
        "50% of its monthly budget", "80% of its monthly budget", "100% of its monthly budget",
    ]  # fmt: skip
    assert sorted(mail.outbox[0].to) == ["admin-one@example.com", "owner-one@example.com"]
    assert BudgetAlert.objects.filter(emailed_at__isnull=True).count() == 0
    assert Instance.objects.get(pk=box.pk).state == S.RUNNING  # alert only
    owner = team.memberships.get(role=Role.OWNER)
    assert budgets.notice(owner, at(2026, 3, 2, 12)).level == 100  # the banner, for everyone
    # a new month starts over
    meter(at(2026, 4, 1, 5, 1), django_capture_on_commit_callbacks)
    assert BudgetAlert.objects.filter(month=at(2026, 4, 1).date()).count() == 1


def test_jumping_past_several_thresholds_sends_one_email(
    world, team, eager, django_capture_on_commit_callbacks
):
    set_budget(team, "1.00")
    world.running(team, at(2026, 3, 2, 0), spec=world.whole)  # 3.20/h
    meter(at(2026, 3, 2, 1), django_capture_on_commit_callbacks)
    assert BudgetAlert.objects.count() == 3
    assert len(mail.outbox) == 1 and "100%" in mail.outbox[0].subject


def test_send_alert_is_at_most_once(team):
    alert = BudgetAlert.objects.create(
        tenant=team, month=at(2026, 3, 1).date(), threshold=50, spent=5, budget=10
    )
    assert budgets.send_alert(alert.pk) is True
    assert budgets.send_alert(alert.pk) is False
    assert len(mail.outbox) == 1


def test_lost_alert_email_is_sent_again(team, eager, django_capture_on_commit_callbacks):
    set_budget(team, "10.00")
    BudgetAlert.objects.create(
        tenant=team, month=at(2026, 3, 1).date(), threshold=50, spent=5, budget=10,
        created_at=at(2026, 3, 2),
    )  # fmt: skip
    meter(at(2026, 3, 2, 0, 5), django_capture_on_commit_callbacks)
    assert len(mail.outbox) == 1


def test_launch_allowed_unless_stop_budget_is_spent(world, tenant):
    budgets.ensure_launch_allowed(tenant)  # no budget
    set_budget(tenant, "1.00", "alert")
    box = world.running(tenant, at(2026, 3, 2), spec=world.whole)
    move(box, S.TERMINATING, at(2026, 3, 2, 1))
    services.run_meter(at(2026, 3, 2, 2))
    with time_machine.travel(at(2026, 3, 2, 2), tick=False):
        budgets.ensure_launch_allowed(tenant)  # over, but alert only
        set_budget(tenant, "1.00", "stop")
        with pytest.raises(budgets.BudgetExceeded) as refused:
            budgets.ensure_launch_allowed(tenant)
        assert refused.value.status == 409
        assert refused.value.code == "budget_exceeded"
        assert "3.20 USD of its monthly budget of 1.00 USD" in refused.value.detail
        set_budget(tenant, "100.00", "stop")
        budgets.ensure_launch_allowed(tenant)
    with time_machine.travel(at(2026, 4, 1), tick=False):
        set_budget(tenant, "1.00", "stop")
        budgets.ensure_launch_allowed(tenant)  # a new month


def test_stop_at_100_percent_stops_running_instances(
    world, tenant, eager, django_capture_on_commit_callbacks, monkeypatch
):
    from console.instances import queue as instance_queue

    monkeypatch.setattr(instance_queue, "enqueue", lambda *args: None)  # no host calls
    set_budget(tenant, "2.00", "stop")
    running = world.running(tenant, at(2026, 3, 2), spec=world.whole)
    waiting = world.instance(tenant)
    meter(at(2026, 3, 2, 0, 30), django_capture_on_commit_callbacks)
    assert Instance.objects.get(pk=running.pk).state == S.RUNNING  # 1.60 < 2.00
    meter(at(2026, 3, 2, 0, 40), django_capture_on_commit_callbacks)
    assert Instance.objects.get(pk=running.pk).state == S.STOPPING
    assert Instance.objects.get(pk=waiting.pk).state == S.STOPPED
    with time_machine.travel(at(2026, 3, 2, 0, 41), tick=False):
        assert budgets.enforce(tenant.pk) == 0  # nothing left to stop
    # why, in the event and as the reason, which the stop keeps once it is done
    why = "monthly budget of 2.00 USD reached at 2.13 USD"
    event = running.events.last()
    assert (event.to_state, event.actor_label) == (S.STOPPING, "system")
    assert event.message.startswith(f"Stopped: {why} — an owner can raise the budget")
    assert Instance.objects.get(pk=waiting.pk).state_reason == f"budget_stopped: {why}"
    outcomes.finish_stop(running.pk)
    stopped = Instance.objects.get(pk=running.pk)
    assert (stopped.state, stopped.state_reason) == (S.STOPPED, f"budget_stopped: {why}")


def test_enforce_checks_again(world, tenant, monkeypatch):
    from console.instances import queue as instance_queue

    monkeypatch.setattr(instance_queue, "enqueue", lambda *args: None)
    set_budget(tenant, "2.00", "stop")
    box = world.running(tenant, at(2026, 3, 2), spec=world.whole)
    services.run_meter(at(2026, 3, 2, 1))
    set_budget(tenant, "50.00", "stop")  # raised meanwhile
    with time_machine.travel(at(2026, 3, 2, 1), tick=False):
        assert budgets.enforce(tenant.pk) == 0
    assert Instance.objects.get(pk=box.pk).state == S.RUNNING


def test_set_budget_validates(tenant):
    from django.core.exceptions import ValidationError

    with pytest.raises(ValidationError):
        set_budget(tenant, "-1")
    with pytest.raises(ValidationError):
        set_budget(tenant, "1", "explode")
    assert set_budget(tenant, None).monthly_budget is None
    assert Quota.objects.get(tenant=tenant).budget_action == "alert"
