"""The tasks, run eagerly in this process against an in-memory agent: what each one does,
that a redelivery is harmless, retries, the final `failed`, and reconcile."""

from datetime import timedelta

import pytest
from django.utils import timezone

from console.catalog.models import Mode
from console.fleet.models import Host
from console.instances import recovery, services, tasks
from console.instances.models import Allocation, Instance, State
from tests.instances.fakes import FakeAgents


@pytest.fixture
def agents(monkeypatch):
    return FakeAgents().install(monkeypatch)


@pytest.fixture
def eager(settings, monkeypatch):
    """Tasks queued on commit run at once, here; the retries do not wait."""
    monkeypatch.setattr(tasks.HostTask, "max_retries", 2)
    monkeypatch.setattr(tasks.HostTask, "retry_backoff", 0)
    settings.CELERY_TASK_ALWAYS_EAGER = True
    from console.celery import app

    app.conf.task_always_eager = True
    app.conf.task_eager_propagates = False
    yield
    app.conf.task_always_eager = False


def state(instance):
    return Instance.objects.get(pk=instance.pk).state


def launch(catalog, tenant, **kw):
    return services.launch_instance(
        tenant, name=kw.pop("name", "box"), spec=kw.pop("spec", catalog.quarter),
        image=catalog.image, **kw,
    )  # fmt: skip


def test_launch_to_running_and_a_redelivery_is_harmless(
    catalog, tenant, agents, django_capture_on_commit_callbacks
):
    host = catalog.host(gpus=1, mode=Mode.SHARED)
    with django_capture_on_commit_callbacks(execute=False) as queued:
        instance = launch(catalog, tenant)
    assert state(instance) == State.PROVISIONING
    tasks.provision.apply(args=[instance.pk])
    assert state(instance) == State.RUNNING
    allocation = instance.current_allocation()
    assert list(agents.hosts[host.name]) == [allocation.pk]
    tasks.provision.apply(args=[instance.pk])  # redelivered: nothing more happens
    assert instance.events.count() == 3
    assert len(queued) >= 1


def test_stop_deletes_on_the_agent_and_survives_redelivery(catalog, tenant, agents):
    host = catalog.host(gpus=1, mode=Mode.SHARED)
    instance = launch(catalog, tenant)
    tasks.provision.apply(args=[instance.pk])
    services.stop_instance(instance)
    tasks.stop.apply(args=[instance.pk])
    assert state(instance) == State.STOPPED
    assert agents.hosts[host.name] == {}
    tasks.stop.apply(args=[instance.pk])
    assert state(instance) == State.STOPPED


def test_a_launch_whose_agent_is_down_waits_for_it_then_fails_when_it_stays_away(
    catalog, tenant, agents, eager, settings
):
    host = catalog.host(gpus=1, mode=Mode.SHARED)
    agents.down.add(host.name)
    instance = launch(catalog, tenant)
    tasks.provision.apply(args=[instance.pk])
    instance.refresh_from_db()
    assert instance.state == State.PROVISIONING  # its slice held while it waits
    assert instance.state_reason.startswith(f"Waiting for its host {host.name}, which does not")
    assert agents.calls.count(host.name) == 3  # the call and two retries
    assert instance.current_allocation().host == host

    settings.HOST_FAILOVER_SECONDS = 0  # as long as a silent host is given: over
    tasks.provision.apply(args=[instance.pk])
    instance.refresh_from_db()
    assert instance.state == State.FAILED
    assert instance.state_reason.startswith("agent_unavailable: gave up after 2 retries")
    assert instance.current_allocation() is None


def test_a_start_on_a_retired_host_does_not_wait(catalog, tenant, agents, eager):
    host = catalog.host(gpus=1, mode=Mode.SHARED)
    agents.down.add(host.name)
    instance = launch(catalog, tenant)
    Host.objects.filter(pk=host.pk).update(status=Host.Status.RETIRED)
    tasks.provision.apply(args=[instance.pk])
    instance.refresh_from_db()
    assert instance.state == State.FAILED


def test_agent_refusal_fails_at_once(catalog, tenant, agents, monkeypatch):
    from console.fleet import agent_client
    from console.fleet.agent_client import AgentRejected

    catalog.host(gpus=1, mode=Mode.SHARED)

    def refuse(host, alloc_id, body):
        raise AgentRejected(host, "bad body", 400, "invalid_body")

    monkeypatch.setattr(agent_client, "create_allocation", refuse)
    instance = launch(catalog, tenant)
    tasks.provision.apply(args=[instance.pk])
    instance.refresh_from_db()
    assert instance.state == State.FAILED
    assert instance.state_reason.startswith("agent_rejected")


def test_resize_in_place_swaps_the_allocation(catalog, tenant, agents):
    host = catalog.host(gpus=1, mode=Mode.SHARED)
    instance = launch(catalog, tenant)
    tasks.provision.apply(args=[instance.pk])
    old = instance.current_allocation().pk
    services.resize_instance(instance, catalog.half, allow_restart=True)
    tasks.resize.apply(args=[instance.pk, old])
    assert state(instance) == State.RUNNING
    new = Instance.objects.get(pk=instance.pk).current_allocation()
    assert list(agents.hosts[host.name]) == [new.pk]
    assert agents.hosts[host.name][new.pk]["body"]["shared"]["milli"] == 500


def test_terminate_and_reboot(catalog, tenant, agents):
    host = catalog.host(gpus=1, mode=Mode.SHARED)
    instance = launch(catalog, tenant)
    tasks.provision.apply(args=[instance.pk])
    services.reboot_instance(instance)
    tasks.reboot.apply(args=[instance.pk])
    assert state(instance) == State.RUNNING
    services.terminate_instance(instance)
    tasks.terminate.apply(args=[instance.pk])
    assert state(instance) == State.TERMINATED
    assert agents.hosts[host.name] == {}


class TestReconcile:
    def test_an_allocation_the_console_never_made_is_stopped_and_reported_not_deleted(
        self, catalog, tenant, agents
    ):
        host = catalog.host(gpus=1, mode=Mode.SHARED)
        instance = launch(catalog, tenant)
        tasks.provision.apply(args=[instance.pk])
        stray = {"id": "stray-1", "state": "running", "labels": {"instance": "77"}, "body": {}}
        agents.hosts[host.name]["stray-1"] = stray
        outcome = tasks.reconcile_host.apply(args=[host.pk]).get()
        assert (outcome["removed"], outcome["stopped"]) == ([], ["stray-1"])
        assert agents.hosts[host.name]["stray-1"]["state"] == "stopped"  # kept, not deleted
        report = host.events.get(message__startswith="Found allocation stray-1")
        assert "(instance 77) running, of nothing it knows: stopped, kept" in report.message
        assert report.from_status == report.to_status == host.status
        # stopped, it stays: nothing the console did not end is ever deleted
        outcome = tasks.reconcile_host.apply(args=[host.pk]).get()
        assert (outcome["removed"], outcome["stopped"]) == ([], [])
        assert set(agents.hosts[host.name]) == {"stray-1", instance.current_allocation().pk}

    def test_an_allocation_of_a_terminated_instance_is_removed(self, catalog, tenant, agents):
        host = catalog.host(gpus=1, mode=Mode.SHARED)
        instance = launch(catalog, tenant)
        tasks.provision.apply(args=[instance.pk])
        allocation = instance.current_allocation().pk
        left_behind = dict(agents.hosts[host.name][allocation])
        services.terminate_instance(instance)
        tasks.terminate.apply(args=[instance.pk])
        assert state(instance) == State.TERMINATED
        agents.hosts[host.name][allocation] = left_behind  # its delete got lost on the way
        outcome = tasks.reconcile_host.apply(args=[host.pk]).get()
        assert outcome["removed"] == [allocation]
        assert agents.hosts[host.name] == {}

    def test_a_launch_its_agent_already_runs_is_adopted(
        self, catalog, tenant, agents, django_capture_on_commit_callbacks
    ):
        """The worker died after the agent created the allocation: the agent's `running` is
        the instance's, without waiting for the task to come back."""
        host = catalog.host(gpus=1, mode=Mode.SHARED)
        with django_capture_on_commit_callbacks(execute=False):
            instance = launch(catalog, tenant)  # its provision task is lost
        allocation = instance.current_allocation().pk
        agents.hosts[host.name] = {allocation: {"id": allocation, "state": "running", "body": {}}}
        outcome = tasks.reconcile_host.apply(args=[host.pk]).get()
        assert state(instance) == State.RUNNING
        assert outcome["redriven"] == []

    def test_a_launch_whose_task_never_reached_the_agent_is_driven_again(
        self, catalog, tenant, agents, eager, settings, django_capture_on_commit_callbacks
    ):
        host = catalog.host(gpus=1, mode=Mode.SHARED)
        with django_capture_on_commit_callbacks(execute=False):
            instance = launch(catalog, tenant)  # its provision task is lost
        with django_capture_on_commit_callbacks(execute=True):
            outcome = tasks.reconcile_host.apply(args=[host.pk]).get()
        assert outcome["redriven"] == []  # just placed: its task may still be on the way
        assert state(instance) == State.PROVISIONING

        placed = timezone.now() - timedelta(seconds=settings.LAUNCH_REDRIVE_SECONDS + 1)
        Instance.objects.filter(pk=instance.pk).update(updated_at=placed)
        with django_capture_on_commit_callbacks(execute=True):
            outcome = tasks.reconcile_host.apply(args=[host.pk]).get()
        assert outcome["redriven"] == [instance.pk]
        assert state(instance) == State.RUNNING
        assert list(agents.hosts[host.name]) == [instance.current_allocation().pk]
        with django_capture_on_commit_callbacks(execute=True):
            outcome = tasks.reconcile_host.apply(args=[host.pk]).get()
        assert outcome == {
            "removed": [], "stopped": [], "failed": [], "redriven": [], "adopted": []
        }  # fmt: skip

    def test_a_vanished_allocation_fails_its_instance(self, catalog, tenant, agents):
        host = catalog.host(gpus=1, mode=Mode.SHARED)
        instance = launch(catalog, tenant)
        tasks.provision.apply(args=[instance.pk])
        Instance.objects.filter(pk=instance.pk).update(
            updated_at=timezone.now() - timedelta(seconds=5)
        )
        agents.hosts[host.name].clear()
        outcome = tasks.reconcile_host.apply(args=[host.pk]).get()
        assert outcome["failed"] == [instance.pk]
        instance.refresh_from_db()
        assert instance.state == State.FAILED
        assert instance.state_reason.startswith("allocation_vanished")

    def test_a_lost_allocation_fails_its_instance(self, catalog, tenant, agents):
        host = catalog.host(gpus=1, mode=Mode.SHARED)
        instance = launch(catalog, tenant)
        tasks.provision.apply(args=[instance.pk])
        allocation = instance.current_allocation().pk
        agents.hosts[host.name][allocation].update(state="lost", reason="GPU fell off the bus")
        tasks.reconcile_host.apply(args=[host.pk])
        instance.refresh_from_db()
        assert instance.state == State.FAILED
        assert "GPU fell off the bus" in instance.state_reason

    def test_a_just_started_instance_is_left_alone(self, catalog, tenant, agents):
        host = catalog.host(gpus=1, mode=Mode.SHARED)
        instance = launch(catalog, tenant)
        tasks.provision.apply(args=[instance.pk])
        agents.hosts[host.name].clear()
        Instance.objects.filter(pk=instance.pk).update(
            updated_at=timezone.now() + timedelta(seconds=5)  # after the agent was listed
        )
        tasks.reconcile_host.apply(args=[host.pk])
        assert state(instance) == State.RUNNING

    def test_a_lost_host_that_comes_back_stops_what_it_ran_then_removes_it(
        self, catalog, tenant, agents
    ):
        host = catalog.host(gpus=1, mode=Mode.SHARED)
        instance = launch(catalog, tenant)
        tasks.provision.apply(args=[instance.pk])
        allocation = instance.current_allocation().pk
        Host.objects.filter(pk=host.pk).update(
            status=Host.Status.UNREACHABLE,
            unreachable_since=timezone.now() - timedelta(minutes=6),
            last_heartbeat_at=timezone.now() - timedelta(minutes=6),
        )
        recovery.fail_over_hosts()
        assert state(instance) == State.FAILED
        assert Allocation.objects.get(instance=instance).released_at is not None
        Host.objects.filter(pk=host.pk).update(status=Host.Status.ACTIVE, unreachable_since=None)
        outcome = tasks.reconcile_host.apply(args=[host.pk]).get()
        assert outcome["stopped"] == [allocation]  # its work stopped, not destroyed
        assert agents.hosts[host.name][allocation]["state"] == "stopped"
        assert host.events.filter(message__contains="no longer runs there").exists()
        # stopped, it leaves the host as a stop takes an allocation away (the disk stays)
        outcome = tasks.reconcile_host.apply(args=[host.pk]).get()
        assert outcome["removed"] == [allocation]
        assert agents.hosts[host.name] == {}

    def test_a_host_silent_for_a_while_keeps_its_instance_which_is_adopted_back(
        self, catalog, tenant, agents
    ):
        host = catalog.host(gpus=1, mode=Mode.SHARED)
        instance = launch(catalog, tenant)
        tasks.provision.apply(args=[instance.pk])
        allocation = instance.current_allocation().pk
        heard = timezone.now() - timedelta(seconds=90)
        Instance.objects.filter(pk=instance.pk).update(updated_at=heard - timedelta(minutes=1))
        instance.events.update(at=heard - timedelta(minutes=1))
        Host.objects.filter(pk=host.pk).update(
            status=Host.Status.UNREACHABLE,
            unreachable_since=heard + timedelta(seconds=15),
            last_heartbeat_at=heard,
        )
        assert recovery.fail_over_hosts() == 0  # not lost: HOST_FAILOVER_SECONDS is minutes
        instance.refresh_from_db()
        assert instance.state == State.UNREACHABLE
        assert (
            instance.state_reason
            == f"host_unreachable: host {host.name} not heard since {heard:%Y-%m-%d %H:%M:%S} UTC"
        )
        assert instance.events.last().at == heard  # billing stops at the last heartbeat
        assert Allocation.objects.get(pk=allocation).released_at is None  # its slice kept

        Host.objects.filter(pk=host.pk).update(status=Host.Status.ACTIVE, unreachable_since=None)
        outcome = tasks.reconcile_host.apply(args=[host.pk]).get()
        assert outcome["adopted"] == [instance.pk]
        assert (outcome["removed"], outcome["stopped"], outcome["failed"]) == ([], [], [])
        assert list(agents.hosts[host.name]) == [allocation]  # the same one, not made again
        instance.refresh_from_db()
        assert instance.state == State.RUNNING
        back = instance.events.last()
        assert (back.from_state, back.to_state, back.at) == ("unreachable", "running", heard)
        assert "adopted, not restarted" in back.message
        assert tasks.reconcile_host.apply(args=[host.pk]).get()["adopted"] == []

    def test_an_unreachable_instance_whose_allocation_vanished_fails(self, catalog, tenant, agents):
        host = catalog.host(gpus=1, mode=Mode.SHARED)
        instance = launch(catalog, tenant)
        tasks.provision.apply(args=[instance.pk])
        Host.objects.filter(pk=host.pk).update(
            status=Host.Status.UNREACHABLE,
            unreachable_since=timezone.now() - timedelta(seconds=20),
            last_heartbeat_at=timezone.now() - timedelta(seconds=30),
        )
        recovery.fail_over_hosts()
        assert state(instance) == State.UNREACHABLE
        Instance.objects.filter(pk=instance.pk).update(
            updated_at=timezone.now() - timedelta(seconds=5)
        )
        Host.objects.filter(pk=host.pk).update(status=Host.Status.ACTIVE, unreachable_since=None)
        agents.hosts[host.name].clear()  # its host came back without it (its disk was wiped)
        assert tasks.reconcile_host.apply(args=[host.pk]).get()["failed"] == [instance.pk]
        assert state(instance) == State.FAILED
