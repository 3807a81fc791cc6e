"""The console's Snapshots page and the instance page's Shelve button."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from console.instances.models import State
from console.snapshots.models import Restore, Shelf, Snapshot, StoreMeasurement
from console.volumes.models import Volume
from tests.clients import signed_in
from tests.instances.helpers import make_instance

pytestmark = pytest.mark.usefixtures("no_tasks")


@pytest.fixture
def stopped(catalog, tenant):
    host = catalog.host(gpus=1)
    return make_instance(catalog, tenant, state=State.STOPPED, name="keeper", disk_host=host)


def test_a_member_takes_a_snapshot_and_sees_its_progress(member, stopped):
    web = signed_in(member)
    answer = web.post("/snapshots/take/", {"source": f"instance:{stopped.pk}"})
    assert answer.status_code == 302
    snapshot = Snapshot.objects.get()
    Snapshot.objects.filter(pk=snapshot.pk).update(bytes_done=512, bytes_total=1024)
    page = web.get("/snapshots/").content.decode()
    assert 'data-testid="snapshot-list"' in page and "keeper" in page
    assert 'value="50"' in page and "50%" in page
    assert '<meta http-equiv="refresh"' in page  # it follows a running snapshot
    Snapshot.objects.filter(pk=snapshot.pk).update(state="done", finished_at=timezone.now())
    assert '<meta http-equiv="refresh"' not in web.get("/snapshots/").content.decode()
    assert web.post(f"/snapshots/{snapshot.pk}/delete/").status_code == 302
    assert Snapshot.objects.get(pk=snapshot.pk).deleted_at is not None


def test_shelve_from_the_instance_page(member, stopped):
    web = signed_in(member)
    page = web.get(f"/instances/{stopped.pk}/").content.decode()
    assert 'data-testid="shelve-instance"' in page
    assert web.post(f"/snapshots/shelve/{stopped.pk}/").status_code == 302
    assert Shelf.objects.get(instance=stopped).state == "shelving"
    page = web.get(f"/instances/{stopped.pk}/").content.decode()
    assert "is shelving" in page and 'data-testid="shelve-instance"' not in page


def test_a_viewer_sees_but_cannot_act(viewer, stopped):
    web = signed_in(viewer)
    page = web.get("/snapshots/").content.decode()
    assert 'data-testid="take-snapshot"' not in page
    web.post("/snapshots/take/", {"source": f"instance:{stopped.pk}"})
    web.post(f"/snapshots/shelve/{stopped.pk}/")
    assert not Snapshot.objects.exists() and not Shelf.objects.exists()


def test_another_tenants_things_are_not_found(member, catalog, other_tenant):
    host = catalog.host(gpus=1)
    theirs = make_instance(catalog, other_tenant, state=State.STOPPED, disk_host=host)
    web = signed_in(member)
    assert web.post("/snapshots/take/", {"source": f"instance:{theirs.pk}"}).status_code == 404
    assert web.post(f"/snapshots/shelve/{theirs.pk}/").status_code == 404
    snapshot = Snapshot.objects.create(
        tenant=other_tenant, region=theirs.region, instance=theirs, source_name="theirs",
        disk_name=theirs.disk_name, size_gib=10, state="done",
    )  # fmt: skip
    assert web.post(f"/snapshots/{snapshot.pk}/delete/").status_code == 404
    assert "theirs" not in web.get("/snapshots/").content.decode()


def test_the_usage_page_shows_the_store_and_the_snapshots_page_each_share(member, stopped):
    snapshot = Snapshot.objects.create(
        tenant=stopped.tenant, region=stopped.region, instance=stopped, source_name="keeper",
        disk_name=stopped.disk_name, size_gib=10, state="done",
        bytes_unique=512 * 1024**2, bytes_shared=1024**3,
        finished_at=timezone.now() - timedelta(hours=1), price_per_gib_month=Decimal("0.05"),
    )  # fmt: skip
    StoreMeasurement.objects.create(
        tenant=stopped.tenant, measured_at=snapshot.finished_at, bytes=2 * 1024**3,
        price_per_gib_month=Decimal("0.05"),
    )  # fmt: skip
    web = signed_in(member)
    page = web.get("/billing/usage/").content.decode()
    assert 'data-testid="snapshot-storage"' in page
    assert "Snapshot store: 2.000 GiB held at 0.05 per GiB-month" in page
    listed = web.get("/snapshots/").content.decode()
    assert f'data-testid="share-{snapshot.pk}">512.0\xa0MB · 1.0\xa0GB<' in listed


def test_a_volume_is_snapshotted_from_the_volumes_page_and_restored(member, stopped, catalog):
    volume = Volume.objects.create(
        tenant=stopped.tenant, name="data", size_gib=3, region=catalog.region,
        host=stopped.disk_host,
    )  # fmt: skip
    web = signed_in(member)
    assert f'data-testid="snapshot-volume-{volume.pk}"' in web.get("/volumes/").content.decode()
    assert web.post("/snapshots/take/", {"source": f"volume:{volume.pk}"}).status_code == 302
    snapshot = Snapshot.objects.get(volume=volume)
    Snapshot.objects.filter(pk=snapshot.pk).update(
        state="done", finished_at=timezone.now(), restic_id="ab" * 32
    )
    page = web.get("/snapshots/").content.decode()
    assert f'data-testid="restore-{snapshot.pk}"' in page and "volume:" in page
    form = {"name": "copy", "size_gib": "3", "host": stopped.disk_host.name}
    assert web.post(f"/snapshots/{snapshot.pk}/restore/", form).status_code == 302
    restore = Restore.objects.get(snapshot=snapshot)
    assert (restore.volume.name, restore.host_id) == ("copy", stopped.disk_host_id)
    page = web.get("/snapshots/").content.decode()
    assert 'data-testid="restore-list"' in page and '<meta http-equiv="refresh"' in page
    bad = web.post(f"/snapshots/{snapshot.pk}/restore/", {"name": "copy"}, follow=True)
    assert "You already have a volume named copy" in bad.content.decode()
    schedule = {"source": f"volume:{volume.pk}", "every_hours": "6", "keep": "2"}
    assert web.post("/snapshots/schedules/", schedule).status_code == 302
    assert "volume data: every 6 h" in web.get("/snapshots/").content.decode()


def test_volume_forms_refuse_viewers_and_strangers(tenant, member, viewer, catalog, other_tenant):
    theirs = Volume.objects.create(tenant=other_tenant, name="theirs", size_gib=1,
                                   region=catalog.region, host=catalog.host(gpus=1))  # fmt: skip
    web = signed_in(member)
    assert web.post("/snapshots/take/", {"source": f"volume:{theirs.pk}"}).status_code == 404
    assert web.post("/snapshots/take/", {"source": "volume:x"}).status_code == 404
    assert web.post("/snapshots/take/", {"source": "disk:1"}).status_code == 404
    mine = Volume.objects.create(tenant=tenant, name="mine", size_gib=1, region=catalog.region,
                                 host=theirs.host)  # fmt: skip
    signed_in(viewer).post("/snapshots/take/", {"source": f"volume:{mine.pk}"})
    assert not Snapshot.objects.exists()
