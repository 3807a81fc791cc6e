"""The console's templates: the Templates page (own and published, a Launch button each), a
launch in one click, "Save as template" on the launch form and on an instance's page."""

import pytest

from console import secret_env
from console.catalog.models import Mode
from console.instances.models import Instance, State
from console.launch_templates import services
from console.launch_templates.models import LaunchTemplate
from tests.clients import signed_in

pytestmark = pytest.mark.usefixtures("no_tasks")


@pytest.fixture
def saved(catalog, tenant):
    return services.create_template(
        tenant, name="trainer", spec=catalog.quarter, image=catalog.image,
        command=["python", "train.py"], env={"SEED": "7"}, secrets={"HF_TOKEN": "hf_x"},
    )  # fmt: skip


def test_the_page_lists_own_and_published_templates(catalog, web, saved, other_tenant):
    services.create_template(None, name="PyTorch + JupyterLab", spec=catalog.half)
    services.create_template(other_tenant, name="theirs", spec=catalog.quarter)
    page = web.get("/templates/").content.decode()
    assert "trainer" in page and "PyTorch + JupyterLab" in page and "theirs" not in page
    assert page.count('data-testid="launch-template"') == 2
    assert page.count('data-testid="delete-template"') == 1  # a published one is not ours
    assert f"HF_TOKEN={secret_env.MASK}" in page and "hf_x" not in page


def test_launch_in_one_click(catalog, web, saved, tenant):
    catalog.host(gpus=1, mode=Mode.SHARED)
    response = web.post(f"/instances/launch/template/{saved.pk}/")
    instance = Instance.objects.get(tenant=tenant)
    assert response.status_code == 302 and response["Location"] == f"/instances/{instance.pk}/"
    assert instance.name.startswith("a100-quarter-") and instance.state == State.PROVISIONING
    assert (instance.command, instance.env) == (["python", "train.py"], {"SEED": "7"})
    assert secret_env.open_all(instance.secret_env) == {"HF_TOKEN": "hf_x"}


def test_a_launch_that_is_refused_says_why_on_the_templates_page(catalog, web, saved):
    response = web.post(f"/instances/launch/template/{saved.pk}/", follow=True)
    assert response.redirect_chain[-1][0] == "/templates/"
    assert "trainer was not launched" in response.content.decode()
    assert not Instance.objects.exists()


def test_a_viewer_sees_templates_but_launches_nothing(catalog, viewer, saved):
    client = signed_in(viewer)
    page = client.get("/templates/").content.decode()
    assert "trainer" in page and 'data-testid="launch-template"' not in page
    refused = client.post(f"/instances/launch/template/{saved.pk}/", follow=True)
    assert "Your role (viewer) cannot do this" in refused.content.decode()
    client.post(f"/templates/{saved.pk}/delete/")
    assert not Instance.objects.exists() and LaunchTemplate.objects.exists()


def test_another_tenants_template_is_not_found(catalog, web, other_tenant):
    theirs = services.create_template(other_tenant, name="theirs", spec=catalog.quarter)
    catalog.host(gpus=1, mode=Mode.SHARED)
    assert web.post(f"/instances/launch/template/{theirs.pk}/").status_code == 404
    assert web.post(f"/templates/{theirs.pk}/delete/").status_code == 404
    assert not Instance.objects.exists() and LaunchTemplate.objects.exists()


def test_delete_ones_own(web, saved):
    assert web.post(f"/templates/{saved.pk}/delete/").status_code == 302
    assert not LaunchTemplate.objects.exists()


def test_save_the_launch_form_as_a_template(catalog, web, tenant):
    catalog.host(gpus=1, mode=Mode.SHARED)
    form = {"region": "local-1", "spec": "a100-quarter", "image": catalog.image.name,
            "command": "python train.py", "env": "SEED=7", "secret_env": "HF_TOKEN=hf_x",
            "save_template": "on"}  # fmt: skip
    unnamed = web.post("/instances/launch/", form)
    assert unnamed.status_code == 200 and "Name the template to save." in unnamed.content.decode()
    response = web.post("/instances/launch/", {**form, "template_name": "trainer"})
    assert response.status_code == 302 and response["Location"] == "/templates/"
    template = LaunchTemplate.objects.get(tenant=tenant)
    assert (template.name, template.command, template.env) == (
        "trainer", ["python", "train.py"], {"SEED": "7"},
    )  # fmt: skip
    assert secret_env.open_all(template.secret_env) == {"HF_TOKEN": "hf_x"}
    assert not Instance.objects.exists()  # saved, not launched
    again = web.post("/instances/launch/", {**form, "template_name": "trainer"})
    assert "A template named trainer already exists." in again.content.decode()


def test_save_an_instance_as_a_template_from_its_page(catalog, web, tenant, viewer):
    catalog.host(gpus=1, mode=Mode.SHARED)
    web.post("/instances/launch/", {"region": "local-1", "spec": "a100-quarter",
                                    "image": catalog.image.name, "name": "nb"})  # fmt: skip
    instance = Instance.objects.get(name="nb")
    assert (
        'data-testid="save-instance-template"'
        in web.get(f"/instances/{instance.pk}/").content.decode()
    )
    page = signed_in(viewer).get(f"/instances/{instance.pk}/").content.decode()
    assert 'data-testid="save-instance-template"' not in page
    signed_in(viewer).post(f"/instances/{instance.pk}/save-template/", {"name": "mine"})
    assert not LaunchTemplate.objects.exists()  # refused: a viewer saves nothing
    response = web.post(f"/instances/{instance.pk}/save-template/", {"name": "nb-template"})
    assert response.status_code == 302 and response["Location"] == "/templates/"
    template = LaunchTemplate.objects.get(name="nb-template")
    assert (template.spec, template.disk_gib) == (catalog.quarter, instance.disk_gib)
