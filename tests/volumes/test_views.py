"""The console's Volumes page: the list, the create form with each region's price, attach,
detach and delete after a confirmation page; a viewer sees them and changes nothing; the
terminate page offers to keep the disk."""

from decimal import Decimal

import pytest

from console.instances.models import State
from console.volumes import services
from console.volumes.models import Volume
from tests.clients import signed_in
from tests.instances.helpers import make_instance

pytestmark = pytest.mark.usefixtures("no_tasks")


def test_the_form_shows_the_price_and_creates(web, catalog, tenant):
    catalog.region.volume_price_per_gib_month = Decimal("0.08")
    catalog.region.save()
    page = web.get("/volumes/").content.decode()
    assert "0.08" in page and 'data-testid="create-volume"' in page
    response = web.post("/volumes/create/", {"name": "data", "size_gib": "25", "region": "local-1"})
    assert response.status_code == 302
    volume = Volume.objects.get()
    assert (volume.size_gib, volume.price_per_gib_month) == (25, Decimal("0.08"))
    assert "2.00" in web.get("/volumes/").content.decode()  # 25 GiB × 0.08 a month


def test_a_refused_create_says_why(web, catalog):
    response = web.post(
        "/volumes/create/", {"name": "a/b", "size_gib": "1", "region": "local-1"}, follow=True
    )
    assert "lowercase letters" in response.content.decode()
    assert not Volume.objects.exists()


def test_attach_detach_and_delete_ask_first(web, catalog, tenant):
    volume = services.create_volume(tenant, name="data", size_gib=5, region=catalog.region)
    stopped = make_instance(catalog, tenant, state=State.STOPPED, name="idle")
    web.post(f"/volumes/{volume.pk}/attach/", {"instance": stopped.pk, "mount_path": "/data"})
    assert Volume.objects.get().instance == stopped
    question = web.get(f"/volumes/{volume.pk}/detach/").content.decode()
    assert "Detach data from idle?" in question
    assert Volume.objects.get().instance == stopped  # asking changed nothing
    web.post(f"/volumes/{volume.pk}/detach/")
    assert Volume.objects.get().instance is None
    assert "deleted for good" in web.get(f"/volumes/{volume.pk}/delete/").content.decode()
    web.post(f"/volumes/{volume.pk}/delete/")
    assert Volume.objects.get().deleted_at is not None
    assert web.get(f"/volumes/{volume.pk}/delete/").status_code == 404


def test_a_viewer_changes_nothing(viewer, catalog, tenant):
    volume = services.create_volume(tenant, name="data", size_gib=5, region=catalog.region)
    web = signed_in(viewer)
    assert "data" in web.get("/volumes/").content.decode()
    web.post(f"/volumes/{volume.pk}/delete/")
    web.post("/volumes/create/", {"name": "other", "size_gib": "1", "region": "local-1"})
    assert list(Volume.objects.values_list("name", "deleted_at")) == [("data", None)]


def test_another_tenants_volume_is_not_found(web, catalog, other_tenant):
    theirs = services.create_volume(other_tenant, name="x", size_gib=1, region=catalog.region)
    assert web.get(f"/volumes/{theirs.pk}/delete/").status_code == 404
    assert web.post(f"/volumes/{theirs.pk}/delete/").status_code == 404
    assert Volume.objects.get().deleted_at is None


def test_the_terminate_page_offers_to_keep_the_disk(web, catalog, tenant):
    instance = make_instance(catalog, tenant, state=State.STOPPED, disk_host=catalog.host())
    assert 'name="keep_disk"' in web.get(f"/instances/{instance.pk}/terminate/").content.decode()
    web.post(f"/instances/{instance.pk}/terminate/", {"keep_disk": "1"})
    assert Volume.objects.get().kept_from == instance
