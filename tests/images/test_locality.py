"""Placement by image locality, in the database: a launch goes to a host that holds its image
when that costs no more fragmentation than IMAGE_LOCALITY_TOLERANCE, and its events say when
the chosen host has to pull it, and why that host."""

import pytest

from console.fleet import images
from console.fleet.images import normalize
from console.fleet.models import Host, HostImage
from console.instances import outcomes, services
from console.instances.pulls import pull_note

pytestmark = pytest.mark.django_db
OCI = {"pre_pull": [], "mirror": ""}  # what an oci agent's inventory reports


def oci_host(catalog, name):
    host = catalog.host(name, gpus=1)
    Host.objects.filter(pk=host.pk).update(image_settings=OCI)
    return host


def hold(host, reference):
    HostImage.objects.create(host=host, reference=normalize(reference), image_id="sha256:1")


def launch(catalog, tenant, name):
    instance = services.launch_instance(
        tenant, name=name, spec=catalog.quarter, image=catalog.image
    )
    return instance, instance.current_allocation().host.name


def pulls(instance) -> list[str]:
    return [e.message for e in instance.events.all() if e.message.lower().startswith("pull")]


def test_the_launch_goes_to_the_host_that_holds_its_image_and_says_nothing_of_a_pull(
    catalog, tenant
):
    oci_host(catalog, "first")
    hold(oci_host(catalog, "second"), catalog.image.reference)
    instance, host = launch(catalog, tenant, "box")
    assert host == "second"
    assert pulls(instance) == []


def test_with_no_host_holding_it_the_choice_stands_and_the_events_say_it_pulls(catalog, tenant):
    oci_host(catalog, "first")
    oci_host(catalog, "second")
    instance, host = launch(catalog, tenant, "box")
    assert host == "first"  # the policy's own choice
    assert pulls(instance) == [
        f"Pulling {catalog.image.reference} on first (not on any host that fits)"
    ]


@pytest.mark.parametrize(("tolerance", "chosen"), [(0.0, "packed"), (1000.0, "holder")])
def test_a_holder_is_chosen_only_within_the_tolerance(catalog, tenant, settings, tolerance, chosen):
    settings.IMAGE_LOCALITY_TOLERANCE = tolerance
    oci_host(catalog, "packed")
    holder = oci_host(catalog, "holder")
    launch(catalog, tenant, "one")  # on "packed": a quarter of its GPU taken
    hold(holder, catalog.image.reference)
    instance, host = launch(catalog, tenant, "two")
    assert host == chosen  # a quarter beside the first packs tighter than on a fresh GPU
    if chosen == "packed":
        assert pulls(instance) == [
            f"Pulling {catalog.image.reference} on packed: the hosts that hold it (holder) "
            "would leave more GPU capacity unusable"
        ]
    else:
        assert pulls(instance) == []


def test_a_host_without_images_says_nothing_of_pulls(catalog, tenant):
    catalog.host("simulated", gpus=1)  # its runtime (sim) reports no images
    instance, _ = launch(catalog, tenant, "box")
    assert pulls(instance) == []


def test_an_instance_pinned_to_the_host_of_its_disk_says_it_pulls_there(catalog, tenant):
    disk = oci_host(catalog, "disk")
    instance, _ = launch(catalog, tenant, "box")
    hold(oci_host(catalog, "other"), catalog.image.reference)
    holding = images.holders(instance.region_id, catalog.image.reference)
    note = pull_note(instance, instance.current_allocation(), disk.pk, holding)
    assert note == f"Pulling {catalog.image.reference} on disk, which holds its disk"


def test_a_host_that_runs_the_image_holds_it_for_the_next_launch_before_its_heartbeat(
    catalog, tenant
):
    """The first launch pulls; once it runs, the next launch of the image is not told of a
    pull, whether or not the host's heartbeat has reported the image yet."""
    oci_host(catalog, "only")
    first, _ = launch(catalog, tenant, "cold")
    assert pulls(first) == [
        f"Pulling {catalog.image.reference} on only (not on any host that fits)"
    ]
    allocation = first.current_allocation()
    assert outcomes.mark_running(first.pk, allocation.pk)
    assert images.holders(first.region_id, catalog.image.reference) == {allocation.host_id}
    second, _ = launch(catalog, tenant, "warm")
    assert pulls(second) == []


def test_a_workload_running_on_a_host_without_images_records_none(catalog, tenant):
    catalog.host("simulated", gpus=1)
    instance, _ = launch(catalog, tenant, "box")
    assert outcomes.mark_running(instance.pk, instance.current_allocation().pk)
    assert not HostImage.objects.exists()
