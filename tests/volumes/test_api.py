"""REST API: /api/v1/volumes/ — create (its price shown first), quota, attach at launch and
while stopped, detach, delete, keeping an instance's disk at terminate, placement on the
volume's host, and who may do what."""

from decimal import Decimal

import pytest

from accounts.models import Quota
from console.catalog.models import Mode
from console.instances import services as instance_services
from console.instances.models import State
from console.volumes import services
from console.volumes.models import Volume
from tests.instances.helpers import make_instance

pytestmark = pytest.mark.usefixtures("no_tasks")
URL = "/api/v1/volumes/"


def launch_body(**overrides):
    return {"name": "trainer", "spec": "a100-quarter", "image": "pytorch-2.5-cuda12.4", **overrides}


def make(client, name="data", size_gib=10):
    response = client.post(URL, {"name": name, "size_gib": size_gib}, format="json")
    assert response.status_code == 201, response.content
    return response.json()


class TestCreate:
    def test_price_first_then_create(self, client, catalog):
        catalog.region.volume_price_per_gib_month = Decimal("0.125")
        catalog.region.save()
        price = client.get(f"{URL}price/", {"size_gib": 100}).json()
        assert price == {"region": "local-1", "size_gib": 100,
                         "price_per_gib_month": "0.125000", "price_per_month": "12.50"}  # fmt: skip
        volume = make(client, size_gib=100)
        assert (volume["state"], volume["host"], volume["instance"]) == ("available", None, None)
        assert (volume["price_per_gib_month"], volume["price_per_month"]) == ("0.125000", "12.50")
        assert client.get(URL).json()["results"][0]["name"] == "data"

    @pytest.mark.parametrize(
        "body, field",
        [
            ({"name": "../etc", "size_gib": 1}, "name"),
            ({"name": "a/b", "size_gib": 1}, "name"),
            ({"name": "Data", "size_gib": 1}, "name"),
            ({"name": "-x", "size_gib": 1}, "name"),
            ({"name": "ok", "size_gib": 0}, "size_gib"),
            ({"name": "ok", "size_gib": "many"}, "size_gib"),
            ({"name": "ok"}, "size_gib"),
        ],
    )
    def test_bad_fields(self, client, catalog, body, field):
        response = client.post(URL, body, format="json")
        assert response.status_code == 400
        assert field in response.json()["errors"]

    def test_the_name_is_taken_until_deleted(self, client, catalog):
        first = make(client)
        response = client.post(URL, {"name": "data", "size_gib": 1}, format="json")
        assert response.status_code == 400 and "name" in response.json()["errors"]
        assert client.delete(f"{URL}{first['id']}/").status_code == 204
        make(client)

    def test_quota(self, client, catalog, tenant):
        Quota.objects.filter(tenant=tenant).update(storage_quota_gib=50)
        make(client, "a", 30)
        response = client.post(URL, {"name": "b", "size_gib": 21}, format="json")
        assert response.status_code == 400
        assert response.json()["errors"]["size_gib"] == [
            "Your storage quota is 50 GiB and your volumes hold 30 GiB: at most 20 GiB more."
        ]
        make(client, "b", 20)

    def test_a_viewer_reads_but_cannot_create(self, viewer, token_client, client, catalog):
        make(client)
        as_viewer = token_client(viewer)
        assert as_viewer.get(URL).json()["count"] == 1
        assert as_viewer.post(URL, {"name": "x", "size_gib": 1}, format="json").status_code == 403
        vid = Volume.objects.get().pk
        assert as_viewer.delete(f"{URL}{vid}/").status_code == 403


class TestAttach:
    def test_at_launch_pins_the_host_and_goes_to_the_agent(self, client, catalog):
        catalog.host("gpu-1", gpus=1, mode=Mode.SHARED)
        second = catalog.host("gpu-2", gpus=1, mode=Mode.SHARED)
        volume = make(client)
        Volume.objects.filter(pk=volume["id"]).update(host=second)
        body = launch_body(volumes=[{"volume": "data", "mount_path": "/data"}])
        launched = client.post("/api/v1/instances/", body, format="json")
        assert launched.status_code == 202, launched.content
        shown = client.get(f"{URL}{volume['id']}/").json()
        assert (shown["state"], shown["instance"], shown["mount_path"]) == (
            "attached", launched.json()["id"], "/data",
        )  # fmt: skip
        allocation = Volume.objects.get().instance.current_allocation()
        assert allocation.host == second
        [sent] = allocation.request["volumes"]
        assert sent == {"name": Volume.objects.get().disk_name, "owner": f"volume-{volume['id']}",
                        "size_gib": 10, "mount_path": "/data"}  # fmt: skip

    def test_the_first_placement_puts_a_new_volume_on_its_host(self, client, catalog):
        host = catalog.host("gpu-1", gpus=1, mode=Mode.SHARED)
        make(client)
        body = launch_body(volumes=[{"volume": "data"}])
        assert client.post("/api/v1/instances/", body, format="json").status_code == 202
        volume = Volume.objects.get()
        assert (volume.host, volume.mount_path) == (host, "/mnt/data")

    @pytest.mark.parametrize(
        "mount_path",
        ["/workspace", "/workspace/x", "/proc", "/dev/pts", "/etc", "/", "data", "/data/",
         "/data/../etc", "/a//b", "/./x", "/x y", "/usr/lib"],
    )  # fmt: skip
    def test_bad_mount_paths_at_launch(self, client, catalog, mount_path):
        catalog.host(gpus=1, mode=Mode.SHARED)
        make(client)
        body = launch_body(volumes=[{"volume": "data", "mount_path": mount_path}])
        response = client.post("/api/v1/instances/", body, format="json")
        assert response.status_code == 400, response.content
        assert "volumes" in response.json()["errors"]
        assert not Volume.objects.get().instance_id  # the launch was rolled back

    def test_a_foreign_volume(self, client, catalog, other_tenant, make_member, token_client):
        catalog.host(gpus=1, mode=Mode.SHARED)
        theirs = make(token_client(make_member(other_tenant, username="eve")), "secret")
        body = launch_body(volumes=[{"volume": str(theirs["id"])}])
        response = client.post("/api/v1/instances/", body, format="json")
        assert response.status_code == 400 and "volumes" in response.json()["errors"]
        mine = make_instance(catalog, Volume.objects.get().tenant, state=State.STOPPED)
        url = f"{URL}{theirs['id']}/"
        assert client.get(url).status_code == 404
        assert client.post(f"{url}attach/", {"instance": mine.pk}, format="json").status_code == 404
        assert client.post(f"{url}detach/").status_code == 404
        assert client.delete(url).status_code == 404

    def test_only_while_stopped(self, client, catalog, tenant):
        volume = make(client)
        running = make_instance(catalog, tenant, state=State.RUNNING, name="busy")
        url = f"{URL}{volume['id']}/"
        refused = client.post(f"{url}attach/", {"instance": running.pk}, format="json")
        assert refused.status_code == 409
        stopped = make_instance(catalog, tenant, state=State.STOPPED, name="idle")
        attached = client.post(f"{url}attach/", {"instance": stopped.pk, "mount_path": "/data"},
                               format="json")  # fmt: skip
        assert attached.status_code == 200 and attached.json()["instance"] == stopped.pk
        assert client.delete(url).status_code == 409  # attached
        again = client.post(f"{url}attach/", {"instance": stopped.pk}, format="json")
        assert again.status_code == 400
        assert client.post(f"{url}detach/").status_code == 200
        assert client.post(f"{url}detach/").status_code == 409  # attached to nothing
        assert client.delete(url).status_code == 204
        assert client.delete(url).status_code == 404

    def test_volumes_on_two_hosts_never_meet(self, client, catalog, tenant):
        one, two = catalog.host("gpu-1"), catalog.host("gpu-2")
        first, second = make(client, "a"), make(client, "b")
        Volume.objects.filter(pk=first["id"]).update(host=one)
        Volume.objects.filter(pk=second["id"]).update(host=two)
        stopped = make_instance(catalog, tenant, state=State.STOPPED)
        ok = client.post(f"{URL}{first['id']}/attach/", {"instance": stopped.pk}, format="json")
        assert ok.status_code == 200
        refused = client.post(f"{URL}{second['id']}/attach/", {"instance": stopped.pk},
                              format="json")  # fmt: skip
        assert refused.status_code == 400 and "volume" in refused.json()["errors"]


class TestTerminate:
    def test_keep_disk_makes_a_volume_of_it(self, client, catalog, tenant):
        host = catalog.host()
        instance = make_instance(catalog, tenant, state=State.STOPPED, name="trainer",
                                 disk_host=host, disk_gib=40)  # fmt: skip
        volume = make(client)
        client.post(f"{URL}{volume['id']}/attach/", {"instance": instance.pk}, format="json")
        response = client.post(f"/api/v1/instances/{instance.pk}/terminate/",
                               {"keep_disk": True}, format="json")  # fmt: skip
        assert response.status_code == 202, response.content
        kept = Volume.objects.get(kept_from=instance)
        assert (kept.name, kept.size_gib, kept.host, kept.disk_name) == (
            "trainer-disk", 40, host, instance.disk_name,
        )  # fmt: skip
        assert Volume.objects.get(pk=volume["id"]).instance_id is None  # detached

    def test_a_disk_never_made_cannot_be_kept(self, client, catalog, tenant):
        instance = make_instance(catalog, tenant, state=State.STOPPED)
        response = client.post(f"/api/v1/instances/{instance.pk}/terminate/",
                               {"keep_disk": True}, format="json")  # fmt: skip
        assert response.status_code == 400 and "keep_disk" in response.json()["errors"]
        instance.refresh_from_db()
        assert instance.state == State.STOPPED

    def test_without_keep_disk_nothing_is_kept(self, client, catalog, tenant):
        instance = make_instance(catalog, tenant, state=State.STOPPED, disk_host=catalog.host())
        instance_services.terminate_instance(instance)
        assert not Volume.objects.exists()


def test_kept_names_do_not_collide(catalog, tenant):
    host = catalog.host()
    for _ in range(3):
        instance = make_instance(catalog, tenant, state=State.STOPPED, name="box", disk_host=host)
        instance_services.terminate_instance(instance, keep_disk=True)
    names = sorted(Volume.objects.values_list("name", flat=True))
    assert names == ["box-disk", "box-disk-2", "box-disk-3"]
    assert services.storage_used(tenant) == 30
