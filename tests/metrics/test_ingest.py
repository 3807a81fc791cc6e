"""Attribution of samples to instances and tenants, the live window, the groups published to."""

import time

import pytest

from agent.samples import make_sample
from console.metrics import ingest, live
from tests.metrics.conftest import alloc_sample, gpu_sample

pytestmark = pytest.mark.usefixtures("window_backend")


def test_allocation_samples_are_attributed_to_their_instance_and_tenant(world):
    now = time.time()
    result = ingest.ingest_samples(
        world.host,
        [gpu_sample(now, 0), alloc_sample(now, "alloc-train"), alloc_sample(now, "alloc-infer")],
    )
    assert result.points == 3 and result.unattributed == 0
    assert sorted(result.groups) == sorted(
        [
            f"metrics.instance.{world.train.pk}",
            f"metrics.instance.{world.infer.pk}",
            f"metrics.tenant.{world.tenant.pk}",
            f"metrics.tenant.{world.other_tenant.pk}",
            f"metrics.host.{world.host.pk}",
        ]
    )
    latest = live.store().latest()
    train = latest[f"instance:{world.train.pk}"]
    assert (train["tenant"], train["instance"], train["mode"]) == ("acme", world.train.pk, "shared")
    assert latest[f"instance:{world.infer.pk}"]["tenant"] == "globex"
    # a time-shared GPU belongs to nobody in particular
    assert "tenant" not in latest[f"gpu:{world.host.pk}:0"]
    window = live.store().window(f"instance:{world.train.pk}")
    assert [row[0] for row in window] == [now]


def test_the_mapping_is_cached_not_queried_per_sample(world, django_assert_num_queries):
    now = time.time()
    batch = [alloc_sample(now + n, "alloc-train") for n in range(50)]
    gpus = ingest.inventory(world.host)  # the samples endpoint reads it with the GPUs' health
    with django_assert_num_queries(1):
        ingest.ingest_samples(world.host, batch, gpus)
    with django_assert_num_queries(0):
        for n in range(5):
            ingest.ingest_samples(world.host, [alloc_sample(now + 100 + n, "alloc-train")], gpus)


def test_unknown_allocations_are_asked_again_only_now_and_then(world, django_assert_num_queries):
    now = time.time()
    gpus = ingest.inventory(world.host)
    with django_assert_num_queries(1):
        for n in range(20):
            batch = [alloc_sample(now + n, "alloc-nobody")]
            result = ingest.ingest_samples(world.host, batch, gpus)
            assert result.unattributed == 1 and result.groups == []


def test_another_hosts_allocation_is_nobodys(world):
    # host-b's agent reporting host-a's allocation: not shown to its tenant
    batch = [alloc_sample(time.time(), "alloc-train", host="host-b")]
    result = ingest.ingest_samples(world.host_b, batch)
    assert result.unattributed == 1
    assert f"instance:{world.train.pk}" not in live.store().latest()


def test_whole_gpus_are_attributed_to_their_instance(world):
    now = time.time()
    ingest.ingest_samples(
        world.host_b,
        [
            gpu_sample(now, 0, host="host-b"),
            gpu_sample(now, 1, host="host-b"),
            alloc_sample(now, "alloc-big", host="host-b"),
        ],
    )
    latest = live.store().latest()
    for index in (0, 1):
        gpu = latest[f"gpu:{world.host_b.pk}:{index}"]
        assert (gpu["tenant"], gpu["instance"]) == ("acme", world.big.pk)


def test_a_mig_slice_gets_its_gpus_temperature_and_its_share_of_power(world):
    from console.fleet.models import Gpu
    from console.instances.models import Allocation

    Gpu.objects.filter(host=world.host, index=0).update(
        mig_devices=[{"uuid": "MIG-x", "profile": "3g.40gb", "start": 4, "size": 4}]
    )
    Allocation.objects.filter(pk="alloc-train").update(
        mode="mig",
        request={"mode": "mig", "gpus": [0], "mig": {"profile": "3g.40gb", "start": 4, "size": 4}},
    )
    now = time.time()
    mig = make_sample(now, "mig", 0, "GPU-host-a-0", mig_uuid="MIG-x", gpu_util=70.0,
                      mem_used_mib=100, mem_total_mib=40192)  # fmt: skip
    ingest.ingest_samples(
        world.host,
        [gpu_sample(now, 0, temperature_c=71.0, power_w=300.0), mig,
         {**mig, "kind": "allocation", "allocation": "alloc-train"}],
    )  # fmt: skip
    row = live.as_dict(live.store().window(f"instance:{world.train.pk}")[0])
    assert (row["gpu_util"], row["temperature_c"], row["power_w"]) == (70.0, 71.0, 150.0)
    latest = live.store().latest()
    assert latest[f"mig:{world.host.pk}:0:MIG-x"]["tenant"] == "acme"
