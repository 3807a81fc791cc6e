"""Issue 27 items 3, 5 and 6 as the agent reports them: a late batch of events bills the
time the workload ran (each event at its own time, in order), a workload that never ran
costs nothing, and a suspended tenant's instance in flight never runs."""

from datetime import timedelta

import pytest
from django.db.models import F
from django.utils import timezone

from accounts import services as accounts
from accounts.models import Tenant
from billing.models import UsageSegment
from console.instances import outcomes, services, tasks
from console.instances.models import Instance, InstanceEvent, State
from tests.instances.fakes import FakeAgents
from tests.instances.test_agent_events import event, fresh, push, started

S = State


@pytest.fixture
def agents(monkeypatch):
    return FakeAgents().install(monkeypatch)


def gpu(instance):
    return list(
        UsageSegment.objects.filter(instance=instance, kind="gpu").values_list(
            "started_at", "ended_at"
        )
    )


def test_a_late_batch_bills_the_time_the_workload_ran(
    catalog, tenant, agents, no_tasks, django_capture_on_commit_callbacks
):
    host, instance = started(catalog, tenant, agents, start_state="starting")
    InstanceEvent.objects.filter(instance=instance).update(at=F("at") - timedelta(hours=1))
    ran, exited = timezone.now() - timedelta(minutes=30), timezone.now() - timedelta(minutes=10)
    pulling = event(instance, kind="progress", at=ran, message="pulling")
    batch = [
        event(instance, "exited", at=exited, reason="exited", exit_code=0),  # out of order
        event(instance, "running", at=ran),
    ]
    with django_capture_on_commit_callbacks(execute=True):
        push(host, pulling)  # a note, recorded now: it holds back no later event
        assert push(host, *batch).json()["applied"] == 2
    assert fresh(instance).state == S.STOPPING
    assert gpu(instance) == [(ran, exited)]  # 1,200 s, not the minimum


def test_a_running_event_never_goes_back_before_its_placement_nor_forward(catalog, tenant, agents):
    host, instance = started(catalog, tenant, agents, start_state="starting")
    placed = instance.events.get(from_state=S.PENDING, to_state=S.PROVISIONING).at
    push(host, event(instance, "running", at=placed - timedelta(days=1)))
    assert fresh(instance).events.get(to_state=S.RUNNING).at == placed


@pytest.mark.parametrize(
    "reason", ["command_not_found: jupyter: not in the image", "launch_failed: x"]
)
def test_a_workload_that_never_ran_costs_nothing(
    catalog, tenant, agents, reason, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        host, instance = started(catalog, tenant, agents, back=False)
    assert len(gpu(instance)) == 1
    began = instance.events.get(to_state=S.RUNNING).at
    with django_capture_on_commit_callbacks(execute=True):
        push(host, event(instance, "failed", reason=reason, exit_code=127))
    instance = fresh(instance)
    assert (instance.state, instance.state_reason) == (S.FAILED, reason)
    assert instance.events.get(to_state=S.FAILED).at == began
    assert gpu(instance) == []


def test_suspension_stops_an_instance_in_flight(
    catalog, tenant, agents, no_tasks, django_capture_on_commit_callbacks
):
    host, instance = started(catalog, tenant, agents, start_state="starting")  # pulling
    with django_capture_on_commit_callbacks(execute=True):
        accounts.set_tenant_status(tenant, Tenant.Status.SUSPENDED)
    assert fresh(instance).state == S.STOPPING
    assert ("stop", instance.pk) in no_tasks
    assert push(host, event(instance, "running")).json()["applied"] == 0
    assert fresh(instance).state == S.STOPPING


def test_an_agent_that_reports_a_suspended_tenants_instance_running_is_told_to_stop(
    catalog, tenant, agents, no_tasks, django_capture_on_commit_callbacks
):
    host, instance = started(catalog, tenant, agents, start_state="starting")
    Tenant.objects.filter(pk=tenant.pk).update(status=Tenant.Status.SUSPENDED)  # a race
    with django_capture_on_commit_callbacks(execute=True):
        assert push(host, event(instance, "running")).json()["applied"] == 1
    assert fresh(instance).state == S.STOPPING and ("stop", instance.pk) in no_tasks
    assert gpu(instance) == []


def test_a_resize_under_way_does_not_start_a_suspended_tenants_instance(
    catalog, tenant, agents, no_tasks, django_capture_on_commit_callbacks
):
    host, instance = started(catalog, tenant, agents)
    services.stop_instance(instance)  # as a resize that found no room: stop, then start again
    Instance.objects.filter(pk=instance.pk).update(resume_after_stop=True)
    with django_capture_on_commit_callbacks(execute=True):
        accounts.set_tenant_status(tenant, Tenant.Status.SUSPENDED)
    tasks.stop.apply(args=[instance.pk])
    assert fresh(instance).state == S.STOPPED
    with pytest.raises(services.InvalidState, match="suspended"):
        services.resize_instance(fresh(instance), catalog.half)
    assert outcomes.mark_running(instance.pk, "none") is False
