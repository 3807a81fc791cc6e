"""The maximum runtime counts from the start the tenant asked for (console.instances.runs):
an adoption after a silent host, a reboot and a live resize go on with the same run; a stop and
a start by the tenant begin a new one. Real services on the database, at frozen times."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
import time_machine

from console.catalog.models import Mode
from console.fleet.models import Host
from console.idle import services as idle
from console.idle.models import OperatorPolicy
from console.instances import outcomes, recovery, runs, services
from console.instances.models import Instance, State
from tests.factories import SpecFactory

pytestmark = pytest.mark.usefixtures("no_tasks")

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def minute(m: float) -> datetime:
    return T0 + timedelta(minutes=m)


def evaluate(instance: Instance, m: float) -> str:
    with time_machine.travel(minute(m), tick=False):
        return idle.evaluate(instance.pk, minute(m).timestamp())


def running_at(instance: Instance, m: float) -> None:
    """Its agent says it runs its allocation since minute `m`."""
    with time_machine.travel(minute(m), tick=False):
        assert outcomes.mark_running(instance.pk, instance.current_allocation().pk)


@pytest.fixture
def host(catalog):
    return catalog.host(gpus=1, mode=Mode.SHARED, vcpus=16, ram_mib=65536)


@pytest.fixture
def limited(tenant):
    """Maximum runtime 120 min, warned 5 min ahead, no idle window: it stops the instance."""
    return OperatorPolicy.objects.create(
        tenant=tenant, window_minutes=None, warning_minutes=Decimal(5),
        max_runtime_minutes=Decimal(120),
    )  # fmt: skip


@pytest.fixture
def launched(catalog, tenant, member, host, limited):
    """Launched by mia at minute -1, running from minute 0."""
    with time_machine.travel(minute(-1), tick=False):
        instance = services.launch_instance(
            tenant, name="train", spec=catalog.quarter, image=catalog.image, actor=member.user
        )
    running_at(instance, 0)
    return Instance.objects.get(pk=instance.pk)


def adopt_after_silence(instance: Instance, host: Host, silent: float, adopted: float) -> None:
    """Its host is last heard at minute `silent` (the instance goes unreachable) and heard
    again at minute `adopted`, still running it: adopted back."""
    Host.objects.filter(pk=host.pk).update(
        status=Host.Status.UNREACHABLE, last_heartbeat_at=minute(silent)
    )
    with time_machine.travel(minute(silent + 1), tick=False):
        assert recovery.mark_unreachable() == 1
    Host.objects.filter(pk=host.pk).update(status=Host.Status.ACTIVE)
    with time_machine.travel(minute(adopted), tick=False):
        assert recovery.adopt(host, instance.pk, instance.current_allocation().pk)
    assert Instance.objects.get(pk=instance.pk).state == State.RUNNING


def stopped_by_its_limit(instance: Instance) -> bool:
    instance.refresh_from_db()
    return instance.state == State.STOPPING and instance.state_reason.startswith(
        "runtime_limit: it reached its maximum runtime of 120"
    )


def test_an_adopted_run_is_warned_and_stopped_at_its_maximum_runtime(launched, host):
    adopt_after_silence(launched, host, silent=48, adopted=50)
    assert runs.run_started(launched) == minute(0)  # not the adoption's minute 48
    assert evaluate(launched, 60) == "wait"
    assert evaluate(launched, 115) == "warn"  # 5 min ahead of minute 120, not of minute 168
    assert launched.idle_watch.acts_at == minute(120)
    assert evaluate(launched, 119) == "wait"
    assert evaluate(launched, 121) == "act"
    assert stopped_by_its_limit(launched)


def test_a_reboot_and_a_live_resize_go_on_with_the_same_run(catalog, launched, member, host):
    bigger = SpecFactory(
        code="a100-quarter-xl", name="A100 1/4 XL", mode=Mode.SHARED, milli=250,
        gpu_memory_mib=20480, gpu_model=catalog.a100, vcpus=12, ram_mib=49152, disk_gib=50,
        price_per_hour=Decimal("1.2000"),
    )  # fmt: skip
    with time_machine.travel(minute(30), tick=False):
        services.reboot_instance(launched, actor=member.user)
    running_at(launched, 31)
    with time_machine.travel(minute(90), tick=False):
        services.resize_instance(launched, bigger, actor=member.user)
    launched.refresh_from_db()
    assert (launched.state, launched.spec) == (State.RUNNING, bigger)  # resized live
    assert runs.run_started(launched) == minute(0)
    assert evaluate(launched, 114) == "wait"
    assert evaluate(launched, 115) == "warn"
    assert evaluate(launched, 120) == "act"
    assert stopped_by_its_limit(launched)


def test_a_stop_and_a_start_by_the_tenant_begin_a_new_run(launched, member):
    with time_machine.travel(minute(60), tick=False):
        services.stop_instance(launched, actor=member.user)
        assert outcomes.finish_stop(launched.pk)
    with time_machine.travel(minute(70), tick=False):
        services.start_instance(Instance.objects.get(pk=launched.pk), actor=member.user)
    running_at(launched, 72)
    assert runs.run_started(launched) == minute(72)
    assert evaluate(launched, 121) == "wait"
    assert evaluate(launched, 186) == "wait"
    assert evaluate(launched, 187) == "warn"  # 5 min ahead of 72 + 120
    assert evaluate(launched, 192) == "act"
    assert stopped_by_its_limit(launched)


def test_a_restart_by_its_restart_policy_goes_on_with_the_same_run(launched, host):
    from console.instances import restarts

    Instance.objects.filter(pk=launched.pk).update(restart_policy="always")
    with time_machine.travel(minute(40), tick=False):
        exited = outcomes.Outcome(launched.current_allocation().pk, "exited", exit_code=0)
        assert outcomes.record_outcome(host, launched.pk, exited)
        assert outcomes.finish_stop(launched.pk)
    with time_machine.travel(minute(41), tick=False):
        due = Instance.objects.get(pk=launched.pk).restart_at.isoformat()
        assert restarts.restart(launched.pk, due)
    running_at(launched, 42)
    assert runs.run_started(launched) == minute(0)


def test_a_run_not_yet_running_since_its_start_has_no_start(catalog, tenant, member, host):
    with time_machine.travel(minute(0), tick=False):
        instance = services.launch_instance(
            tenant, name="queued", spec=catalog.quarter, image=catalog.image, actor=member.user
        )
    assert runs.run_started(instance) is None  # provisioning: it has not run yet
