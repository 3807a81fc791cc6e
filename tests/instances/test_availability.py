"""availability.classify: fits now, queues, no such hardware in the region, over the quota."""

from decimal import Decimal

import pytest
from django.core.exceptions import ValidationError

from accounts.models import Quota
from console.catalog.models import Mode
from console.fleet.models import Host
from console.instances import availability, services
from console.instances.availability import FITS_NOW, NO_HARDWARE, OVER_QUOTA, QUEUES
from tests.factories import SpecFactory


def status(catalog, tenant, spec, region=None):
    quota = Quota.objects.get(tenant=tenant)
    return availability.Checker(quota, region or catalog.region).of(spec)


def set_quota(tenant, gpu, instances=10):
    Quota.objects.filter(tenant=tenant).update(gpu_quota=Decimal(gpu), max_instances=instances)


def test_fits_now_when_a_slice_is_free(catalog, tenant):
    catalog.host(gpus=1, mode=Mode.SHARED)
    found = status(catalog, tenant, catalog.quarter)
    assert (found.status, found.launchable, found.label) == (FITS_NOW, True, "fits now")


def test_queues_when_the_hardware_is_there_but_busy(catalog, tenant):
    set_quota(tenant, "8")
    catalog.host(gpus=1, mode=Mode.SHARED)
    services.launch_instance(tenant, name="big", spec=catalog.half, image=catalog.image)
    services.launch_instance(tenant, name="big2", spec=catalog.half, image=catalog.image)
    found = status(catalog, tenant, catalog.quarter)  # the GPU is full
    assert (found.status, found.launchable) == (QUEUES, True)
    assert "has the hardware, but it is busy" in found.detail


def test_a_host_out_of_service_still_has_the_hardware(catalog, tenant):
    catalog.host(gpus=1, mode=Mode.SHARED, status=Host.Status.MAINTENANCE)
    assert status(catalog, tenant, catalog.quarter).status == QUEUES


@pytest.mark.parametrize(
    "host, spec",
    [
        ({"mode": Mode.MIG}, "quarter"),  # A100s, none in shared mode
        ({"mode": Mode.WHOLE, "gpus": 1}, "whole2"),  # whole A100s, never two on one host
        ({"mode": Mode.SHARED, "status": Host.Status.RETIRED}, "quarter"),  # gone for good
        (None, "quarter"),  # no host at all
    ],
)
def test_no_hardware_in_the_region(catalog, tenant, host, spec):
    if host is not None:
        catalog.host(**host)
    found = status(catalog, tenant, getattr(catalog, spec))
    assert (found.status, found.launchable) == (NO_HARDWARE, False)
    assert found.detail.startswith("No host in Local 1 has")
    assert found.label == "no hardware here"


def test_another_regions_hardware_does_not_count(catalog, tenant):
    catalog.host(gpus=1, mode=Mode.SHARED, region=catalog.region2)
    assert status(catalog, tenant, catalog.quarter).status == NO_HARDWARE
    assert status(catalog, tenant, catalog.quarter, catalog.region2).status == FITS_NOW


def test_over_quota_on_its_own_and_the_edge(catalog, tenant):
    catalog.host(gpus=1, mode=Mode.SHARED)
    set_quota(tenant, "0.25")
    edge = status(catalog, tenant, catalog.quarter)  # exactly the quota: fine
    assert edge.status == FITS_NOW
    over = status(catalog, tenant, catalog.half)
    assert (over.status, over.launchable, over.label) == (OVER_QUOTA, False, "over your quota")
    assert over.detail == "A100 1/2 needs 0.5 GPU; your quota is 0.25 GPU."
    set_quota(tenant, "2", instances=0)
    assert status(catalog, tenant, catalog.quarter).status == OVER_QUOTA


def test_what_others_use_of_the_quota_does_not_make_it_over(catalog, tenant):
    """ "Over your quota" is about the spec alone; what runs already is the launch's check."""
    catalog.host(gpus=1, mode=Mode.SHARED)
    set_quota(tenant, "0.5")
    services.launch_instance(tenant, name="one", spec=catalog.half, image=catalog.image)
    assert status(catalog, tenant, catalog.half).launchable


def test_no_hardware_is_said_before_quota(catalog, tenant):
    set_quota(tenant, "0.1")
    assert status(catalog, tenant, catalog.half).status == NO_HARDWARE


TIB = 1024 * 1024


@pytest.fixture
def eight(catalog):
    """An 8× spec that asks 1.5 TiB of RAM, and the hosts: host-b has the eight GPUs but 1 TiB;
    host-c has plenty of RAM but four GPUs."""
    spec = SpecFactory(
        code="a100-8x", name="A100 x8", gpu_model=catalog.a100, mode=Mode.WHOLE, milli=None,
        gpu_count=8, gpu_memory_mib=8 * 81920, vcpus=96, ram_mib=1536 * 1024,
        price_per_hour=Decimal("25.6000"),
    )  # fmt: skip
    catalog.host("host-b", gpus=8, mode=Mode.WHOLE, vcpus=128, ram_mib=TIB)
    catalog.host("host-c", gpus=4, mode=Mode.WHOLE, vcpus=64, ram_mib=2 * TIB)
    return spec


def test_the_gpus_are_there_but_the_ram_is_short(catalog, tenant, eight):
    set_quota(tenant, "8")
    found = status(catalog, tenant, eight)
    assert (found.status, found.launchable) == (NO_HARDWARE, False)
    assert found.detail == (
        "A100 x8 asks 1.5 TiB of RAM: host-b has the GPUs but only 1 TiB of RAM."
    )


def test_vcpus_and_ram_short_on_several_hosts(catalog, tenant, eight):
    set_quota(tenant, "8")
    catalog.host("host-d", gpus=8, mode=Mode.WHOLE, vcpus=32, ram_mib=2 * TIB)
    found = status(catalog, tenant, eight)
    assert found.detail == (
        "A100 x8 asks 96 vCPUs and 1.5 TiB of RAM: host-b has the GPUs but only 1 TiB of RAM; "
        "host-d has them but only 32 vCPUs."
    )


def test_short_of_ram_and_of_quota_says_both(catalog, tenant, eight):
    set_quota(tenant, "4")
    found = status(catalog, tenant, eight)
    assert found.status == NO_HARDWARE
    assert found.detail.endswith(
        "host-b has the GPUs but only 1 TiB of RAM. A100 x8 needs 8 GPU; your quota is 4 GPU."
    )
    # the launch refusal says the same
    with pytest.raises(ValidationError) as refused:
        services.launch_instance(tenant, name="big", spec=eight, image=catalog.image)
    assert refused.value.message_dict["spec"] == [f"A100 x8 cannot be launched: {found.detail}"]


def test_the_api_refusal_names_the_short_resource(catalog, tenant, eight, member, token_client):
    set_quota(tenant, "8")
    client = token_client(member)
    response = client.post(
        "/api/v1/instances/",
        {"name": "big", "spec": "a100-8x", "image": catalog.image.name},
        format="json",
    )
    assert response.status_code == 400
    assert "host-b has the GPUs but only 1 TiB of RAM" in str(response.json())
    shown = client.get("/api/v1/specs/", {"region": "local-1"}).json()["results"]
    availability_of = {spec["code"]: spec["availability"] for spec in shown}
    assert availability_of["a100-8x"]["status"] == NO_HARDWARE
    assert "only 1 TiB of RAM" in availability_of["a100-8x"]["detail"]


def test_explaining_costs_no_query_more(catalog, tenant, eight, django_assert_num_queries):
    checker = availability.Checker(Quota.objects.get(tenant=tenant), catalog.region)
    with django_assert_num_queries(0):
        assert "only 1 TiB of RAM" in checker.of(eight).detail
