"""Services and placement on the database alone (no worker, no agent): the tasks they queue
are recorded by the `no_tasks` fixture."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.core.exceptions import ValidationError
from django.db.models import F
from django.utils import timezone

from accounts.models import Quota
from console.catalog.models import Mode
from console.fleet.models import Gpu, Host
from console.instances import outcomes, placement, queue, recovery, resizing, services
from console.instances.models import Allocation, GpuClaim, Instance, InstanceEvent, State
from console.instances.quota import usage
from console.instances.reasons import Code, Reason
from tests.factories import SpecFactory
from tests.instances.helpers import make_instance, states

pytestmark = pytest.mark.usefixtures("no_tasks")


def launch(catalog, tenant, spec=None, name=None, **kw):
    name = name or f"box-{Instance.objects.count() + 1}"
    return services.launch_instance(
        tenant, name=name, spec=spec or catalog.quarter, image=catalog.image, **kw
    )


def set_quota(tenant, gpu="8", instances=50):
    Quota.objects.filter(tenant=tenant).update(gpu_quota=Decimal(gpu), max_instances=instances)


def claims_of(instance):
    return list(
        GpuClaim.objects.filter(allocation__instance=instance, allocation__released_at__isnull=True)
        .order_by("gpu_id", "slot")
        .values_list("gpu__index", "slot", "milli")
    )


class TestLaunch:
    def test_placed_at_once_when_a_slice_is_free(self, catalog, tenant, member, no_tasks):
        catalog.host(gpus=1, mode=Mode.SHARED)
        instance = launch(catalog, tenant, actor=member.user)
        assert instance.state == State.PROVISIONING
        assert states(instance) == ["pending", "provisioning"]
        assert instance.events.first().actor_label == "mia"
        allocation = instance.current_allocation()
        assert allocation.request["shared"] == {"milli": 250, "memory_mib": 20480}
        assert allocation.request["gpus"] == [0]
        assert no_tasks == [("provision", instance.pk)]

    def test_queued_when_nothing_fits(self, catalog, tenant, no_tasks):
        catalog.host(gpus=1, mode=Mode.SHARED, status=Host.Status.CORDONED)  # there, not free
        instance = launch(catalog, tenant)
        assert instance.state == State.PENDING
        assert "Waiting for capacity" in Instance.objects.get(pk=instance.pk).state_reason
        assert no_tasks == []

    def test_a_launch_that_no_host_could_ever_hold_is_refused(self, catalog, tenant):
        catalog.host(gpus=1, mode=Mode.MIG)  # A100s, but none in shared mode
        with pytest.raises(ValidationError) as caught:
            launch(catalog, tenant)
        assert caught.value.message_dict["spec"] == [
            "A100 1/4 cannot be launched: No host in Local 1 has NVIDIA A100 80GB GPUs in "
            "shared fraction mode that could hold A100 1/4."
        ]
        assert not Instance.objects.filter(tenant=tenant).exists()

    def test_a_pending_instance_that_can_never_be_placed_says_so(self, catalog, tenant):
        host = catalog.host(gpus=1, status=Host.Status.CORDONED)
        instance = launch(catalog, tenant)
        assert instance.state == State.PENDING
        Gpu.objects.filter(host=host).update(mode=Mode.MIG)  # the hardware went away
        queue.schedule_pending()
        assert Instance.objects.get(pk=instance.pk).state_reason == (
            "Can never be placed: No host in Local 1 has NVIDIA A100 80GB GPUs in shared "
            "fraction mode that could hold A100 1/4."
        )

    def test_default_region_is_where_it_fits(self, catalog, tenant):
        catalog.host(gpus=1, mode=Mode.SHARED, region=catalog.region2)
        instance = launch(catalog, tenant)
        assert instance.region == catalog.region2
        assert instance.state == State.PROVISIONING

    def test_field_errors(self, catalog, tenant):
        catalog.cordoned()
        with pytest.raises(ValidationError) as caught:
            launch(catalog, tenant, name="Not A Name!")
        assert "name" in caught.value.message_dict
        launch(catalog, tenant, name="taken")
        with pytest.raises(ValidationError) as caught:
            launch(catalog, tenant, name="taken")
        assert "already exists" in caught.value.message_dict["name"][0]
        catalog.half.active = False
        catalog.half.save()
        with pytest.raises(ValidationError) as caught:
            launch(catalog, tenant, spec=catalog.half)
        assert "spec" in caught.value.message_dict

    def test_gpu_quota(self, catalog, tenant):
        catalog.cordoned()
        set_quota(tenant, gpu="0.5")
        launch(catalog, tenant)
        launch(catalog, tenant)
        with pytest.raises(services.QuotaExceeded) as caught:
            launch(catalog, tenant)
        assert caught.value.code == "quota_exceeded"
        assert "0.25" in caught.value.detail
        assert Instance.objects.filter(tenant=tenant).count() == 2

    def test_instance_quota(self, catalog, tenant):
        catalog.cordoned()
        set_quota(tenant, instances=1)
        launch(catalog, tenant)
        with pytest.raises(services.QuotaExceeded):
            launch(catalog, tenant)

    def test_stopped_failed_and_terminated_do_not_count(self, catalog, tenant):
        catalog.cordoned()
        set_quota(tenant, gpu="0.25", instances=1)
        for state in (State.STOPPED, State.FAILED, State.TERMINATED, State.TERMINATING):
            make_instance(catalog, tenant, state=state)
        launch(catalog, tenant)
        assert usage(tenant).gpu_used == Decimal("0.25")


class TestPlacement:
    def test_mig_slots_never_overlap(self, catalog, tenant):
        set_quota(tenant)
        catalog.host(gpus=1, mode=Mode.MIG)
        placed = [launch(catalog, tenant, spec=catalog.mig1g) for _ in range(7)]
        assert all(i.state == State.PROVISIONING for i in placed)
        slots = sorted(s for i in placed for _, s, _ in claims_of(i))
        assert slots == [0, 1, 2, 3, 4, 5, 6]  # 1g.10gb may not start at 7
        assert launch(catalog, tenant, spec=catalog.mig1g).state == State.PENDING

    def test_mig_profile_starts(self, catalog, tenant):
        set_quota(tenant)
        catalog.host(gpus=1, mode=Mode.MIG)
        a = launch(catalog, tenant, spec=catalog.mig3g)
        b = launch(catalog, tenant, spec=catalog.mig3g)
        assert {tuple(s for _, s, _ in claims_of(i)) for i in (a, b)} == {
            (0, 1, 2, 3),
            (4, 5, 6, 7),
        }
        assert a.current_allocation().request["mig"]["profile"] == "3g.40gb"
        assert launch(catalog, tenant, spec=catalog.mig1g).state == State.PENDING

    def test_shared_sums_fractions(self, catalog, tenant):
        set_quota(tenant)
        catalog.host(gpus=1, mode=Mode.SHARED)
        assert launch(catalog, tenant, spec=catalog.half).state == State.PROVISIONING
        assert launch(catalog, tenant).state == State.PROVISIONING
        assert launch(catalog, tenant).state == State.PROVISIONING
        assert launch(catalog, tenant).state == State.PENDING

    def test_whole_gpus_on_one_host(self, catalog, tenant):
        set_quota(tenant)
        catalog.host("a", gpus=1, mode=Mode.WHOLE)
        catalog.host("b", gpus=1, mode=Mode.WHOLE)
        with pytest.raises(ValidationError, match="could hold A100 x2"):
            launch(catalog, tenant, spec=catalog.whole2)  # two GPUs, but on two hosts
        big = catalog.host("c", gpus=2, mode=Mode.WHOLE)
        instance = launch(catalog, tenant, spec=catalog.whole2)
        assert instance.state == State.PROVISIONING
        assert instance.current_allocation().host == big
        assert len(claims_of(instance)) == 16  # 2 GPUs × 8 slots
        assert instance.current_allocation().request["gpus"] == [0, 1]

    @pytest.mark.parametrize(
        "status",
        [Host.Status.CORDONED, Host.Status.DRAINING, Host.Status.MAINTENANCE,
         Host.Status.UNREACHABLE],
    )  # fmt: skip
    def test_never_on_an_unschedulable_host(self, catalog, tenant, status):
        catalog.host(gpus=1, mode=Mode.SHARED, status=status)
        assert launch(catalog, tenant).state == State.PENDING

    def test_a_retired_host_is_no_hardware(self, catalog, tenant):
        catalog.host(gpus=1, mode=Mode.SHARED, status=Host.Status.RETIRED)
        with pytest.raises(ValidationError, match="No host in Local 1"):
            launch(catalog, tenant)

    def test_never_on_an_unhealthy_gpu_or_the_wrong_mode(self, catalog, tenant):
        host = catalog.host(gpus=2, mode=Mode.SHARED)
        Gpu.objects.filter(host=host, index=0).update(healthy=False)
        Gpu.objects.filter(host=host, index=1).update(mode=Mode.MIG)
        assert launch(catalog, tenant).state == State.PENDING
        assert launch(catalog, tenant, spec=catalog.mig1g).state == State.PROVISIONING

    def test_host_cpu_and_ram(self, catalog, tenant):
        set_quota(tenant)
        catalog.host(gpus=1, mode=Mode.SHARED, vcpus=6, ram_mib=512000)  # room for one 4-vCPU spec
        assert launch(catalog, tenant).state == State.PROVISIONING
        assert launch(catalog, tenant).state == State.PENDING

    def test_fragmentation_prefers_the_fuller_gpu(self, catalog, tenant):
        set_quota(tenant)
        catalog.host("a", gpus=2, mode=Mode.SHARED)
        first = launch(catalog, tenant)
        second = launch(catalog, tenant)
        gpu = {claims_of(first)[0][0], claims_of(second)[0][0]}
        assert len(gpu) == 1  # packed on one GPU, the other stays whole for a big request

    def test_unique_slot_constraint_refuses_a_double_allocation(self, catalog, tenant):
        from django.db import IntegrityError, transaction

        host = catalog.host(gpus=1, mode=Mode.MIG)
        gpu = host.gpus.get()
        a = make_instance(catalog, tenant, state=State.RUNNING, spec=catalog.mig1g)
        b = make_instance(catalog, tenant, state=State.RUNNING, spec=catalog.mig1g)
        one = Allocation.objects.create(id="x1", instance=a, host=host, mode=Mode.MIG)
        two = Allocation.objects.create(id="x2", instance=b, host=host, mode=Mode.MIG)
        GpuClaim.objects.create(allocation=one, gpu=gpu, slot=3)
        with pytest.raises(IntegrityError), transaction.atomic():
            GpuClaim.objects.create(allocation=two, gpu=gpu, slot=3)

    def test_fits_now_snapshot(self, catalog, tenant):
        catalog.host(gpus=1, mode=Mode.MIG)
        hosts = placement.snapshot(catalog.region.pk)
        assert placement.fits_now(catalog.mig1g, hosts)
        assert not placement.fits_now(catalog.quarter, hosts)
        assert placement.snapshot(catalog.region2.pk).hosts == []


class TestActions:
    def test_stop_releases_and_kicks_the_queue(self, catalog, tenant, no_tasks):
        catalog.host(gpus=1, mode=Mode.SHARED)
        instance = launch(catalog, tenant)
        outcomes.mark_running(instance.pk, instance.current_allocation().pk)
        no_tasks.clear()
        services.stop_instance(instance)
        assert no_tasks == [("stop", instance.pk)]
        assert Instance.objects.get(pk=instance.pk).state == State.STOPPING
        assert claims_of(instance)  # held until the agent let go
        assert outcomes.finish_stop(instance.pk)
        assert not outcomes.finish_stop(instance.pk)  # a redelivery changes nothing
        instance.refresh_from_db()
        assert instance.state == State.STOPPED
        assert claims_of(instance) == []
        assert ("schedule_pending",) in no_tasks

    def test_stop_a_queued_instance(self, catalog, tenant, no_tasks):
        catalog.cordoned()
        instance = launch(catalog, tenant)
        services.stop_instance(instance)
        assert Instance.objects.get(pk=instance.pk).state == State.STOPPED
        assert no_tasks == []

    def test_start_places_again_or_queues(self, catalog, tenant):
        instance = make_instance(catalog, tenant, state=State.STOPPED)
        services.start_instance(instance)
        assert Instance.objects.get(pk=instance.pk).state == State.PENDING
        other = make_instance(catalog, tenant, state=State.STOPPED)
        catalog.host(gpus=1, mode=Mode.SHARED)
        services.start_instance(other)
        assert Instance.objects.get(pk=other.pk).state == State.STARTING

    def test_start_checks_quota(self, catalog, tenant):
        catalog.cordoned()
        set_quota(tenant, gpu="0.25")
        launch(catalog, tenant)
        stopped = make_instance(catalog, tenant, state=State.STOPPED)
        with pytest.raises(services.QuotaExceeded):
            services.start_instance(stopped)
        assert Instance.objects.get(pk=stopped.pk).state == State.STOPPED

    @pytest.mark.parametrize("state", State.values)
    def test_actions_refused_in_the_wrong_state(self, catalog, tenant, state):
        from console.instances.lifecycle import ACTIONS

        set_quota(tenant)
        catalog.host(gpus=1, mode=Mode.SHARED, status=Host.Status.CORDONED)  # a half can run
        calls = {
            "stop": services.stop_instance,
            "start": services.start_instance,
            "reboot": services.reboot_instance,
            "terminate": services.terminate_instance,
            "resize": lambda i: services.resize_instance(
                i, catalog.half, allow_restart=True, allow_stop=True
            ),
        }
        for action, call in calls.items():
            instance = make_instance(catalog, tenant, state=state)
            if state in ACTIONS[action]:
                call(instance)
                assert Instance.objects.get(pk=instance.pk).state != state or action == "resize"
            else:
                with pytest.raises(services.InvalidState):
                    call(instance)
                assert Instance.objects.get(pk=instance.pk).state == state

    def test_terminate_releases_everything(self, catalog, tenant, no_tasks):
        catalog.host(gpus=1, mode=Mode.SHARED)
        instance = launch(catalog, tenant)
        services.terminate_instance(instance)
        assert no_tasks[-1] == ("terminate", instance.pk)
        assert outcomes.finish_terminate(instance.pk)
        instance.refresh_from_db()
        assert instance.state == State.TERMINATED
        assert instance.terminated_at is not None
        assert claims_of(instance) == []

    def test_fail_releases_the_slice(self, catalog, tenant):
        catalog.host(gpus=1, mode=Mode.SHARED)
        instance = launch(catalog, tenant)
        assert outcomes.fail_instance(instance.pk, Reason(Code.AGENT_UNAVAILABLE, "down"))
        instance.refresh_from_db()
        assert (instance.state, instance.state_reason) == (State.FAILED, "agent_unavailable: down")
        assert claims_of(instance) == []
        assert not outcomes.fail_instance(instance.pk, Reason(detail="again"))  # already failed


class TestResize:
    def running(self, catalog, tenant, spec=None):
        instance = launch(catalog, tenant, spec=spec)
        outcomes.mark_running(instance.pk, instance.current_allocation().pk)
        instance.refresh_from_db()
        return instance

    def test_in_place_when_the_gpu_has_room(self, catalog, tenant, no_tasks):
        catalog.host(gpus=1, mode=Mode.SHARED)
        instance = self.running(catalog, tenant)
        old = instance.current_allocation()
        services.resize_instance(instance, catalog.half, allow_restart=True)
        instance.refresh_from_db()
        assert instance.state == State.REBOOTING
        assert instance.spec == catalog.half
        new = instance.current_allocation()
        assert new.pk != old.pk and new.host == old.host
        assert new.request["shared"]["milli"] == 500
        assert claims_of(instance) == [(0, None, 500)]
        assert no_tasks[-1] == ("resize", instance.pk, old.pk)
        assert outcomes.mark_running(instance.pk, new.pk)

    def test_stop_then_wait_for_the_disk_host_when_the_gpu_is_full(self, catalog, tenant, no_tasks):
        set_quota(tenant)
        home = catalog.host("a", gpus=1, mode=Mode.SHARED)
        instance = self.running(catalog, tenant)
        fillers = [launch(catalog, tenant, spec=catalog.half), launch(catalog, tenant)]
        assert {f.state for f in fillers} == {State.PROVISIONING}  # 250 + 500 + 250 of 1000
        catalog.host("b", gpus=1, mode=Mode.SHARED)  # room, but not where its disk is
        services.resize_instance(instance, catalog.half, allow_stop=True)
        instance.refresh_from_db()
        assert instance.state == State.STOPPING and instance.resume_after_stop
        assert usage(tenant).gpu_used == Decimal("1.25")  # its new quota stays reserved
        assert no_tasks[-1] == ("stop", instance.pk)
        outcomes.finish_stop(instance.pk)
        instance.refresh_from_db()
        assert instance.state == State.PENDING
        assert instance.state_reason.startswith("Waiting for a, which holds its disk")
        assert not instance.resume_after_stop
        assert states(instance)[-3:] == ["stopping", "stopped", "pending"]
        services.terminate_instance(fillers[1])
        outcomes.finish_terminate(fillers[1].pk)
        assert queue.schedule_pending() == 1
        instance.refresh_from_db()
        assert instance.state == State.PROVISIONING
        assert instance.current_allocation().host == home == instance.disk_host

    def test_quota_first(self, catalog, tenant):
        set_quota(tenant, gpu="0.25")
        catalog.host(gpus=1, mode=Mode.SHARED)
        instance = self.running(catalog, tenant)
        with pytest.raises(services.QuotaExceeded):
            services.resize_instance(instance, catalog.half)
        instance.refresh_from_db()
        assert (instance.state, instance.spec) == (State.RUNNING, catalog.quarter)

    def test_a_stopped_instance_just_changes_spec(self, catalog, tenant):
        catalog.host(gpus=1, mode=Mode.MIG)
        instance = make_instance(catalog, tenant, state=State.STOPPED)
        services.resize_instance(instance, catalog.mig1g)
        instance.refresh_from_db()
        assert (instance.state, instance.spec) == (State.STOPPED, catalog.mig1g)
        assert "Resize from a100-quarter to a100-1g10gb" in instance.events.last().message


class TestResizeRules:
    """Only specs that can run where the instance is; a stop only when asked for; the disk
    as it is unless it grows; no transition that changes nothing."""

    def running(self, catalog, tenant, spec=None):
        instance = launch(catalog, tenant, spec=spec)
        outcomes.mark_running(instance.pk, instance.current_allocation().pk)
        instance.refresh_from_db()
        return instance

    def test_offers_only_specs_its_disk_host_can_hold_and_says_which_stop_it(self, catalog, tenant):
        from console.instances.forms import resize_options

        set_quota(tenant, gpu="1")
        catalog.host("home", gpus=2, mode=Mode.SHARED)
        catalog.host("whole", gpus=2, mode=Mode.WHOLE)  # its disk cannot move there
        instance = self.running(catalog, tenant)
        offered = {o.spec.code: o.needs_stop for o in resize_options(instance)}
        # no MIG host; whole GPUs only on another host; a 2x A100 exceeds the quota anyway
        assert offered == {"a100-half": False}
        launch(catalog, tenant, spec=catalog.half)
        launch(catalog, tenant)  # its GPU is full now; the other GPU of its host is free
        offered = {o.spec.code: o.needs_stop for o in resize_options(instance)}
        assert offered == {"a100-half": True}

    def test_a_spec_the_region_cannot_hold_is_a_field_error(self, catalog, tenant):
        instance = make_instance(catalog, tenant, state=State.STOPPED)
        catalog.host(gpus=1, mode=Mode.SHARED)
        with pytest.raises(ValidationError) as caught:
            services.resize_instance(instance, catalog.mig1g)
        assert caught.value.message_dict["spec"] == [
            "No host in Local 1 has NVIDIA A100 80GB GPUs in mig slice mode that could hold "
            "A100 MIG 1g.10gb."
        ]
        instance.refresh_from_db()
        assert (instance.state, instance.spec) == (State.STOPPED, catalog.quarter)

    def test_a_stopped_instance_is_offered_only_what_its_disk_host_holds(self, catalog, tenant):
        from console.instances.forms import resize_options

        home = catalog.host("home", gpus=1, mode=Mode.SHARED)
        catalog.host("other", gpus=1, mode=Mode.WHOLE)
        instance = make_instance(catalog, tenant, state=State.STOPPED, disk_host=home)
        assert [o.spec.code for o in resize_options(instance)] == ["a100-half"]
        with pytest.raises(ValidationError) as caught:
            services.resize_instance(instance, catalog.whole1)
        assert caught.value.message_dict["spec"][0].startswith("home, which holds its disk, has no")

    def test_a_stop_needs_consent(self, catalog, tenant, no_tasks):
        set_quota(tenant)
        catalog.host(gpus=2, mode=Mode.SHARED)
        instance = self.running(catalog, tenant)
        launch(catalog, tenant, spec=catalog.half)
        launch(catalog, tenant)  # its GPU is full; the host's other GPU is free
        sent = list(no_tasks)
        assert resizing.impacts(instance)(catalog.half) == resizing.STOP
        for allowed in ({}, {"allow_restart": True}):
            with pytest.raises(services.NeedsConsent) as caught:
                services.resize_instance(instance, catalog.half, **allowed)
            assert "the resize stops it" in caught.value.message_dict["allow_stop"][0]
        instance.refresh_from_db()
        assert (instance.state, instance.spec) == (State.RUNNING, catalog.quarter)
        assert no_tasks == sent
        services.resize_instance(instance, catalog.half, allow_stop=True)
        instance.refresh_from_db()
        assert (instance.state, instance.spec) == (State.STOPPING, catalog.half)

    def test_a_restart_needs_consent(self, catalog, tenant, no_tasks):
        catalog.host(gpus=1, mode=Mode.SHARED)
        instance = self.running(catalog, tenant)
        assert resizing.impacts(instance)(catalog.half) == resizing.RESTART
        for allowed in ({}, {"allow_stop": True}):
            with pytest.raises(services.NeedsConsent) as caught:
                services.resize_instance(instance, catalog.half, **allowed)
            assert "restarts it" in caught.value.message_dict["allow_restart"][0]
        assert Instance.objects.get(pk=instance.pk).state == State.RUNNING and not no_tasks[1:]
        services.resize_instance(instance, catalog.half, allow_restart=True)
        assert Instance.objects.get(pk=instance.pk).state == State.REBOOTING

    def test_cpu_and_memory_only_apply_live(
        self, catalog, tenant, no_tasks, django_capture_on_commit_callbacks
    ):
        from billing.models import UsageSegment

        set_quota(tenant)
        catalog.host(gpus=1, mode=Mode.SHARED, vcpus=16, ram_mib=65536)
        bigger = SpecFactory(
            code="a100-quarter-xl", name="A100 1/4 XL", mode=Mode.SHARED, milli=250,
            gpu_memory_mib=20480, gpu_model=catalog.a100, vcpus=12, ram_mib=49152, disk_gib=50,
            price_per_hour=Decimal("1.2000"),
        )  # fmt: skip
        with django_capture_on_commit_callbacks(execute=True):
            instance = self.running(catalog, tenant)
        old = instance.current_allocation()
        assert resizing.impacts(instance)(bigger) == resizing.LIVE
        assert resizing.impacts(instance)(bigger, True) == resizing.RESTART  # a bigger disk
        with django_capture_on_commit_callbacks(execute=True):
            services.resize_instance(instance, bigger)  # no consent needed: nothing restarts
        instance.refresh_from_db()
        assert (instance.state, instance.spec) == (State.RUNNING, bigger)
        allocation = instance.current_allocation()
        assert allocation.pk == old.pk and (allocation.vcpus, allocation.ram_mib) == (12, 49152)
        assert allocation.request["resources"]["memory_mib"] == 49152
        assert no_tasks[-1] == ("set_limits", instance.pk, old.pk, catalog.quarter.pk)
        assert instance.events.last().message.endswith("live: it kept running")
        at = instance.events.last().at  # the run goes on, billed at the new spec from then
        gpu = UsageSegment.objects.filter(instance=instance, kind="gpu")
        assert gpu.get(ended_at=at).spec_id == catalog.quarter.pk
        assert gpu.get(started_at=at, ended_at=None).spec_id == bigger.pk
        # no room for more vCPUs on its host: it would have to move
        huge = SpecFactory(
            code="a100-quarter-xxl", name="A100 1/4 XXL", mode=Mode.SHARED, milli=250,
            gpu_memory_mib=20480, gpu_model=catalog.a100, vcpus=32, ram_mib=4096, disk_gib=50,
            price_per_hour=Decimal("2.0000"),
        )  # fmt: skip
        assert resizing.impacts(instance)(huge) == resizing.STOP

    def test_a_refused_live_resize_goes_back(self, catalog, tenant, no_tasks):
        catalog.host(gpus=1, mode=Mode.SHARED)
        smaller = SpecFactory(
            code="a100-quarter-s", name="A100 1/4 S", mode=Mode.SHARED, milli=250,
            gpu_memory_mib=20480, gpu_model=catalog.a100, vcpus=2, ram_mib=1024, disk_gib=50,
            price_per_hour=Decimal("0.8000"),
        )  # fmt: skip
        instance = self.running(catalog, tenant)
        services.resize_instance(instance, smaller)
        allocation = instance.current_allocation()
        assert outcomes.undo_live_resize(
            instance.pk, allocation.pk, catalog.quarter.pk, "the engine refused"
        )
        instance.refresh_from_db()
        assert (instance.state, instance.spec) == (State.RUNNING, catalog.quarter)
        assert instance.current_allocation().request["resources"]["memory_mib"] == 16384
        assert "undone, it stays a100-quarter: the engine refused" in instance.events.last().message

    def test_the_disk_stays_whatever_the_specs_disk(self, catalog, tenant):
        from billing.models import UsageKind
        from billing.services import stopped_disk_cost_per_month
        from console.catalog.models import Spec

        set_quota(tenant)
        catalog.host(gpus=1, mode=Mode.SHARED)
        Spec.objects.filter(pk=catalog.half.pk).update(disk_gib=1000)
        instance = self.running(catalog, tenant)
        assert instance.disk_gib == 50
        services.resize_instance(instance, catalog.half, allow_restart=True)
        instance.refresh_from_db()
        assert (instance.spec, instance.disk_gib) == (catalog.half, 50)
        cost = stopped_disk_cost_per_month(instance)
        assert cost == stopped_disk_cost_per_month(Instance(spec=catalog.quarter, disk_gib=50))
        from billing.metering import open_segment

        segment = open_segment(instance, UsageKind.DISK, timezone.now())
        assert segment.disk_gib == 50  # billed for its own disk, not the spec's 1000 GiB

    def test_the_disk_grows_when_asked_and_never_shrinks(self, catalog, tenant):
        catalog.host(gpus=1, mode=Mode.SHARED)
        instance = make_instance(catalog, tenant, state=State.STOPPED, disk_gib=100)
        with pytest.raises(ValidationError) as caught:
            services.resize_instance(instance, catalog.half, disk_gib=60)
        assert caught.value.message_dict == {
            "disk_gib": ["A disk never shrinks: it is 100 GiB; give 100 or more."]
        }
        services.resize_instance(instance, catalog.half, disk_gib=200)
        instance.refresh_from_db()
        assert (instance.spec, instance.disk_gib) == (catalog.half, 200)
        assert instance.events.last().message == (
            "Resize from a100-quarter to a100-half, disk 100 → 200 GiB"
        )

    def test_a_stopped_resize_is_a_note_not_a_transition(self, catalog, tenant):
        catalog.host(gpus=1, mode=Mode.SHARED)
        instance = make_instance(catalog, tenant, state=State.STOPPED)
        services.resize_instance(instance, catalog.half)
        last = instance.events.last()
        assert last.kind == "note" and str(last).startswith(f"{instance.pk}: note (stopped)")
        kinds = [e.kind for e in instance.events.order_by("at", "pk")]
        assert kinds == ["created", "note"]


class TestScheduler:
    def test_priority_then_age_with_backfill(self, catalog, tenant, other_tenant):
        catalog.cordoned()
        set_quota(tenant)
        set_quota(other_tenant)
        launch(catalog, tenant, spec=catalog.half, name="old")
        big = launch(catalog, tenant, spec=catalog.whole1, name="big")
        young = launch(catalog, other_tenant, spec=catalog.half, name="young")
        vip = launch(catalog, other_tenant, spec=catalog.half, name="vip")
        Instance.objects.filter(pk=vip.pk).update(priority=5)
        catalog.host(gpus=1, mode=Mode.SHARED)  # room for two halves
        assert queue.schedule_pending() == 2
        placed = set(
            Instance.objects.filter(state=State.PROVISIONING).values_list("name", flat=True)
        )
        assert placed == {"vip", "old"}
        assert Instance.objects.get(pk=young.pk).state == State.PENDING
        assert Instance.objects.get(pk=big.pk).state == State.PENDING

    def test_a_queued_instance_is_placed_when_a_slice_is_free(self, catalog, tenant):
        set_quota(tenant)
        catalog.host(gpus=1, mode=Mode.WHOLE)
        first = launch(catalog, tenant, spec=catalog.whole1)
        waiting = launch(catalog, tenant, spec=catalog.whole1)
        assert queue.place_pending(waiting.pk) is queue.Placement.FULL
        assert Instance.objects.get(pk=waiting.pk).state_reason.startswith("Waiting for capacity")
        services.terminate_instance(first)
        outcomes.finish_terminate(first.pk)
        assert queue.place_pending(waiting.pk) is queue.Placement.PLACED
        assert queue.place_pending(waiting.pk) is None  # not pending any more

    def test_released_capacity_goes_to_the_queue(self, catalog, tenant):
        set_quota(tenant)
        catalog.host(gpus=1, mode=Mode.WHOLE)
        first = launch(catalog, tenant, spec=catalog.whole1)
        waiting = launch(catalog, tenant, spec=catalog.whole1)
        assert waiting.state == State.PENDING
        services.terminate_instance(first)
        outcomes.finish_terminate(first.pk)
        assert queue.schedule_pending() == 1
        assert Instance.objects.get(pk=waiting.pk).state == State.PROVISIONING


class TestFailover:
    def test_unreachable_longer_than_the_grace(self, catalog, tenant, settings):
        settings.HOST_FAILOVER_SECONDS = 60
        host = catalog.host(gpus=1, mode=Mode.SHARED)
        running = launch(catalog, tenant)
        outcomes.mark_running(running.pk, running.current_allocation().pk)
        stopping = launch(catalog, tenant)
        outcomes.mark_running(stopping.pk, stopping.current_allocation().pk)
        services.stop_instance(stopping)
        InstanceEvent.objects.update(at=F("at") - timedelta(minutes=5))  # it ran for a while
        now = timezone.now()
        heartbeat = now - timedelta(seconds=75)
        Host.objects.filter(pk=host.pk).update(
            status=Host.Status.UNREACHABLE,
            unreachable_since=now - timedelta(seconds=30),
            last_heartbeat_at=heartbeat,
        )
        assert recovery.fail_over_hosts(now) == 0  # not long enough yet
        Host.objects.filter(pk=host.pk).update(unreachable_since=now - timedelta(seconds=61))
        assert recovery.fail_over_hosts(now) == 2
        running.refresh_from_db()
        assert running.state == State.FAILED
        assert running.state_reason == (
            f"host_lost: host {host.name} lost at {heartbeat:%Y-%m-%d %H:%M} UTC; its disk stays "
            "there until the host returns (its disk cannot move; launch with "
            "on_host_loss=fresh_disk to come back elsewhere)"
        )
        event = running.events.last()
        assert event.at == heartbeat  # billing stops at the last heartbeat
        assert Instance.objects.get(pk=stopping.pk).state == State.STOPPED
        assert GpuClaim.objects.count() == 0
        assert recovery.fail_over_hosts(now) == 0  # idempotent

    def test_failed_never_before_the_last_event(self, catalog, tenant):
        host = catalog.host(gpus=1, mode=Mode.SHARED)
        running = launch(catalog, tenant)
        outcomes.mark_running(running.pk, running.current_allocation().pk)
        last = running.events.order_by("at").last().at
        Host.objects.filter(pk=host.pk).update(
            status=Host.Status.UNREACHABLE,
            unreachable_since=timezone.now() - timedelta(hours=1),
            last_heartbeat_at=last - timedelta(seconds=5),
        )
        recovery.fail_over_hosts()
        assert running.events.order_by("at", "pk").last().at == last


def test_reconcile_queues_again_what_a_lost_task_left_stuck(catalog, tenant, no_tasks):
    stuck = make_instance(catalog, tenant, state=State.PROVISIONING, name="stuck")
    fresh = make_instance(catalog, tenant, state=State.STOPPING, name="fresh")
    Instance.objects.filter(pk=stuck.pk).update(updated_at=timezone.now() - timedelta(minutes=10))
    assert recovery.requeue_stuck() == 1
    assert no_tasks == [("provision", stuck.pk)]
    assert Instance.objects.get(pk=fresh.pk).state == State.STOPPING
