"""Heartbeats sync a host's GPUs; the watchdog marks silent hosts unreachable and heartbeats
bring them back to the status their operator chose."""

from datetime import timedelta

import pytest
from django.utils import timezone

from console.fleet import services, tasks
from console.fleet.models import Gpu, Host, HostEvent
from tests.fleet.conftest import make_gpu, make_inventory, with_digest

pytestmark = pytest.mark.django_db


def heartbeat(host, inventory):
    return services.record_heartbeat(
        host, agent_version="0.1.1", inventory_digest=inventory["digest"], inventory=inventory
    )


def test_heartbeat_syncs_health_mode_and_new_and_missing_gpus(register, h100):
    host, _ = register("host-x", gpus=3)
    inventory = make_inventory("host-x", gpus=3)
    gpus = inventory["gpus"]
    gpus[0].update(healthy=False, health_reason="xid79: GPU has fallen off the bus")
    gpus[1].update(mode="shared", mig_enabled=False, name="renamed", memory_mib=40000)
    del gpus[2]  # gone
    gpus.append({**make_gpu(3, "host-x", model="h100-80gb"), "mode": "whole"})  # new
    host = heartbeat(host, with_digest(inventory))
    state = {g.index: g for g in Gpu.objects.filter(host=host)}
    assert not state[0].healthy and state[0].health_reason.startswith("xid79")
    assert state[0].health_changed_at is not None
    assert (state[1].mode, state[1].name, state[1].memory_mib) == ("shared", "renamed", 40000)
    assert not state[2].healthy and state[2].health_reason == "missing from inventory"
    assert state[3].model == h100 and state[3].mode == "whole" and state[3].healthy
    assert host.agent_version == "0.1.1"
    assert host.inventory_digest == with_digest(inventory)["digest"]

    # it heals and comes back
    healed = make_inventory("host-x", gpus=3)
    healed["gpus"].append({**make_gpu(3, "host-x", model="h100-80gb"), "mode": "whole"})
    heartbeat(host, with_digest(healed))
    assert Gpu.objects.filter(host=host, healthy=True).count() == 4


def test_same_digest_does_not_sync(register):
    host, _ = register("host-x", gpus=2)
    inventory = make_inventory("host-x", gpus=2)
    inventory["gpus"][0]["healthy"] = False  # but the digest says nothing changed
    services.record_heartbeat(
        host,
        inventory_digest=host.inventory_digest,
        inventory={**inventory, "digest": host.inventory_digest},
    )
    assert Gpu.objects.filter(host=host, healthy=False).count() == 0


def test_unknown_model_on_heartbeat_skips_that_gpu_and_retries(register):
    host, _ = register("host-x", gpus=1)
    inventory = make_inventory("host-x", gpus=1)
    inventory["gpus"].append(make_gpu(1, "host-x", model="mystery-gpu"))
    host = heartbeat(host, with_digest(inventory))
    assert host.gpus.count() == 1
    assert host.inventory_digest == ""  # so the next heartbeat syncs again


def test_replaced_gpu_takes_the_slot_of_the_missing_one(register):
    host, _ = register("host-x", gpus=2)
    inventory = make_inventory("host-x", gpus=2)
    inventory["gpus"][1]["uuid"] = "GPU-replacement"
    heartbeat(host, with_digest(inventory))
    assert sorted(host.gpus.values_list("index", "uuid")) == [
        (0, "GPU-host-x-0"),
        (1, "GPU-replacement"),
    ]


def test_gpus_that_swap_indices(register):
    host, _ = register("host-x", gpus=2)
    inventory = make_inventory("host-x", gpus=2)
    inventory["gpus"][0]["index"], inventory["gpus"][1]["index"] = 1, 0
    heartbeat(host, with_digest(inventory))
    assert sorted(host.gpus.values_list("index", "uuid")) == [
        (0, "GPU-host-x-1"),
        (1, "GPU-host-x-0"),
    ]


def silence(host, seconds):
    Host.objects.filter(pk=host.pk).update(
        last_heartbeat_at=timezone.now() - timedelta(seconds=seconds)
    )


def test_watchdog_marks_silent_hosts_and_heartbeat_brings_them_back(register, settings):
    settings.HOST_HEARTBEAT_GRACE_SECONDS = 10
    quiet, secret = register("quiet")
    chatty, _ = register("chatty")
    retired, _ = register("retired")
    services.set_host_status(retired, Host.Status.RETIRED)
    services.set_host_status(quiet, Host.Status.MAINTENANCE)
    silence(quiet, 11)
    silence(retired, 100)
    silence(chatty, 5)
    assert tasks.watchdog() == ["quiet"]
    assert tasks.watchdog() == []  # a second run changes nothing
    quiet.refresh_from_db()
    assert quiet.status == Host.Status.UNREACHABLE
    assert quiet.admin_status == Host.Status.MAINTENANCE
    assert quiet.unreachable_since is not None
    assert Host.objects.get(name="retired").status == Host.Status.RETIRED
    assert Host.objects.get(name="chatty").status == Host.Status.ACTIVE
    event = HostEvent.objects.filter(host=quiet).first()
    assert (event.from_status, event.to_status, event.actor_label) == (
        "maintenance",
        "unreachable",
        "system",
    )
    assert "no heartbeat for 11 s" in event.message

    Host.objects.filter(pk=quiet.pk).update(
        unreachable_since=timezone.now() - timedelta(seconds=90)
    )
    assert list(services.hosts_unreachable_longer_than(60)) == [quiet]
    assert list(services.hosts_unreachable_longer_than(120)) == []

    services.record_heartbeat(quiet, inventory_digest=quiet.inventory_digest)
    quiet.refresh_from_db()
    assert quiet.status == Host.Status.MAINTENANCE  # the operator's choice, not `active`
    assert quiet.unreachable_since is None
    assert HostEvent.objects.filter(host=quiet).first().to_status == "maintenance"
    assert list(services.hosts_unreachable_longer_than(0)) == []


def test_watchdog_loses_to_a_heartbeat_that_came_first(register, settings, monkeypatch):
    """Compare-and-swap: the watchdog read a stale heartbeat time; the heartbeat wins."""
    settings.HOST_HEARTBEAT_GRACE_SECONDS = 10
    host, _ = register("host-x")
    silence(host, 30)
    original = Host.objects.filter

    def filter_then_heartbeat(*args, **kwargs):
        result = original(*args, **kwargs)
        if "last_heartbeat_at" in kwargs and "status" in kwargs:  # the CAS update
            original(pk=host.pk).update(last_heartbeat_at=timezone.now())
        return result

    marked = services.mark_silent_hosts_unreachable()
    assert [h.name for h in marked] == ["host-x"]  # sanity: without the race it marks
    Host.objects.filter(pk=host.pk).update(
        status="active", last_heartbeat_at=timezone.now() - timedelta(seconds=30)
    )
    monkeypatch.setattr(Host.objects, "filter", filter_then_heartbeat)
    assert services.mark_silent_hosts_unreachable() == []
    monkeypatch.undo()
    host.refresh_from_db()
    assert host.status == Host.Status.ACTIVE


def test_operator_choice_while_unreachable_takes_effect_on_return(register, settings):
    settings.HOST_HEARTBEAT_GRACE_SECONDS = 10
    host, _ = register("host-x")
    silence(host, 20)
    tasks.watchdog()
    host = services.set_host_status(host, Host.Status.CORDONED)
    assert (host.status, host.admin_status) == ("unreachable", "cordoned")
    host = services.record_heartbeat(host)
    assert host.status == Host.Status.CORDONED
