"""`POST /agent/v1/events`: what an agent pushes about its allocations (a workload that
exits, fails, is lost or starts running; a launch's progress) and what the instance does
then; a repeated event, another host's allocation, and bad bodies or secrets."""

from datetime import timedelta

import pytest
from django.db.models import F
from django.test import Client
from django.utils import timezone

from billing.models import UsageSegment
from console.catalog.models import Mode
from console.fleet.models import Host
from console.instances import queue, services, tasks
from console.instances.models import Instance, InstanceEvent, State
from tests.fleet.conftest import post_json
from tests.instances.fakes import FakeAgents


@pytest.fixture
def agents(monkeypatch):
    return FakeAgents().install(monkeypatch)


def push(host, *events, host_id=None, secret=None):
    client = Client(HTTP_AUTHORIZATION=f"Bearer {secret or f'secret-{host.name}'}")
    body = {"host_id": host_id or host.pk, "events": list(events)}
    return post_json(client, "/agent/v1/events", body)


def event(instance, state=None, *, kind="state", at=None, allocation=None, **extra):
    allocation = allocation or instance.current_allocation().pk
    body = {"allocation": allocation, "instance": str(instance.pk), "kind": kind}
    body["at"] = (at or timezone.now()).isoformat()
    if state:
        body["state"] = state
    return {**body, **extra}


def fresh(instance):
    return Instance.objects.get(pk=instance.pk)


def started(catalog, tenant, agents, start_state="running", back=True):
    host = catalog.host(gpus=1, mode=Mode.SHARED)
    agents.start_state = start_state
    instance = services.launch_instance(
        tenant, name="box", spec=catalog.quarter, image=catalog.image
    )
    tasks.provision.apply(args=[instance.pk])
    # launched ten seconds ago, so that an outcome a moment ago comes after its last event
    if back:
        InstanceEvent.objects.filter(instance=instance).update(at=F("at") - timedelta(seconds=10))
    return host, fresh(instance)


def test_a_slow_launch_stays_provisioning_until_its_running_event(catalog, tenant, agents):
    host, instance = started(catalog, tenant, agents, start_state="starting")
    assert instance.state == State.PROVISIONING
    assert instance.state_reason == "Starting the workload on its host"
    pulling = event(instance, kind="progress", message="pulling demo 1.2 of 3.4 GB")
    assert push(host, pulling).json() == {"accepted": 1, "applied": 1, "ignored": 0}
    instance = fresh(instance)
    assert instance.state == State.PROVISIONING
    assert instance.state_reason == "pulling demo 1.2 of 3.4 GB"
    response = push(host, event(instance, "running"))
    assert response.status_code == 202
    assert fresh(instance).state == State.RUNNING
    assert push(host, event(instance, "running")).json()["ignored"] == 1  # a retry: no change
    events = list(instance.events.values_list("from_state", "to_state", "message"))
    assert [to for was, to, _ in events if was != to] == ["pending", "provisioning", "running"]
    assert ("provisioning", "provisioning", "pulling demo 1.2 of 3.4 GB") in events  # a note


def test_exit_0_stops_it_with_billing_closed_at_the_exit(
    catalog, tenant, agents, no_tasks, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        host, instance = started(catalog, tenant, agents, back=False)  # billing saw it start
    exited_at = timezone.now()
    body = event(instance, "exited", at=exited_at, reason="exited", exit_code=0)
    with django_capture_on_commit_callbacks(execute=True):
        assert push(host, body).json()["applied"] == 1
    assert no_tasks[-1] == ("stop", instance.pk)
    instance = fresh(instance)
    assert instance.state == State.STOPPING and instance.state_reason == "exited"
    tasks.stop.apply(args=[instance.pk])
    instance = fresh(instance)
    assert (instance.state, instance.state_reason, instance.exit_code) == ("stopped", "exited", 0)
    assert instance.current_allocation() is None and agents.hosts[host.name] == {}
    assert instance.disk_host == host  # the disk stays, on its host
    stopping = instance.events.get(to_state=State.STOPPING)
    assert stopping.at == exited_at and "exited with code 0" in stopping.message
    segment = UsageSegment.objects.get(instance=instance, kind="gpu")
    assert segment.ended_at == exited_at
    assert push(host, body).json() == {"accepted": 1, "applied": 0, "ignored": 1}
    assert fresh(instance).state == State.STOPPED


@pytest.mark.parametrize(
    "reason, exit_code",
    [
        ("exit code 3", 3),
        ("oom_killed", 137),
        ("gpu_memory_cap", None),
        ("container_lost", None),
    ],
)
def test_a_failure_fails_it_with_the_agents_reason(catalog, tenant, agents, reason, exit_code):
    host, instance = started(catalog, tenant, agents)
    at = timezone.now() - timedelta(milliseconds=200)
    body = event(instance, "failed", at=at, reason=reason, exit_code=exit_code)
    assert push(host, body).json()["applied"] == 1
    instance = fresh(instance)
    assert (instance.state, instance.state_reason) == (State.FAILED, reason)
    assert instance.exit_code == exit_code
    assert instance.current_allocation() is None  # its slice is free again
    assert instance.events.get(from_state=State.RUNNING, to_state=State.FAILED).at == at
    assert push(host, body).json()["ignored"] == 1  # the same event again
    assert instance.events.filter(from_state=State.RUNNING, to_state=State.FAILED).count() == 1


def test_a_launch_that_fails_before_running_fails(catalog, tenant, agents):
    host, instance = started(catalog, tenant, agents, start_state="starting")
    reason = "command_not_found: jupyter"
    push(host, event(instance, "failed", reason=reason, exit_code=127))
    instance = fresh(instance)
    assert (instance.state, instance.state_reason) == (State.FAILED, reason)


def test_lost_fails_it_as_reconcile_would(catalog, tenant, agents):
    host, instance = started(catalog, tenant, agents)
    push(host, event(instance, "lost", reason="gpu_lost"))
    assert fresh(instance).state_reason == "allocation_lost: gpu_lost"


def test_a_time_in_the_future_or_before_the_last_event_is_clamped(catalog, tenant, agents):
    host, instance = started(catalog, tenant, agents)
    last = instance.events.order_by("-at").first().at
    push(host, event(instance, "failed", at=last - timedelta(hours=1), reason="oom_killed"))
    assert fresh(instance).events.get(from_state=State.RUNNING, to_state=State.FAILED).at == last
    other = services.launch_instance(tenant, name="box2", spec=catalog.quarter, image=catalog.image)
    tasks.provision.apply(args=[other.pk])
    before = timezone.now()
    push(host, event(fresh(other), "failed", at=before + timedelta(days=1), reason="oom_killed"))
    assert (
        before
        <= fresh(other).events.get(from_state=State.RUNNING, to_state=State.FAILED).at
        <= timezone.now()
    )


def test_another_hosts_allocation_or_an_old_one_is_ignored(catalog, tenant, agents):
    host, instance = started(catalog, tenant, agents)
    other = catalog.host("other", gpus=1, mode=Mode.SHARED)
    answer = push(other, event(instance, "failed", reason="exit code 1"))
    assert answer.status_code == 202 and answer.json()["ignored"] == 1
    old = push(host, event(instance, "failed", allocation="inst-1-00000000", reason="x"))
    assert old.json()["ignored"] == 1
    assert fresh(instance).state == State.RUNNING


def test_a_host_speaks_only_for_itself_with_its_secret(catalog, tenant, agents):
    host, instance = started(catalog, tenant, agents)
    other = catalog.host("other", gpus=1, mode=Mode.SHARED)
    body = event(instance, "failed", reason="exit code 1")
    assert push(host, body, secret="wrong").status_code == 401
    no_auth = post_json(Client(), "/agent/v1/events", {"host_id": host.pk, "events": [body]})
    assert no_auth.status_code == 401
    as_other = push(other, body, host_id=host.pk)
    assert as_other.status_code == 403 and as_other.json()["code"] == "wrong_host"
    assert fresh(instance).state == State.RUNNING


@pytest.mark.parametrize(
    "body",
    [
        [],
        {"host_id": "x", "events": []},
        {"events": "nope"},
        {"events": [{"kind": "state"}]},
        {"events": [{"allocation": "a", "instance": "1", "kind": "state", "at": "yesterday"}]},
        {"events": [{"allocation": "a", "instance": "1", "kind": "state", "at": "2026-12-01"}]},
        {"events": [{"allocation": "a", "instance": "x", "kind": "boom", "at": "2026-12-01"}]},
    ],
)
def test_a_malformed_body_is_a_400_with_a_reason(catalog, body):
    host = catalog.host(gpus=1)
    if isinstance(body, dict) and "host_id" not in body:
        body["host_id"] = host.pk
    client = Client(HTTP_AUTHORIZATION=f"Bearer secret-{host.name}")
    response = post_json(client, "/agent/v1/events", body)
    assert response.status_code == 400
    assert response.json()["detail"]


def test_reconcile_applies_what_a_lost_event_would_have(catalog, tenant, agents, no_tasks):
    host, instance = started(catalog, tenant, agents, start_state="starting")
    allocation = agents.hosts[host.name][instance.current_allocation().pk]
    allocation["state"] = "running"
    tasks.reconcile_host.apply(args=[host.pk])
    assert fresh(instance).state == State.RUNNING
    finished = timezone.now()  # after the running it saw
    allocation.update(
        state="exited", reason="exited", exit_code=0, finished_at=finished.isoformat()
    )
    tasks.reconcile_host.apply(args=[host.pk])
    instance = fresh(instance)
    assert (instance.state, instance.state_reason, instance.exit_code) == ("stopping", "exited", 0)
    assert instance.events.get(to_state=State.STOPPING).at == finished
    assert no_tasks[-1] == ("stop", instance.pk)


def test_reconcile_fails_a_launch_whose_image_could_not_be_pulled(catalog, tenant, agents):
    host, instance = started(catalog, tenant, agents, start_state="starting")
    reason = "image_pull_failed: registry unreachable"
    agents.hosts[host.name][instance.current_allocation().pk].update(state="failed", reason=reason)
    assert tasks.reconcile_host.apply(args=[host.pk]).get()["failed"] == [instance.pk]
    assert fresh(instance).state_reason == reason


def test_start_waits_for_the_host_that_holds_its_disk(catalog, tenant, agents, no_tasks):
    home, instance = started(catalog, tenant, agents)
    services.stop_instance(instance)
    tasks.stop.apply(args=[instance.pk])
    filler = services.launch_instance(tenant, name="filler", spec=catalog.half, image=catalog.image)
    other = services.launch_instance(tenant, name="other", spec=catalog.half, image=catalog.image)
    for placed in (filler, other):
        tasks.provision.apply(args=[placed.pk])
        assert fresh(placed).current_allocation().host == home
    catalog.host("spare", gpus=1, mode=Mode.SHARED)  # room, but not where its disk is
    services.start_instance(fresh(instance))
    instance = fresh(instance)
    assert instance.state == State.PENDING and instance.current_allocation() is None
    assert instance.state_reason == (
        f"Waiting for {home.name}, which holds its disk: no A100 1/4 free there now."
    )
    services.stop_instance(fresh(other))
    tasks.stop.apply(args=[other.pk])
    assert ("schedule_pending",) in no_tasks
    assert queue.schedule_pending() == 1
    instance = fresh(instance)
    assert instance.state == State.PROVISIONING and instance.current_allocation().host == home


def test_terminate_deletes_the_disk_on_its_host_or_says_it_could_not(
    catalog, tenant, agents, no_tasks
):
    home, instance = started(catalog, tenant, agents)
    services.terminate_instance(instance)
    tasks.terminate.apply(args=[instance.pk])
    assert fresh(instance).state == State.TERMINATED
    assert agents.deleted_instances == [(home.name, str(instance.pk))]
    second = services.launch_instance(tenant, name="b", spec=catalog.quarter, image=catalog.image)
    tasks.provision.apply(args=[second.pk])
    services.stop_instance(fresh(second))
    tasks.stop.apply(args=[second.pk])
    Host.objects.filter(pk=home.pk).update(status=Host.Status.UNREACHABLE)
    agents.down.add(home.name)
    services.terminate_instance(fresh(second))  # a stopped instance: nothing left to stop
    tasks.terminate.apply(args=[second.pk])
    second = fresh(second)
    assert second.state == State.TERMINATED
    message = second.events.get(to_state=State.TERMINATED).message
    assert message == f"Terminated; its disk on {home.name} (unreachable) stays there"


def test_a_host_in_maintenance_is_told_to_its_instances_tenants(
    catalog, tenant, agents, no_tasks, member
):
    from console.fleet import services as fleet

    home, instance = started(catalog, tenant, agents)
    fleet.set_host_status(home, Host.Status.MAINTENANCE, note="GPU swap, back by 18:00 UTC")
    browser = Client()
    browser.force_login(member.user)
    browser.post("/tenant/switch/", {"tenant": member.tenant_id})
    page = browser.get(f"/instances/{instance.pk}/").content.decode()
    assert 'data-testid="host-notice"' in page and "is in maintenance" in page
    assert "The operator's note: GPU swap, back by 18:00 UTC" in page
    services.stop_instance(instance)
    tasks.stop.apply(args=[instance.pk])
    services.start_instance(fresh(instance))  # its disk is on the host in maintenance
    instance = fresh(instance)
    assert instance.state == State.PENDING
    assert instance.state_reason == (
        f"Waiting for {home.name}, which holds its disk: it is in maintenance "
        "(GPU swap, back by 18:00 UTC)."
    )
    assert "is in maintenance" in browser.get(f"/instances/{instance.pk}/").content.decode()
    fleet.set_host_status(home, Host.Status.ACTIVE)
    assert queue.schedule_pending() == 1
    assert "host-notice" not in browser.get(f"/instances/{instance.pk}/").content.decode()
