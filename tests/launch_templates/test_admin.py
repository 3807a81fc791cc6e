"""Operators publish templates in the admin: a template of no tenant must be public, a
credential given as plain env is sealed there too, and secrets show as names only."""

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from console import secret_env
from console.launch_templates import services
from console.launch_templates.models import LaunchTemplate


@pytest.fixture
def operator(db):
    client = Client()
    client.force_login(get_user_model().objects.create_superuser("root", "r@example.com", "pw"))
    return client


def _form(catalog, **extra) -> dict:
    return {"name": "PyTorch + JupyterLab", "spec": catalog.quarter.pk,
            "env": '{"HF_TOKEN": "hf_op"}', "ports": "[]", "volumes": "[]",
            "on_host_loss": "keep_disk", "command": "", **extra}  # fmt: skip


def test_an_operator_publishes_a_template(catalog, operator):
    private = operator.post("/admin/launch_templates/launchtemplate/add/", _form(catalog))
    assert private.status_code == 200
    assert "it must be public" in private.content.decode()
    published = operator.post("/admin/launch_templates/launchtemplate/add/",
                              _form(catalog, public="on"))  # fmt: skip
    assert published.status_code == 302, published.content.decode()[:3000]
    template = LaunchTemplate.objects.get()
    assert template.public and template.tenant is None and template.env == {}
    assert secret_env.open_all(template.secret_env) == {"HF_TOKEN": "hf_op"}
    page = operator.get(f"/admin/launch_templates/launchtemplate/{template.pk}/change/")
    assert f"HF_TOKEN={secret_env.MASK}" in page.content.decode()
    assert "hf_op" not in page.content.decode()


def test_an_operator_publishes_a_tenants_template(catalog, operator, tenant):
    template = services.create_template(tenant, name="mine", spec=catalog.quarter)
    form = {**_form(catalog, name="mine", env="{}", public="on"), "tenant": tenant.pk}
    changed = operator.post(f"/admin/launch_templates/launchtemplate/{template.pk}/change/", form)
    assert changed.status_code == 302
    template.refresh_from_db()
    assert template.public and template.tenant == tenant
