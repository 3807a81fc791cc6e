"""A host lost for good: each of its instances comes back elsewhere on a fresh disk, or stays
failed with the reason in words, as its restart policy and on_host_loss say; billed once."""

from datetime import timedelta

import pytest
from django.utils import timezone

from billing.models import UsageKind, UsageSegment
from console.catalog.models import Mode, RestartPolicy
from console.fleet.models import Host
from console.instances import recovery, services, tasks
from console.instances.models import Instance, OnHostLoss, State
from tests.instances.fakes import FakeAgents


@pytest.fixture
def agents(monkeypatch):
    return FakeAgents().install(monkeypatch)


def running_on_a(catalog, tenant, name="box", **kw):
    instance = services.launch_instance(
        tenant, name=name, spec=catalog.whole1, image=catalog.image, **kw
    )
    tasks.provision.apply(args=[instance.pk])
    instance.refresh_from_db()
    assert instance.state == State.RUNNING
    return instance


def lose(host):
    """Unreachable for longer than HOST_FAILOVER_SECONDS; heard last just now (after what ran
    on it began): answers when."""
    heard = timezone.now()
    Host.objects.filter(pk=host.pk).update(
        status=Host.Status.UNREACHABLE,
        unreachable_since=heard - timedelta(minutes=6),
        last_heartbeat_at=heard,
    )
    return heard


def test_a_fresh_disk_instance_runs_again_on_another_host_billed_once(
    catalog, tenant, agents, django_capture_on_commit_callbacks
):
    a = catalog.host("host-a", gpus=1, mode=Mode.WHOLE)
    with django_capture_on_commit_callbacks(execute=True):  # billing hears each step
        box = services.launch_instance(
            tenant, name="box", spec=catalog.whole1, image=catalog.image, on_host_loss="fresh_disk"
        )
    with django_capture_on_commit_callbacks(execute=True):
        tasks.provision.apply(args=[box.pk])
    old_disk, ran = box.disk_name, box.events.last().at
    b = catalog.host("host-b", gpus=1, mode=Mode.WHOLE)
    heard = lose(a)
    with django_capture_on_commit_callbacks(execute=True):
        assert recovery.fail_over_hosts() == 1
    box.refresh_from_db()
    assert box.state == State.STARTING
    assert box.disk_name != old_disk and box.disk_host == b  # a new disk, made on host-b
    *_, failed, again = box.events.all()
    assert (failed.to_state, failed.at) == (State.FAILED, heard)
    assert failed.message == (
        f"host_lost: host host-a lost at {heard:%Y-%m-%d %H:%M} UTC; it runs again elsewhere "
        "on a fresh disk, its old disk stays there"
    )
    assert (again.from_state, again.to_state) == (State.FAILED, State.STARTING)
    assert (
        again.message == "Re-placed on a fresh disk after host host-a was lost; GPU slice reserved"
    )
    assert a.events.filter(message__startswith=f"Disk {old_disk} of instance {box.pk}").exists()

    with django_capture_on_commit_callbacks(execute=True):
        tasks.provision.apply(args=[box.pk])
    box.refresh_from_db()
    assert box.state == State.RUNNING
    allocation = box.current_allocation()
    assert allocation.host == b
    assert agents.hosts["host-b"][allocation.pk]["body"]["volume"]["name"] == box.disk_name
    ran_again = box.events.last().at
    gpu = UsageSegment.objects.filter(instance=box, kind=UsageKind.GPU).order_by("started_at")
    assert [(s.started_at, s.ended_at) for s in gpu] == [
        (ran, heard),  # the run on host-a, closed at its heartbeat
        (ran_again, None),  # the run on host-b, from when it runs there
    ]


def test_with_nothing_free_it_waits_in_the_queue_for_any_host(catalog, tenant, agents):
    a = catalog.host("host-a", gpus=1, mode=Mode.WHOLE)
    box = running_on_a(catalog, tenant, on_host_loss=OnHostLoss.FRESH_DISK)
    lose(a)
    catalog.host("host-b", gpus=1, mode=Mode.WHOLE)
    running_on_a(catalog, tenant, name="other")  # takes host-b's only GPU
    assert recovery.fail_over_hosts() == 1
    box.refresh_from_db()
    assert (box.state, box.disk_host) == (State.PENDING, None)
    assert box.state_reason == "Waiting for capacity: no A100 x1 free in Local 1."
    assert box.events.last().message == (
        "Re-placed on a fresh disk after host host-a was lost; waiting for capacity"
    )


@pytest.mark.parametrize(
    ("kw", "why"),
    [
        ({}, "its disk cannot move; launch with on_host_loss=fresh_disk to come back elsewhere"),
        (
            {"on_host_loss": OnHostLoss.FRESH_DISK, "restart_policy": RestartPolicy.NEVER},
            "restart policy: never",
        ),
    ],
)
def test_otherwise_it_stays_failed_with_the_reason_in_words(catalog, tenant, agents, kw, why):
    a = catalog.host("host-a", gpus=1, mode=Mode.WHOLE)
    box = running_on_a(catalog, tenant, **kw)
    disk = box.disk_name
    catalog.host("host-b", gpus=1, mode=Mode.WHOLE)
    heard = lose(a)
    assert recovery.fail_over_hosts() == 1
    box.refresh_from_db()
    assert (box.state, box.disk_host, box.disk_name) == (State.FAILED, a, disk)
    assert box.state_reason == (
        f"host_lost: host host-a lost at {heard:%Y-%m-%d %H:%M} UTC; its disk stays there until "
        f"the host returns ({why})"
    )
    assert not a.events.filter(message__startswith="Disk").exists()


def test_the_restart_policy_is_the_images_unless_the_launch_chooses(catalog, tenant):
    catalog.host("host-a", gpus=2, mode=Mode.WHOLE)
    catalog.image.restart_policy = RestartPolicy.ALWAYS
    catalog.image.save()
    default = services.launch_instance(tenant, name="one", spec=catalog.whole1, image=catalog.image)
    chosen = services.launch_instance(
        tenant, name="two", spec=catalog.whole1, image=catalog.image, restart_policy="never"
    )
    assert (default.restart_policy, default.on_host_loss) == ("always", "keep_disk")
    assert Instance.objects.get(pk=chosen.pk).restart_policy == "never"
