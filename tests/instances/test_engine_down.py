"""A host whose agent is heard but whose container engine does not answer (issue 50 item 2):
its running instances become `unreachable` from when the engine stopped answering (billing's
GPU segment ends there: it bills `running` only), reconcile leaves them alone while the engine
is down, and once it answers again one whose container still runs is adopted back, billed on
from that time (the engine vouches that it ran); one whose container died with the engine
ends, and its outage stays unbilled."""

from datetime import timedelta

import pytest
from django.utils import timezone

from billing.metering import KIND_STATES
from billing.models import UsageKind
from console.catalog.models import Mode
from console.fleet import services as fleet
from console.fleet.models import Host
from console.instances import reasons, recovery, services, tasks
from console.instances.models import State
from console.instances.reasons import Code
from tests.instances.fakes import FakeAgents

pytestmark = pytest.mark.django_db


@pytest.fixture
def agents(monkeypatch):
    return FakeAgents().install(monkeypatch)


def running(catalog, tenant):
    instance = services.launch_instance(
        tenant, name="box", spec=catalog.quarter, image=catalog.image
    )
    tasks.provision.apply(args=[instance.pk])
    instance.refresh_from_db()
    assert instance.state == State.RUNNING
    return instance


def engine_down(host, seconds_ago: float, detail="connection refused"):
    since = timezone.now() - timedelta(seconds=seconds_ago)
    Host.objects.filter(pk=host.pk).update(last_heartbeat_at=since - timedelta(seconds=2))
    host.refresh_from_db()
    return fleet.record_heartbeat(
        host, engine={"state": "down", "since": since, "detail": detail}
    ), since


def test_its_instances_are_unreachable_from_the_outage_and_adopted_back_when_it_answers(
    catalog, tenant, agents
):
    host = catalog.host(gpus=1, mode=Mode.SHARED)
    instance = running(catalog, tenant)
    instance.events.update(at=timezone.now() - timedelta(minutes=5))
    host, since = engine_down(host, 30)
    assert host.status == Host.Status.ACTIVE and not host.schedulable
    assert host.engine_down_since == since and host.engine_detail == "connection refused"

    recovery.fail_over_hosts()  # what the watchdog's beat runs
    instance.refresh_from_db()
    assert instance.state == State.UNREACHABLE
    assert instance.reason.code == Code.ENGINE_DOWN
    assert f"container engine on host {host.name} does not answer since" in instance.state_reason
    assert "not billed as running" in reasons.of_instance(instance)
    gone = instance.events.last()
    assert gone.at == since  # billing's GPU segment ends at the outage's start
    assert State.UNREACHABLE not in KIND_STATES[UsageKind.GPU]

    # while the engine is down, reconcile does not take the agent's word that it runs
    assert tasks.reconcile_host.apply(args=[host.pk]).get() == {}
    assert not recovery.adopt(host, instance.pk, instance.current_allocation().pk)
    instance.refresh_from_db()
    assert instance.state == State.UNREACHABLE

    host = fleet.record_heartbeat(host, engine={"state": "up"})
    assert host.engine_down_since is None and host.schedulable
    outcome = tasks.reconcile_host.apply(args=[host.pk]).get()
    assert outcome["adopted"] == [instance.pk]
    instance.refresh_from_db()
    back = instance.events.last()
    assert (instance.state, back.at) == (State.RUNNING, since)  # the outage billed: it ran
    messages = list(host.events.values_list("message", flat=True))
    assert any("container engine does not answer since" in m for m in messages)
    assert any("container engine answers again" in m for m in messages)


def test_one_whose_container_died_with_the_engine_ends_and_its_outage_stays_unbilled(
    catalog, tenant, agents
):
    host = catalog.host(gpus=1, mode=Mode.SHARED)
    instance = running(catalog, tenant)
    instance.events.update(at=timezone.now() - timedelta(minutes=5))
    host, since = engine_down(host, 20)
    recovery.fail_over_hosts()
    allocation = instance.current_allocation().pk
    # Docker without live-restore: the engine killed it when it stopped
    agents.hosts[host.name][allocation].update(
        state="failed", reason="exit code 137", exit_code=137
    )
    host = fleet.record_heartbeat(host, engine={"state": "up"})
    outcome = tasks.reconcile_host.apply(args=[host.pk]).get()
    assert outcome["adopted"] == []
    instance.refresh_from_db()
    assert instance.state in (State.FAILED, State.PENDING, State.STARTING, State.PROVISIONING)
    assert not instance.events.filter(to_state=State.RUNNING, at__gt=since).exists()


def test_a_silent_host_says_so_rather_than_its_engine(catalog, tenant, agents):
    host = catalog.host(gpus=1, mode=Mode.SHARED)
    instance = running(catalog, tenant)
    host, _ = engine_down(host, 30)
    Host.objects.filter(pk=host.pk).update(
        status=Host.Status.UNREACHABLE, unreachable_since=timezone.now()
    )
    recovery.fail_over_hosts()
    instance.refresh_from_db()
    assert instance.reason.code == Code.HOST_UNREACHABLE
