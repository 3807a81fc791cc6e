"""The launch form's volumes: the chosen region's free volumes of the tenant, each to tick with
a mount path beside it, attached by the launch as the API attaches them. What the launch
refuses (a bad mount path, a volume attached elsewhere or in another region, another tenant's
volume) is an error on the form's Volumes, and nothing is launched."""

import pytest

from console.catalog.models import Mode
from console.instances.models import Instance, State
from console.launch_templates.models import LaunchTemplate
from console.volumes import services
from console.volumes.models import Volume
from tests.instances.helpers import make_instance

pytestmark = pytest.mark.usefixtures("no_tasks")

LAUNCH = "/instances/launch/"


@pytest.fixture
def data(catalog, tenant):
    catalog.host("gpu-1", gpus=1, mode=Mode.SHARED)
    return services.create_volume(tenant, name="data", size_gib=20, region=catalog.region)


def launch(web, catalog, **fields):
    body = {"region": "local-1", "spec": "a100-quarter", "image": catalog.image.name,
            "name": "trainer", **fields}  # fmt: skip
    return web.post(LAUNCH, body)


def errors_on_volumes(response) -> list[str]:
    assert response.status_code == 200, response.status_code
    assert not Instance.objects.filter(name="trainer").exists()
    return list(response.context["form"].errors.get("volumes", []))


def test_the_form_lists_the_regions_free_volumes(web, catalog, tenant, other_tenant, data):
    services.create_volume(tenant, name="elsewhere", size_gib=5, region=catalog.region2)
    held = services.create_volume(tenant, name="held", size_gib=5, region=catalog.region)
    services.attach_volume(held, make_instance(catalog, tenant, state=State.STOPPED))
    services.create_volume(other_tenant, name="theirs", size_gib=5, region=catalog.region)
    page = web.get(LAUNCH).content.decode()
    row = page[page.index('data-volume="data"') :]
    row = row[: row.index("</tr>")]
    assert 'data-region="local-1"' in row and "20 GiB" in row and "hidden" not in row
    assert 'placeholder="/mnt/data"' in row
    other = page[page.index('data-volume="elsewhere"') :]
    assert " hidden>" in other[: other.index("</tr>")]  # shown when local-2 is chosen
    assert 'data-volume="held"' not in page and 'data-volume="theirs"' not in page


def test_a_launch_attaches_the_ticked_volumes_at_their_paths(web, catalog, tenant, data):
    scratch = services.create_volume(tenant, name="scratch", size_gib=5, region=catalog.region)
    response = launch(
        web, catalog, volumes=[data.pk, scratch.pk], **{f"mount_path_{data.pk}": "/data"}
    )
    instance = Instance.objects.get(name="trainer")
    assert response.status_code == 302 and response["Location"] == f"/instances/{instance.pk}/"
    attached = {v.name: v.mount_path for v in Volume.objects.filter(instance=instance)}
    assert attached == {"data": "/data", "scratch": "/mnt/scratch"}  # the API's default


def test_a_launch_without_volumes_attaches_none(web, catalog, data):
    assert launch(web, catalog).status_code == 302
    assert Volume.objects.get(pk=data.pk).instance is None


@pytest.mark.parametrize(
    ("path", "said"),
    [
        ("/workspace", "/workspace is the container's own"),
        ("/etc/app", "/etc is the container's own"),
        ("data", "absolute path"),
        ("/data/../etc", "plain path"),
    ],
)
def test_a_bad_mount_path_is_an_error_on_volumes(web, catalog, data, path, said):
    response = launch(web, catalog, volumes=[data.pk], **{f"mount_path_{data.pk}": path})
    [error] = errors_on_volumes(response)
    assert error.startswith("data:") and said in error
    page = response.content.decode()
    assert 'href="#launch-volumes"' in page  # the summary at the top leads to it
    assert f'value="{path}"' in page.replace("&#x27;", "'")  # what was typed stays
    assert Volume.objects.get(pk=data.pk).instance is None


def test_a_volume_attached_meanwhile_is_an_error(web, catalog, tenant, data):
    services.attach_volume(data, make_instance(catalog, tenant, state=State.STOPPED, name="idle"))
    [error] = errors_on_volumes(launch(web, catalog, volumes=[data.pk]))
    assert error == "data is attached to another instance."


def test_a_volume_of_another_region_is_an_error(web, catalog, tenant, data):
    far = services.create_volume(tenant, name="far", size_gib=5, region=catalog.region2)
    [error] = errors_on_volumes(launch(web, catalog, volumes=[far.pk]))
    assert error == "far is in Local 2, the instance in Local 1."
    assert Volume.objects.get(pk=far.pk).instance is None


def test_another_tenants_volume_is_no_volume_at_all(web, catalog, other_tenant, data):
    theirs = services.create_volume(other_tenant, name="loot", size_gib=5, region=catalog.region)
    taken = errors_on_volumes(launch(web, catalog, volumes=[theirs.pk]))
    nobody = errors_on_volumes(launch(web, catalog, volumes=[theirs.pk + 1000]))
    assert taken == [f"You have no volume {theirs.pk}."]  # as for an id that nobody has
    assert nobody == [f"You have no volume {theirs.pk + 1000}."]
    assert Volume.objects.get(pk=theirs.pk).instance is None


def test_save_as_template_keeps_the_volumes_by_name(web, catalog, data):
    response = launch(
        web, catalog, volumes=[data.pk], save_template="on", template_name="with-data",
        **{f"mount_path_{data.pk}": "/data"},
    )  # fmt: skip
    assert response.status_code == 302
    template = LaunchTemplate.objects.get(name="with-data")
    assert template.volumes == [{"volume": "data", "mount_path": "/data"}]
    assert not Instance.objects.exists()
