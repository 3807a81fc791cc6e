"""Budgets: alerts at 50/80/100 % of the budget in force (once each, at the level reached),
launches refused and instances stopped at 100 % when the tenant chose so, all on the usage
page's spend (volumes and snapshots included), checked by the meter and at once when the
budget changes."""

from datetime import timedelta
from decimal import Decimal

import pytest
import time_machine
from django.core import mail
from django.db import transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accounts.models import Quota
from accounts.roles import Role
from billing import budgets, services
from billing.models import BudgetAlert
from billing.rating import month_start
from billing.usage import usage_report
from console.celery import app
from console.instances import outcomes
from console.instances.models import Instance, State
from console.notices import notice as notices
from tests.billing.conftest import MARCH, at, move, stored_amount, walk
from tests.billing.test_snapshot_storage import GIB
from tests.billing.test_snapshot_storage import stored as kept
from tests.billing.test_volumes import volume
from tests.factories import MembershipFactory, TenantFactory

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


@pytest.fixture
def notices_sent():
    """The console notices sent (console.notices), as (kind, data)."""
    sent = []

    def receive(sender, kind, data, **kwargs):
        sent.append((kind, data))

    notices.connect(receive, dispatch_uid="tests.budget_notices")
    yield sent
    notices.disconnect(dispatch_uid="tests.budget_notices")


def change_budget(tenant, amount, action, now, capture):
    """An owner saves the budget at ``now``; what its commit queues runs (eager)."""
    with time_machine.travel(now, tick=False), capture(execute=True):
        return set_budget(tenant, amount, action)


def alerts(tenant) -> list[tuple[int, Decimal, Decimal]]:
    return list(
        BudgetAlert.objects.filter(tenant=tenant)
        .order_by("created_at", "budget", "threshold")
        .values_list("threshold", "spent", "budget")
    )


def reached(outbox) -> list[str]:
    return [m.subject.split(" reached ")[1].split(" of ")[0] for m in outbox]


def test_a_volume_counts_in_alerts_and_banner_as_on_the_usage_page(
    world, team, eager, django_capture_on_commit_callbacks, notices_sent
):
    """Issue 42, item 2: a 10.00 budget and a 1,000 GiB volume at 0.10 per GiB-month for 10
    days: the usage page shows 32.26, so do the alerts (none fired before) and the banner."""
    set_budget(team, "10.00")
    volume(world, team, at(2026, 3, 1), gib=1000)
    now = at(2026, 3, 11)
    meter(now, django_capture_on_commit_callbacks)
    spent = usage_report(team, MARCH, now).total
    assert spent == stored_amount(1000, "0.10", 10 * 86400) == Decimal("32.258065")
    assert alerts(team) == [(50, spent, 10), (80, spent, 10), (100, spent, 10)]
    assert reached(mail.outbox) == ["100%"]  # one email, at the level reached
    assert "spent 32.26 USD in March 2026, 100% of its monthly budget of 10.00 USD" in (
        mail.outbox[0].body
    )
    assert [(kind, data["threshold"]) for kind, data in notices_sent] == [("budget.threshold", 100)]
    banner = budgets.notice(team.memberships.get(role=Role.MEMBER), now)
    assert (banner.level, banner.spent, banner.percent) == (100, spent, 322)


def test_a_snapshot_counts_in_the_budget_stop(
    world, team, eager, django_capture_on_commit_callbacks, monkeypatch
):
    """Issue 42, item 2: a 5.00 stop budget, a 2,000 GiB snapshot (0.10 per GiB-month, kept
    25 h: 6.720430) and an hour at 0.90: 7.62 spent. Launches were refused, but the meter saw
    0.90: no alert, and the instance ran on. Now both see 7.62."""
    from console.instances import queue as instance_queue

    monkeypatch.setattr(instance_queue, "enqueue", lambda *args: None)  # no host calls
    set_budget(team, "5.00", "stop")
    kept(world, team, at(2026, 3, 1), bytes_stored=2000 * GIB, price="0.10")
    box = world.running(team, at(2026, 3, 2))
    now = at(2026, 3, 2, 1)
    with time_machine.travel(now, tick=False), pytest.raises(budgets.BudgetExceeded) as refused:
        budgets.ensure_launch_allowed(team)
    assert "spent 7.62 USD of its monthly budget of 5.00 USD" in refused.value.detail
    meter(now, django_capture_on_commit_callbacks)
    spent = usage_report(team, MARCH, now).total
    assert spent == Decimal("0.900000") + Decimal("6.720430")
    assert alerts(team) == [(50, spent, 5), (80, spent, 5), (100, spent, 5)]
    assert reached(mail.outbox) == ["100%"]
    stopped = Instance.objects.get(pk=box.pk)
    assert stopped.state == S.STOPPING
    assert stopped.state_reason == "budget_stopped: monthly budget of 5.00 USD reached at 7.62 USD"


def test_a_raised_budget_alerts_and_stops_at_its_own_thresholds(
    world, team, eager, django_capture_on_commit_callbacks, monkeypatch
):
    """Issue 42, item 7: 3.20/h against 10.00 (alert only): 100 % at 12.80. Raised to 100.00
    with stop: 50 % of it at 64.00, then 100 % at 100.80, an email and the stop (before, the
    alerts of 10.00 stood for the month: no email, whatever the budget)."""
    from console.instances import queue as instance_queue

    monkeypatch.setattr(instance_queue, "enqueue", lambda *args: None)
    set_budget(team, "10.00")
    box = world.running(team, at(2026, 3, 2), spec=world.whole)
    meter(at(2026, 3, 2, 4), django_capture_on_commit_callbacks)
    change_budget(team, "100.00", "stop", at(2026, 3, 2, 4), django_capture_on_commit_callbacks)
    assert reached(mail.outbox) == ["100%"]  # 12.8 % of 100.00: nothing new
    meter(at(2026, 3, 2, 20), django_capture_on_commit_callbacks)
    assert Instance.objects.get(pk=box.pk).state == S.RUNNING
    meter(at(2026, 3, 3, 7, 30), django_capture_on_commit_callbacks)
    assert alerts(team) == [
        (50, Decimal("12.80"), 10), (80, Decimal("12.80"), 10), (100, Decimal("12.80"), 10),
        (50, Decimal("64.00"), 100),
        (80, Decimal("100.80"), 100), (100, Decimal("100.80"), 100),
    ]  # fmt: skip
    assert reached(mail.outbox) == ["100%", "50%", "100%"]
    assert "spent 100.80 USD in March 2026, 100% of its monthly budget of 100.00 USD" in (
        mail.outbox[-1].body
    )
    assert Instance.objects.get(pk=box.pk).state == S.STOPPING
    # lowered back to 10.00: its alerts of the month were sent already
    change_budget(team, "10.00", "stop", at(2026, 3, 3, 7, 31), django_capture_on_commit_callbacks)
    assert len(mail.outbox) == 3


def test_a_lowered_budget_notifies_the_level_reached_at_once_and_once(
    world, team, eager, django_capture_on_commit_callbacks, notices_sent
):
    """Issue 42, item 8: 0.48 spent (32 min at 0.90), the budget lowered from 1.00 to 0.60:
    "80 %" at once (it said 50 %, and 80 % a minute later), and nothing more until 100 %."""
    set_budget(team, "1.00")
    world.running(team, at(2026, 3, 2))
    meter(at(2026, 3, 2, 0, 31), django_capture_on_commit_callbacks)  # 0.465: 46.5 %
    assert alerts(team) == []
    change_budget(team, "0.60", "alert", at(2026, 3, 2, 0, 32), django_capture_on_commit_callbacks)
    assert reached(mail.outbox) == ["80%"]
    assert "spent 0.48 USD in March 2026, 80% of its monthly budget of 0.60 USD" in (
        mail.outbox[0].body
    )
    assert [(kind, data["threshold"], data["spent"]) for kind, data in notices_sent] == [
        ("budget.threshold", 80, "0.480000")
    ]
    meter(at(2026, 3, 2, 0, 33), django_capture_on_commit_callbacks)
    meter(at(2026, 3, 2, 0, 34), django_capture_on_commit_callbacks)
    assert len(mail.outbox) == 1 and len(notices_sent) == 1
    meter(at(2026, 3, 2, 0, 40), django_capture_on_commit_callbacks)  # 0.60
    assert reached(mail.outbox) == ["80%", "100%"]
    assert [data["threshold"] for _, data in notices_sent] == [80, 100]


def test_a_budget_stop_comes_within_a_metering_interval_or_at_once(
    world, team, eager, django_capture_on_commit_callbacks, monkeypatch
):
    """Issue 42, item 8: 3.20/h against a 2.00 stop budget crosses it at 00:37:30; the meter's
    pass at 00:38 stops it at 2.03 (one interval of running spend at most). A budget lowered
    below the spend stops at once, without waiting for the meter."""
    from console.instances import queue as instance_queue

    monkeypatch.setattr(instance_queue, "enqueue", lambda *args: None)
    set_budget(team, "2.00", "stop")
    first = world.running(team, at(2026, 3, 2), spec=world.whole)
    meter(at(2026, 3, 2, 0, 37), django_capture_on_commit_callbacks)  # 1.973333
    assert Instance.objects.get(pk=first.pk).state == S.RUNNING
    meter(at(2026, 3, 2, 0, 38), django_capture_on_commit_callbacks)  # 2.026667
    assert Instance.objects.get(pk=first.pk).state_reason == (
        "budget_stopped: monthly budget of 2.00 USD reached at 2.03 USD"
    )

    set_budget(other := TenantFactory(), "10.00", "stop")
    second = world.running(other, at(2026, 3, 2), spec=world.whole)
    change_budget(other, "1.00", "stop", at(2026, 3, 2, 0, 20), django_capture_on_commit_callbacks)
    assert Instance.objects.get(pk=second.pk).state_reason == (
        "budget_stopped: monthly budget of 1.00 USD reached at 1.07 USD"
    )


SECONDS = st.integers(0, 40 * 86400).map(lambda s: timedelta(seconds=s, microseconds=s % 997))
LIFETIMES = st.one_of(st.none(), st.integers(1, 20 * 86400).map(lambda s: timedelta(seconds=s)))
PRICES = st.integers(1, 50).map(lambda cents: Decimal(cents) / 100)
history = st.lists(
    st.one_of(
        st.tuples(st.just("volume"), SECONDS, LIFETIMES, st.integers(1, 200), PRICES),
        st.tuples(st.just("snapshot"), SECONDS, LIFETIMES, st.integers(1, 200 * GIB), PRICES),
        st.tuples(st.just("run"), SECONDS, LIFETIMES, st.booleans()),
    ),
    max_size=6,
)


@pytest.mark.slow
@pytest.mark.timeout(600)  # shrinking a failure replays many histories
@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(items=history, elapsed=SECONDS, cents=st.integers(1, 20_000))
def test_the_budget_spends_what_the_usage_page_shows(world, items, elapsed, cents):
    """For any history of volumes, snapshots and runs around a month start, the budget's
    figure (alerts, banner, launch check) is the usage page's total at the same moment, and
    its alerts are exactly the thresholds that total reaches."""
    start, budget = at(2026, 2, 20), Decimal(cents) / 100
    now = start + elapsed
    with transaction.atomic():
        tenant = TenantFactory()
        member = MembershipFactory(tenant=tenant)
        Quota.objects.filter(tenant=tenant).update(monthly_budget=budget)
        for n, (kind, offset, lifetime, *rest) in enumerate(items):
            begin = start + offset
            end = begin + lifetime if lifetime is not None else None
            if kind == "volume":
                volume(
                    world, tenant, begin, deleted=end, gib=rest[0], price=str(rest[1]), name=f"v{n}"
                )
            elif kind == "snapshot":
                kept(world, tenant, begin, deleted=end, bytes_stored=rest[0], price=str(rest[1]))
            elif begin < now:
                box = world.running(tenant, begin, spec=world.whole if rest[0] else None)
                if end is not None and end < now:
                    walk(box, [S.STOPPING, S.STOPPED], end)
        total = usage_report(tenant, month_start(now).date(), now).total
        created = budgets.check_budgets(now, tenant_ids=[tenant.pk])
        levels = budgets.crossed(total, budget)
        assert [(a.threshold, a.spent) for a in created] == [(level, total) for level in levels]
        assert budgets.month_to_date(tenant, now) == total
        banner = budgets.notice(member, now)
        if levels:
            assert (banner.level, banner.spent) == (levels[-1], total)
        else:
            assert banner is None
        transaction.set_rollback(True)
