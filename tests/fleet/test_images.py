"""Hosts' images in the console (console/fleet/images.py): what agents report becomes
HostImage rows and the fleet page's pre-pull states; the catalog's pre-pull set and a
region's mirror are pushed to the agents that hold images when they join and when either
changes; the operator's clean-up; and what the agent API refuses."""

import pytest

from console.catalog.models import Image, Region
from console.fleet import images, services
from console.fleet.models import Host, HostImage
from tests.factories import ImageFactory, UserFactory
from tests.fleet.conftest import agent_client_for, make_inventory, post_json, with_digest

pytestmark = pytest.mark.django_db
REF = "registry.example:5000/team/pytorch:2.4"


def oci_inventory(
    hostname="host-x", held=(), pre_pull=(), mirror="", states=(), registries=(), checks=()
):
    inventory = make_inventory(hostname, 2)
    inventory.update(
        runtime="oci",
        images=[
            {
                "references": [ref],
                "id": f"sha256:{n:064x}",
                "size": 3_400_000_000,
                "layers": [f"sha256:{n:063x}a"],
            }
            for n, ref in enumerate(held, 1)
        ],  # fmt: skip
        image_settings={
            "pre_pull": list(pre_pull),
            "mirror": mirror,
            "registries": list(registries),
        },
        pre_pulls=list(states),
        registries=list(checks),
    )
    return with_digest(inventory)


@pytest.fixture
def queued(monkeypatch):
    """The tasks queued once committed: (name, args)."""
    found = []
    monkeypatch.setattr(images, "enqueue_on_commit", lambda name, *args: found.append((name, args)))
    return found


def heartbeat(host, inventory):
    return services.record_heartbeat(
        host, inventory_digest=inventory["digest"], inventory=inventory
    )


def test_the_images_a_host_reports_are_kept_by_reference_and_follow_its_inventory(register, queued):
    host, _ = register("host-x", 2)
    heartbeat(host, oci_inventory(held=["pytorch:2.4", REF]))
    assert set(HostImage.objects.filter(host=host).values_list("reference", flat=True)) == {
        "docker.io/library/pytorch:2.4",
        REF,
    }
    assert images.holders(host.region_id, "pytorch:2.4") == {host.pk}
    heartbeat(host, oci_inventory(held=[REF]))
    assert list(HostImage.objects.filter(host=host).values_list("reference", flat=True)) == [REF]


def test_an_oci_host_that_joins_is_handed_the_pre_pull_list_and_a_sim_host_is_not(
    region, a100, queued
):
    ImageFactory(name="torch", reference=REF, pre_pull=True)
    for hostname, inventory in (("oci-1", oci_inventory("oci-1")), ("sim-1", make_inventory())):
        _, raw = services.create_join_token(region)
        services.register_host(
            join_token=raw, hostname=hostname, address="http://127.0.0.1:9101",
            remote_addr="127.0.0.1",
            inventory=inventory,
        )  # fmt: skip
    oci = Host.objects.get(name="oci-1")
    assert queued == [("console.fleet.tasks.push_image_settings", (oci.pk,))]


def test_a_change_of_the_catalogs_pre_pull_set_or_of_a_regions_mirror_is_pushed(
    register, queued, django_capture_on_commit_callbacks
):
    host, _ = register("host-x", 2)
    heartbeat(host, oci_inventory())
    assert queued == []  # it applies what it should: nothing
    with django_capture_on_commit_callbacks(execute=True):
        image = ImageFactory(name="torch", reference=REF)
    # a new image's registry is one more to check
    assert queued == [("console.fleet.tasks.push_image_settings", (host.pk,))]
    heartbeat(host, oci_inventory(registries=["registry.example:5000"]))
    with django_capture_on_commit_callbacks(execute=True):
        image.pre_pull = True
        image.save()
    assert queued[1:] == [("console.fleet.tasks.push_image_settings", (host.pk,))]
    with django_capture_on_commit_callbacks(execute=True):
        image.save()  # the same change again, within the throttle: not pushed twice
    assert len(queued) == 2
    heartbeat(host, oci_inventory(pre_pull=[REF], registries=["registry.example:5000"]))
    with django_capture_on_commit_callbacks(execute=True):
        region = Region.objects.get(pk=host.region_id)
        region.registry_mirror = "127.0.0.1:5001"
        region.save()
    assert queued[-1] == ("console.fleet.tasks.push_image_settings", (host.pk,))


def test_the_push_hands_the_agent_its_settings_and_notes_what_it_applies(register, monkeypatch):
    host, _ = register("host-x", 2)
    heartbeat(host, oci_inventory())
    Region.objects.filter(pk=host.region_id).update(registry_mirror="127.0.0.1:5001")
    ImageFactory(name="torch", reference="pytorch:2.4", pre_pull=True)
    ImageFactory(name="old", reference="old:1", pre_pull=True, active=False)  # retired
    sent = []
    monkeypatch.setattr(
        images.agent_client, "put_image_settings", lambda host, body: sent.append(body) or body
    )
    assert images.push_settings(host.pk)
    wanted = {
        "pre_pull": ["docker.io/library/pytorch:2.4"],
        "mirror": "127.0.0.1:5001",
        "registries": ["docker.io"],
    }
    assert sent == [wanted]
    assert Host.objects.get(pk=host.pk).image_settings == wanted


def test_the_fleet_page_shows_each_pre_pulls_state_and_the_images_held(
    register, staff_client, queued
):
    host, _ = register("host-x", 2)
    states = [
        {"reference": "a:1", "state": "pulled", "detail": ""},
        {"reference": "b:1", "state": "pulling", "detail": "3 of 7 layers · 1.2 GB of 3.4 GB"},
        {"reference": "c:1", "state": "failed", "detail": "image_not_found: c:1"},
    ]
    heartbeat(host, oci_inventory(held=["a:1", REF], states=states))
    page = staff_client.get("/fleet/").content.decode()
    assert "Images: 2 held" in page
    assert ">pulled</span>" in page
    assert ">pulling</span> 3 of 7 layers · 1.2 GB of 3.4 GB" in page
    assert ">failed</span>: image_not_found: c:1" in page
    detail = staff_client.get(f"/fleet/hosts/{host.pk}/").content.decode()
    assert REF in detail and "Clean up images" in detail


def test_an_operator_queues_a_clean_up_and_others_cannot(register, staff_client, client, queued):
    host, _ = register("host-x", 2)
    url = f"/fleet/hosts/{host.pk}/images/clean-up/"
    response = staff_client.post(url)  # a simulated host holds no images
    assert response.status_code == 302 and queued == []
    heartbeat(host, oci_inventory())
    assert staff_client.post(url).status_code == 302
    assert queued == [("console.fleet.tasks.clean_up_images", (host.pk, "operator"))]
    client.force_login(UserFactory(username="tenant-user"))
    assert client.post(url).status_code == 404  # staff pages do not exist for others
    assert staff_client.get(url).status_code == 405
    assert len(queued) == 1


def test_the_clean_up_outcome_is_a_host_event(register, monkeypatch, queued):
    host, _ = register("host-x", 2)
    heartbeat(host, oci_inventory())
    outcome = {"removed": [REF], "kept": [{"references": ["a:1"], "why": "in use"}],
               "freed_bytes": 3_400_000_000}  # fmt: skip
    monkeypatch.setattr(images.agent_client, "clean_up_images", lambda host: outcome)
    assert images.clean_up(host.pk, "operator") == outcome
    assert host.events.first().message == (
        f"image clean-up by operator: removed {REF} (3.4 GB); kept 1 in use"
    )


def test_pre_pull_is_an_operators_field_in_the_admin(staff_client, client):
    image = ImageFactory(name="torch", reference=REF)
    assert (
        'name="pre_pull"'
        in staff_client.get(f"/admin/catalog/image/{image.pk}/change/").content.decode()
    )
    client.force_login(UserFactory(username="tenant-user"))
    assert client.get(f"/admin/catalog/image/{image.pk}/change/").status_code == 302
    assert not Image.objects.get(pk=image.pk).pre_pull


DISK = {"high_percent": 85, "low_percent": 80}
ROOM_MADE = {
    "at": 1796313600, "removed": [REF], "freed_bytes": 3_400_000_000,
    "percent_before": 91.2, "percent_after": 78.4,
}  # fmt: skip


def test_the_agents_clean_up_for_room_is_a_host_event_once(register):
    host, secret = register("host-x", 2)
    agent = agent_client_for(secret)
    disk = {**DISK, "last_clean_up": ROOM_MADE}
    for held in ([], [f"{REF}-other"]):  # a later inventory still reports the same clean-up
        inventory = oci_inventory(held=held)
        inventory = with_digest({**inventory, "image_disk": disk})
        answer = post_json(
            agent, "/agent/v1/heartbeat", {"host_id": host.pk, "inventory": inventory}
        )
        assert answer.status_code == 200, answer.content
    made = [e.message for e in host.events.all() if e.actor_label == "agent"]
    assert made == [
        "image clean-up by the agent at 2026-12-03 16:00:00 UTC: its disk was 91% full (at most "
        f"85%); removed 1 (3.4 GB); 78% full now: {REF}"
    ]


@pytest.mark.parametrize(
    ("field", "value", "where"),
    [
        ("images", [{"references": [REF], "id": "sha256:1", "size": -1}], "images[0].size"),
        ("images", [{"references": [], "id": "sha256:1", "size": 1}], "images[0].references"),
        ("images", "all of them", "images"),
        ("image_disk", {**DISK, "high_percent": 185}, "image_disk.high_percent"),
        ("image_disk", {**DISK, "last_clean_up": {**ROOM_MADE, "at": "now"}},
         "image_disk.last_clean_up.at"),
        ("image_disk", "full", "image_disk"),
    ],
)  # fmt: skip
def test_a_heartbeat_with_a_bad_image_report_is_refused_field_by_field(
    register, field, value, where
):
    host, secret = register("host-x", 2)
    inventory = {**oci_inventory(), field: value}
    response = post_json(
        agent_client_for(secret),
        "/agent/v1/heartbeat",
        {"host_id": host.pk, "inventory": inventory},
    )
    assert response.status_code == 400
    assert f"inventory.{where}" in response.json()["detail"]
    assert not host.events.filter(actor_label="agent").exists()


def test_an_agent_one_version_behind_gets_its_settings_without_registries(register, monkeypatch):
    host, _ = register("host-x", 2)
    older = oci_inventory()
    older["image_settings"] = {"pre_pull": [], "mirror": ""}  # it checks no registries
    heartbeat(host, with_digest({k: v for k, v in older.items() if k != "digest"}))
    ImageFactory(name="torch", reference="pytorch:2.4")
    assert not images.push_when_due(Host.objects.get(pk=host.pk))  # nothing it can apply
    sent = []
    monkeypatch.setattr(
        images.agent_client, "put_image_settings", lambda host, body: sent.append(body) or body
    )
    images.push_settings(host.pk)
    assert sent == [{"pre_pull": [], "mirror": ""}]
