"""Where an image can come from in a region (console/fleet/image_availability.py): held by
hosts (with its size), through the region's mirror, from its own registry, behind a registry
no host reaches (the agents' checks), or not built; hosts without images run anything; a
tenant's own reference is classified as a catalog image's."""

import pytest

from console.fleet import image_availability as availability
from console.fleet.models import Host, HostImage
from tests.factories import RegionFactory

ORIGIN = "registry.example:5000"
REF = f"{ORIGIN}/team/pytorch:2.4"
MIRROR = "127.0.0.1:5001"
SETTINGS = {"pre_pull": [], "mirror": "", "registries": []}
REFUSED = "https: [Errno 111] Connection refused; http: [Errno 111] Connection refused"


def check(registry, reachable=True, error=""):
    return {"registry": registry, "reachable": reachable, "error": error, "checked_at": 1.0}


@pytest.fixture
def region(db):
    return RegionFactory(code="local-1", name="Local 1")


@pytest.fixture
def host(region):
    def make(name, *, checks=(), held=(), settings=SETTINGS, status=Host.Status.ACTIVE):
        made = Host.objects.create(
            name=name, region=region, address=f"http://{name}:9", image_settings=settings,
            registry_checks=list(checks), status=status,
        )  # fmt: skip
        for reference, size in held:
            HostImage.objects.create(host=made, reference=reference, image_id="sha256:1",
                                     size_bytes=size)  # fmt: skip
        return made

    return make


def test_an_image_held_by_hosts_names_them_with_its_size(region, host):
    host("host-a", held=[(REF, 3_400_000_000)])
    host("host-b", held=[(REF, 3_400_000_000)])
    host("host-c")
    found = availability.classify(region, REF)
    assert (found.status, found.launchable, found.size_bytes) == ("held", True, 3_400_000_000)
    assert found.hosts == ("host-a", "host-b")
    assert found.detail == "Held by 2 hosts of Local 1 (3.4 GB): host-a, host-b."
    assert found.size == "3.4 GB"


def test_a_reference_is_compared_as_engines_store_it(region, host):
    host("host-a", held=[("docker.io/library/ubuntu:latest", 80_000_000)])
    assert availability.classify(region, "ubuntu").status == "held"


def test_an_image_no_host_holds_is_pulled_from_its_registry_where_a_host_reaches_it(region, host):
    host("host-a", checks=[check(ORIGIN, False, REFUSED)])
    host("host-b", checks=[check(ORIGIN)])
    found = availability.classify(region, REF)
    assert (found.status, found.launchable, found.size_bytes, found.hosts) == (
        "registry", True, None, ()
    )  # fmt: skip
    assert found.detail == f"Pulled from {ORIGIN} (reached by host-b); no host holds it yet."


def test_a_registry_no_host_reaches_is_unreachable_with_the_error(region, host):
    host("host-a", checks=[check(ORIGIN, False, REFUSED)])
    found = availability.classify(region, REF)
    assert (found.status, found.launchable) == ("unreachable", False)
    assert found.detail.startswith(f"No host of Local 1 can reach {ORIGIN} ({REFUSED}): ")
    assert "mirror" in found.detail  # what the operator can do


def test_a_registry_not_checked_yet_is_pullable_the_pull_will_tell(region, host):
    """A tenant's own registry, or an image added since the hosts last checked."""
    host("host-a", checks=[check(ORIGIN, False, REFUSED)])
    found = availability.classify(region, "quay.io/someone/own-image:1")
    assert (found.status, found.launchable) == ("registry", True)
    assert "no host of Local 1 has checked yet" in found.detail


def test_the_regions_mirror_serves_what_no_host_holds(region, host):
    region.registry_mirror = MIRROR
    region.save()
    host("host-a", checks=[check(MIRROR), check(ORIGIN, False, REFUSED)])
    found = availability.classify(region, REF)
    assert (found.status, found.launchable) == ("mirror", True)
    assert (
        found.detail == f"Pulled through Local 1's registry mirror {MIRROR}; no host holds it yet."
    )
    # the mirror serves neither an image named by digest nor its own
    by_digest = f"{ORIGIN}/team/pytorch@sha256:{'a' * 64}"
    assert availability.classify(region, by_digest).status == "unreachable"
    assert availability.classify(region, f"{MIRROR}/team/x:1").status == "registry"


def test_a_mirror_no_host_reaches_falls_back_to_the_registry_and_both_are_named(region, host):
    region.registry_mirror = MIRROR
    region.save()
    host("host-a", checks=[check(MIRROR, False, "timed out"), check(ORIGIN)])
    assert availability.classify(region, REF).status == "registry"
    Host.objects.update(registry_checks=[check(MIRROR, False, "timed out"),
                                         check(ORIGIN, False, REFUSED)])  # fmt: skip
    found = availability.classify(region, REF)
    assert found.status == "unreachable"
    assert f"nor the registry mirror {MIRROR} (timed out)" in found.detail


def test_a_local_image_no_host_holds_is_not_built(region, host):
    host("host-a")
    found = availability.classify(region, "localhost/gpucloud/jupyter:latest")
    assert (found.status, found.launchable) == ("not_built", False)
    assert "make images" in found.detail
    HostImage.objects.create(host=Host.objects.get(), reference="localhost/gpucloud/jupyter:latest",
                             image_id="sha256:2", size_bytes=2_100_000_000)  # fmt: skip
    assert availability.classify(region, "localhost/gpucloud/jupyter:latest").status == "held"


def test_hosts_without_images_run_any_reference(region, host):
    host("sim-1", settings={})
    for reference in (REF, "localhost/gpucloud/jupyter:latest", "quay.io/x/y:1"):
        found = availability.classify(region, reference)
        assert (found.status, found.launchable, found.hosts) == ("held", True, ("sim-1",))
        assert "without images" in found.detail


def test_retired_and_unreachable_hosts_say_nothing(region, host):
    host("gone", held=[(REF, 1)], status=Host.Status.RETIRED)
    host("silent", checks=[check(ORIGIN)], status=Host.Status.UNREACHABLE)
    host("host-a", checks=[check(ORIGIN, False, REFUSED)])
    assert availability.classify(region, REF).status == "unreachable"


def test_a_region_with_no_host_cannot_check_anything_yet(region):
    assert availability.classify(region, REF).status == "registry"
    assert availability.classify(region, "localhost/x:1").status == "not_built"


def test_a_fleet_reads_the_region_once_for_many_references(region, host, django_assert_num_queries):
    host("host-a", held=[(REF, 1)], checks=[check("docker.io")])
    with django_assert_num_queries(2):
        fleet = availability.Fleet(region)
        assert [fleet.of(ref).status for ref in (REF, "ubuntu", "localhost/x:1")] == [
            "held", "registry", "not_built"
        ]  # fmt: skip
