"""Console pages: list, launch form, detail, actions, terminate confirmation."""

from decimal import Decimal

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from accounts.models import Quota
from accounts.roles import Role
from console.catalog.models import Mode
from console.instances import outcomes, services
from console.instances.models import Instance, State
from tests.instances.helpers import make_instance

pytestmark = pytest.mark.usefixtures("no_tasks")


@pytest.fixture
def browser_of():
    def login(membership):
        client = Client()
        client.force_login(membership.user)
        return client

    return login


@pytest.fixture
def web(member, browser_of):
    return browser_of(member)


def test_list_shows_the_tenants_instances(web, catalog, tenant, other_tenant):
    make_instance(catalog, tenant, state=State.RUNNING, name="mine")
    make_instance(catalog, tenant, state=State.TERMINATED, name="gone")
    make_instance(catalog, other_tenant, state=State.RUNNING, name="theirs")
    page = web.get("/instances/").content.decode()
    assert "mine" in page and "theirs" not in page and "gone" not in page
    assert "data-live-list" in page and "js/instances.js" in page
    assert "gone" in web.get("/instances/?state=terminated").content.decode()


def test_list_query_count_is_flat(web, catalog, tenant):
    make_instance(catalog, tenant, state=State.RUNNING, name="a")
    web.get("/instances/")
    with CaptureQueriesContext(connection) as few:
        web.get("/instances/")
    for i in range(8):
        make_instance(catalog, tenant, state=State.RUNNING, name=f"b{i}")
    with CaptureQueriesContext(connection) as many:
        web.get("/instances/")
    assert len(many) == len(few)


def test_launch_form_shows_specs_fits_and_quota(web, catalog, tenant):
    catalog.host(gpus=1, mode=Mode.MIG)
    page = web.get("/instances/launch/").content.decode()
    assert "NVIDIA A100 80GB · MIG slice" in page
    assert "NVIDIA A100 80GB · Shared fraction" in page
    mig = page[page.index('data-spec="a100-1g10gb"') :]
    assert "&quot;local-1&quot;: [&quot;fits_now&quot;" in mig[: mig.index("</tr>")]
    assert "&quot;local-2&quot;: [&quot;no_hardware&quot;" in mig[: mig.index("</tr>")]
    quarter = page[page.index('data-spec="a100-quarter"') :]
    assert "no hardware here" in quarter[: quarter.index("</tr>")]  # no shared GPU
    assert "365.00" in page  # $0.50/h × 730 h
    assert 'data-gpu-quota="2.000"' in page


def test_launch_from_the_form(web, catalog, tenant):
    catalog.host(gpus=1, mode=Mode.SHARED)
    response = web.post(
        "/instances/launch/",
        {"region": "local-1", "spec": "a100-quarter", "image": catalog.image.name, "name": "nb"},
    )
    instance = Instance.objects.get(name="nb")
    assert response.status_code == 302 and response["Location"] == f"/instances/{instance.pk}/"
    assert instance.state == State.PROVISIONING
    assert (instance.restart_policy, instance.on_host_loss) == ("on-failure", "keep_disk")
    web.post(
        "/instances/launch/",
        {"region": "local-1", "spec": "a100-quarter", "image": catalog.image.name, "name": "svc",
         "restart_policy": "never", "on_host_loss": "fresh_disk"},
    )  # fmt: skip
    chosen = Instance.objects.get(name="svc")
    assert (chosen.restart_policy, chosen.on_host_loss) == ("never", "fresh_disk")


def test_launch_form_errors(web, catalog, tenant):
    catalog.host(gpus=1, mode=Mode.SHARED)
    response = web.post(
        "/instances/launch/",
        {"region": "local-1", "spec": "a100-quarter", "image": catalog.image.name, "name": "No!"},
    )
    assert response.status_code == 200
    assert "lowercase letters" in response.content.decode()
    Quota.objects.filter(tenant=tenant).update(gpu_quota=Decimal("0.1"))
    response = web.post(
        "/instances/launch/",
        {"region": "local-1", "spec": "a100-quarter", "image": catalog.image.name, "name": "ok"},
    )
    assert "needs 0.25 GPU" in response.content.decode()
    assert not Instance.objects.exists()


def test_viewers_cannot_launch_or_act(catalog, tenant, make_member, browser_of):
    viewer = browser_of(make_member(tenant, Role.VIEWER))
    instance = make_instance(catalog, tenant, state=State.RUNNING)
    page = viewer.get(f"/instances/{instance.pk}/").content.decode()
    assert "data-action" not in page
    assert "Launch instance" not in viewer.get("/instances/").content.decode()
    viewer.post(
        "/instances/launch/",
        {"region": "local-1", "spec": "a100-quarter", "image": catalog.image.name, "name": "v"},
    )
    viewer.post(f"/instances/{instance.pk}/stop/")
    viewer.post(f"/instances/{instance.pk}/terminate/")
    assert Instance.objects.count() == 1
    assert Instance.objects.get(pk=instance.pk).state == State.RUNNING


def test_detail_actions_and_terminate_confirmation(web, catalog, tenant):
    catalog.host(gpus=1, mode=Mode.SHARED)
    instance = services.launch_instance(
        tenant, name="nb", spec=catalog.quarter, image=catalog.image
    )
    outcomes.mark_running(instance.pk, instance.current_allocation().pk)
    page = web.get(f"/instances/{instance.pk}/").content.decode()
    for action in ("stop", "reboot", "terminate", "resize"):
        assert f'data-action="{action}"' in page
    assert 'data-action="start"' not in page
    assert "placement-host" not in page  # tenants do not see hosts
    # before stopping, the page says what the kept disk will cost (50 GiB x $0.10)
    assert "5.00 USD/month for its 50 GiB disk" in page
    fragment = web.get(f"/instances/{instance.pk}/?partial=1").content.decode()
    assert fragment.lstrip().startswith("<div data-live-detail")

    for action in ("reboot", "stop"):  # each asks first: a page, and nothing changes
        asked = web.post(f"/instances/{instance.pk}/{action}/")
        assert asked.status_code == 200
        assert f"{action.capitalize()} nb?" in asked.content.decode()
        assert "ends every process in it" in asked.content.decode()
        assert Instance.objects.get(pk=instance.pk).state == State.RUNNING
    web.post(f"/instances/{instance.pk}/reboot/", {"confirm": "on"})
    assert Instance.objects.get(pk=instance.pk).state == State.REBOOTING
    response = web.post(f"/instances/{instance.pk}/reboot/", follow=True)
    assert "Cannot reboot an instance that is rebooting." in response.content.decode()

    confirm = web.get(f"/instances/{instance.pk}/terminate/").content.decode()
    assert "Terminate nb?" in confirm
    assert Instance.objects.get(pk=instance.pk).state == State.REBOOTING  # asking changed nothing
    web.post(f"/instances/{instance.pk}/terminate/")
    assert Instance.objects.get(pk=instance.pk).state == State.TERMINATING


def test_resize_from_the_page(web, catalog, tenant):
    catalog.host(gpus=1, mode=Mode.SHARED)
    instance = make_instance(catalog, tenant, state=State.STOPPED)
    web.post(f"/instances/{instance.pk}/resize/", {"spec": "a100-half"})
    assert Instance.objects.get(pk=instance.pk).spec == catalog.half


def test_a_resize_that_stops_it_asks_first(web, catalog, tenant, no_tasks):
    Quota.objects.filter(tenant=tenant).update(gpu_quota=Decimal("8"), max_instances=50)
    catalog.host(gpus=2, mode=Mode.SHARED)
    instance = services.launch_instance(
        tenant, name="nb", spec=catalog.quarter, image=catalog.image
    )
    outcomes.mark_running(instance.pk, instance.current_allocation().pk)
    for name, spec in (("f1", catalog.half), ("f2", catalog.quarter)):  # its GPU is full
        services.launch_instance(tenant, name=name, spec=spec, image=catalog.image)
    page = web.get(f"/instances/{instance.pk}/").content.decode()
    assert 'data-impact="stop">A100 1/2 — 1.80 USD/h · stops it</option>' in page

    response = web.post(f"/instances/{instance.pk}/resize/", {"spec": "a100-half"})
    assert response.status_code == 200
    assert "Stop nb to resize it?" in response.content.decode()
    instance.refresh_from_db()
    assert (instance.state, instance.spec) == (State.RUNNING, catalog.quarter)  # asked only

    agreed = {"spec": "a100-half", "confirm": "restart"}  # agreed to less than it does
    assert web.post(f"/instances/{instance.pk}/resize/", agreed).status_code == 200
    response = web.post(
        f"/instances/{instance.pk}/resize/", {"spec": "a100-half", "confirm": "stop"}
    )
    assert response.status_code == 302
    instance.refresh_from_db()
    assert (instance.state, instance.spec) == (State.STOPPING, catalog.half)


def test_a_resize_that_restarts_it_is_labelled_and_asks_first(web, catalog, tenant, no_tasks):
    catalog.host(gpus=1, mode=Mode.SHARED)
    instance = services.launch_instance(
        tenant, name="nb", spec=catalog.quarter, image=catalog.image
    )
    outcomes.mark_running(instance.pk, instance.current_allocation().pk)
    page = web.get(f"/instances/{instance.pk}/").content.decode()
    assert 'data-impact="restart">A100 1/2 — 1.80 USD/h · restarts it</option>' in page

    response = web.post(f"/instances/{instance.pk}/resize/", {"spec": "a100-half"})
    assert "Restart nb to resize it?" in response.content.decode()
    assert Instance.objects.get(pk=instance.pk).state == State.RUNNING
    web.post(f"/instances/{instance.pk}/resize/", {"spec": "a100-half", "confirm": "restart"})
    instance.refresh_from_db()
    assert (instance.state, instance.spec) == (State.REBOOTING, catalog.half)


def test_resize_refusals_are_messages(web, catalog, tenant):
    catalog.host(gpus=1, mode=Mode.SHARED)
    instance = make_instance(catalog, tenant, state=State.STOPPED, disk_gib=100)
    response = web.post(
        f"/instances/{instance.pk}/resize/", {"spec": "a100-half", "disk_gib": "10"}, follow=True
    )
    assert "A disk never shrinks: it is 100 GiB" in response.content.decode()
    response = web.post(f"/instances/{instance.pk}/resize/", {"spec": "a100-1x"}, follow=True)
    assert "No host in Local 1 has NVIDIA A100 80GB GPUs in whole" in response.content.decode()
    instance.refresh_from_db()
    assert (instance.spec, instance.disk_gib) == (catalog.quarter, 100)


def test_a_name_too_long_is_refused_not_cut(web, catalog, tenant):
    catalog.host(gpus=1, mode=Mode.SHARED)
    page = web.get("/instances/launch/").content.decode()
    assert 'name="name"' in page and "maxlength" not in page.split('name="name"')[1][:200]
    response = web.post(
        "/instances/launch/",
        {
            "region": "local-1",
            "spec": "a100-quarter",
            "image": catalog.image.name,
            "name": "a" * 10000,
        },
    )
    assert "at most 63 characters (it has 10000)" in response.content.decode()
    assert not Instance.objects.exists()


def test_a_spec_that_cannot_be_launched_is_a_field_error(web, catalog, tenant):
    catalog.host(gpus=1, mode=Mode.MIG)
    response = web.post(
        "/instances/launch/",
        {"region": "local-1", "spec": "a100-quarter", "image": catalog.image.name, "name": "nb"},
    )
    page = response.content.decode()
    assert 'href="#spec-card" data-error-link>Spec: A100 1/4 cannot be launched: No host' in page
    assert not Instance.objects.exists()


def test_launched_banner_does_not_guess_the_state(web, catalog, tenant):
    catalog.host(gpus=1, mode=Mode.SHARED)
    response = web.post(
        "/instances/launch/",
        {"region": "local-1", "spec": "a100-quarter", "image": catalog.image.name, "name": "nb"},
        follow=True,
    )
    page = response.content.decode()
    assert "nb launched: a GPU slice is reserved." in page
    assert "being provisioned" not in page


def test_operators_see_host_gpu_and_slice(catalog, tenant, make_member, browser_of):
    ops = make_member(tenant, Role.MEMBER, username="ops")
    ops.user.is_staff = True
    ops.user.save()
    host = catalog.host("rack-7", gpus=1, mode=Mode.MIG)
    instance = services.launch_instance(tenant, name="m", spec=catalog.mig1g, image=catalog.image)
    page = browser_of(ops).get(f"/instances/{instance.pk}/").content.decode()
    assert host.name in page and "MIG 1g.10gb at slot" in page and "gpu0" in page


def test_another_tenants_instance_is_404(web, catalog, other_tenant):
    theirs = make_instance(catalog, other_tenant, state=State.RUNNING)
    assert web.get(f"/instances/{theirs.pk}/").status_code == 404
    assert web.post(f"/instances/{theirs.pk}/stop/").status_code == 404
    assert web.get(f"/instances/{theirs.pk}/terminate/").status_code == 404


def test_admin_pages(catalog, tenant, make_member, browser_of):
    from django.contrib.auth import get_user_model

    admin = get_user_model().objects.create_superuser("root", "root@example.com", "pw")
    client = Client()
    client.force_login(admin)
    catalog.host(gpus=1, mode=Mode.SHARED)
    instance = services.launch_instance(
        tenant, name="adm", spec=catalog.quarter, image=catalog.image
    )
    assert client.get("/admin/instances/instance/").status_code == 200
    assert client.get(f"/admin/instances/instance/{instance.pk}/change/").status_code == 200
    allocation = instance.current_allocation()
    assert client.get(f"/admin/instances/allocation/{allocation.pk}/change/").status_code == 200
