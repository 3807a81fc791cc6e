"""Host failover when the console, not the hosts, went deaf: hosts that went silent together
with (a large share of) the whole fleet keep their instances (issue 16, item 7)."""

from datetime import timedelta
from decimal import Decimal

import time_machine
from django.utils import timezone

from accounts.models import Quota
from console.catalog.models import Mode
from console.fleet import services as fleet
from console.fleet.models import Host
from console.instances import outcomes, recovery, services
from console.instances.models import Instance, State


def _running_on_its_own_host(catalog, tenant):
    """A whole GPU on a new one-GPU host: the only host with a free GPU."""
    Quota.objects.filter(tenant=tenant).update(gpu_quota=Decimal(8), max_instances=8)
    host = catalog.host(gpus=1, mode=Mode.WHOLE)
    instance = services.launch_instance(
        tenant, name=f"box-{host.name}", spec=catalog.whole1, image=catalog.image
    )
    assert instance.current_allocation().host_id == host.pk
    outcomes.mark_running(instance.pk, instance.current_allocation().pk)
    return host, instance


def _silent(host, *, since_seconds: float, heard_seconds_ago: float, now):
    Host.objects.filter(pk=host.pk).update(
        status=Host.Status.UNREACHABLE,
        unreachable_since=now - timedelta(seconds=since_seconds),
        last_heartbeat_at=now - timedelta(seconds=heard_seconds_ago),
    )


def _state(instance):
    return Instance.objects.get(pk=instance.pk).state


def test_every_host_silent_at_once_is_the_consoles_outage_not_the_hosts(catalog, tenant, settings):
    settings.HOST_FAILOVER_SECONDS = 60
    settings.HOST_HEARTBEAT_GRACE_SECONDS = 15
    host, instance = _running_on_its_own_host(catalog, tenant)
    others = [catalog.host(), catalog.host()]
    now = timezone.now()
    # its web process was down: nobody was heard for 90 s, within a few seconds of each other
    for n, silent in enumerate([host, *others]):
        _silent(silent, since_seconds=75, heard_seconds_ago=90 + 3 * n, now=now)
    assert recovery.fail_over_hosts(now) == 0
    assert _state(instance) == State.UNREACHABLE  # not failed: it may well run there

    # the console hears again: one of the others calls back first, then the second. This one
    # has the whole failover time from the last of them to be heard, as they had
    with time_machine.travel(now, tick=False):
        fleet.record_heartbeat(others[0])
    later = now + timedelta(seconds=5)
    with time_machine.travel(later, tick=False):
        fleet.record_heartbeat(others[1])
    assert recovery.fail_over_hosts(later) == 0
    assert recovery.fail_over_hosts(later + timedelta(seconds=59)) == 0
    assert _state(instance) == State.UNREACHABLE

    # still unheard a failover time after the others were: now it is the host
    assert recovery.fail_over_hosts(later + timedelta(seconds=61)) == 1
    failed = Instance.objects.get(pk=instance.pk)
    assert failed.state == State.FAILED
    assert failed.state_reason.startswith(f"host_lost: host {host.name} lost at ")


def test_a_host_heard_again_restarts_only_the_clocks_of_those_silent_with_it(
    catalog, tenant, settings
):
    settings.HOST_FAILOVER_SECONDS = 60
    settings.HOST_HEARTBEAT_GRACE_SECONDS = 15
    settings.HOST_FAILOVER_SILENT_SHARE = 0.5
    host, instance = _running_on_its_own_host(catalog, tenant)
    lonely_host, lonely = _running_on_its_own_host(catalog, tenant)
    partner = catalog.host()
    now = timezone.now()
    _silent(host, since_seconds=75, heard_seconds_ago=90, now=now)
    _silent(partner, since_seconds=73, heard_seconds_ago=88, now=now)
    _silent(lonely_host, since_seconds=20, heard_seconds_ago=35, now=now)  # later, alone
    with time_machine.travel(now, tick=False):
        fleet.record_heartbeat(partner)
    assert Host.objects.get(pk=host.pk).unreachable_since == now
    assert Host.objects.get(pk=lonely_host.pk).unreachable_since == now - timedelta(seconds=20)
    assert recovery.fail_over_hosts(now + timedelta(seconds=45)) == 1  # the lonely one's time
    assert (_state(instance), _state(lonely)) == (State.UNREACHABLE, State.FAILED)


def test_the_share_is_the_operators_and_a_host_silent_alone_fails_over(catalog, tenant, settings):
    settings.HOST_FAILOVER_SECONDS = 60
    settings.HOST_HEARTBEAT_GRACE_SECONDS = 15
    settings.HOST_FAILOVER_SILENT_SHARE = 0.6  # an operator's "most of the fleet"
    lonely_host, lonely = _running_on_its_own_host(catalog, tenant)
    host, instance = _running_on_its_own_host(catalog, tenant)
    quiet_host, quiet = _running_on_its_own_host(catalog, tenant)
    catalog.host()
    now = timezone.now()
    _silent(lonely_host, since_seconds=280, heard_seconds_ago=300, now=now)  # alone, earlier
    _silent(host, since_seconds=75, heard_seconds_ago=90, now=now)  # these two together: 2
    _silent(quiet_host, since_seconds=70, heard_seconds_ago=85, now=now)  # of 4 is not 60 %
    assert recovery.fail_over_hosts(now) == 3
    assert {_state(i) for i in (lonely, instance, quiet)} == {State.FAILED}


def test_three_of_four_silent_together_is_held_with_a_share_of_sixty_percent(
    catalog, tenant, settings
):
    settings.HOST_FAILOVER_SECONDS = 60
    settings.HOST_HEARTBEAT_GRACE_SECONDS = 15
    hosts = [_running_on_its_own_host(catalog, tenant) for _ in range(3)]
    catalog.host()
    now = timezone.now()
    for n, (host, _) in enumerate(hosts):
        _silent(host, since_seconds=75, heard_seconds_ago=90 + n, now=now)
    settings.HOST_FAILOVER_SILENT_SHARE = 0.6
    assert recovery.fail_over_hosts(now) == 0
    assert {_state(instance) for _, instance in hosts} == {State.UNREACHABLE}
    settings.HOST_FAILOVER_SILENT_SHARE = 1.0  # the default: only when every host went silent
    assert recovery.fail_over_hosts(now) == 3


def test_a_fleet_of_one_host_cannot_tell_and_fails_over(catalog, tenant, settings):
    settings.HOST_FAILOVER_SECONDS = 60
    host, instance = _running_on_its_own_host(catalog, tenant)
    now = timezone.now()
    _silent(host, since_seconds=75, heard_seconds_ago=90, now=now)
    assert recovery.fail_over_hosts(now) == 1
    assert _state(instance) == State.FAILED
