"""A tenant's own image reference: launched through the API, the form and a template where
the region allows its registry (a field error naming the rule where not), run with the
image's own defaults, pinned to the digest of its first pull so that every later allocation
runs the same bytes, and pulled with the tenant's registry credential."""

import pytest

from console.catalog.models import Mode
from console.instances import outcomes, placement, tasks
from console.instances.models import Allocation, Instance, State
from console.launch_templates import services as template_services
from console.registry_credentials import services as credentials

pytestmark = pytest.mark.usefixtures("no_tasks")
URL = "/api/v1/instances/"
REF = "registry.example.com/team/trainer:1.0"
DIGEST = "sha256:" + "ab" * 32
OTHER = "sha256:" + "cd" * 32


@pytest.fixture
def api(member, token_client):
    return token_client(member)


def launch(api, **extra):
    body = {"name": "own", "spec": "a100-quarter", "region": "local-1", "image_ref": REF, **extra}
    return api.post(URL, body, format="json")


def test_launch_by_reference(api, catalog):
    catalog.host(gpus=1, mode=Mode.SHARED)
    response = launch(api)
    assert response.status_code == 202, response.json()
    shown = response.json()
    assert (shown["image"], shown["image_reference"], shown["image_digest"]) == (REF, REF, "")
    instance = Instance.objects.get()
    assert instance.image is None and instance.restart_policy == "on-failure"
    request = instance.current_allocation().request
    assert request["image"] == REF
    assert request["command"] is None and request["env"] == {}  # the image's own


def test_a_refused_registry_is_a_field_error(api, catalog):
    catalog.region.allowed_registries = ["ghcr.io", "quay.io"]
    catalog.region.save()
    response = launch(api)
    assert response.status_code == 400
    assert response.json()["errors"]["image_ref"] == [
        "registry.example.com is not among the registries region local-1 allows: ghcr.io, quay.io."
    ]
    assert not Instance.objects.exists()


@pytest.mark.parametrize(
    "extra",
    [
        {"image_ref": "localhost/gpucloud/jupyter:latest"},
        {"image_ref": "ubuntu"},
        {"image_ref": "ghcr.io/x/y:1;reboot"},
        {"image_ref": "ghcr.io/" + "x" * 400},
        {"image": "pytorch-2.5-cuda12.4"},  # both a catalog image and a reference
    ],
)
def test_refused_references(api, catalog, extra):
    response = launch(api, **extra)
    assert response.status_code == 400
    assert set(response.json()["errors"]) == {"image_ref"}
    assert not Instance.objects.exists()


def test_a_region_without_tenant_images(api, catalog):
    catalog.region.tenant_images = False
    catalog.region.save()
    response = launch(api)
    assert response.status_code == 400
    assert "only the catalog's images" in response.json()["errors"]["image_ref"][0]


def test_the_form_takes_a_reference(web, catalog):
    catalog.host(gpus=1, mode=Mode.SHARED)
    form = {"region": "local-1", "spec": "a100-quarter", "image": catalog.image.name}
    refused = web.post("/instances/launch/", {**form, "name": "a", "image_ref": "ubuntu"})
    assert refused.status_code == 200 and "Name the registry" in refused.content.decode()
    response = web.post("/instances/launch/", {**form, "name": "b", "image_ref": REF})
    assert response.status_code == 302
    instance = Instance.objects.get(name="b")
    assert (instance.image, instance.image_reference) == (None, REF)
    page = web.get(f"/instances/{instance.pk}/").content.decode()
    assert REF in page


def pinned_instance(api, catalog) -> Instance:
    catalog.host(gpus=1, mode=Mode.SHARED)
    launch(api)
    instance = Instance.objects.get()
    allocation = instance.current_allocation()
    assert outcomes.mark_running(instance.pk, allocation.pk, image_digest=DIGEST)
    instance.refresh_from_db()
    return instance


def test_the_first_pull_pins_the_digest(api, catalog, web):
    instance = pinned_instance(api, catalog)
    assert instance.state == State.RUNNING and instance.image_digest == DIGEST
    assert instance.pull_reference == f"registry.example.com/team/trainer@{DIGEST}"
    notes = list(instance.events.values_list("message", flat=True))
    assert f"Pinned {REF} to {DIGEST}" in notes
    assert DIGEST in web.get(f"/instances/{instance.pk}/").content.decode()
    assert api.get(f"{URL}{instance.pk}/").json()["image_digest"] == DIGEST


def test_every_later_allocation_runs_the_pinned_digest(api, catalog):
    instance = pinned_instance(api, catalog)
    first = instance.current_allocation()
    placement.release(first)
    Instance.objects.filter(pk=instance.pk).update(state=State.STOPPED)
    instance.refresh_from_db()
    from console.instances import services

    services.start_instance(instance)
    again = Allocation.objects.filter(instance=instance, released_at__isnull=True).get()
    assert again.request["image"] == f"registry.example.com/team/trainer@{DIGEST}"
    # a later report of another digest (a moved tag) changes nothing
    outcomes.mark_running(instance.pk, again.pk, image_digest=OTHER)
    instance.refresh_from_db()
    assert instance.image_digest == DIGEST


def test_catalog_images_follow_their_tag(api, catalog):
    catalog.host(gpus=1, mode=Mode.SHARED)
    body = {"name": "cat", "spec": "a100-quarter", "image": catalog.image.name}
    api.post(URL, body, format="json")
    instance = Instance.objects.get()
    outcomes.mark_running(instance.pk, instance.current_allocation().pk, image_digest=DIGEST)
    instance.refresh_from_db()
    assert instance.image_digest == ""


def test_a_bad_digest_is_not_pinned(api, catalog):
    catalog.host(gpus=1, mode=Mode.SHARED)
    launch(api)
    instance = Instance.objects.get()
    outcomes.mark_running(instance.pk, instance.current_allocation().pk, image_digest="sha256:x")
    instance.refresh_from_db()
    assert instance.image_digest == ""


def test_the_credential_goes_in_the_agent_body_only(api, catalog, tenant, monkeypatch):
    catalog.host(gpus=1, mode=Mode.SHARED)
    credentials.save_credential(
        tenant, registry="registry.example.com", username="ci-bot", password="s3cr3t"
    )
    launch(api)
    instance = Instance.objects.get()
    allocation = instance.current_allocation()
    assert "s3cr3t" not in str(allocation.request)  # the stored request holds no secret
    sent = {}
    monkeypatch.setattr(
        tasks.agent_client,
        "create_allocation",
        lambda host, pk, body: sent.update(body) or {"state": "running", "id": pk},
    )
    job = outcomes.job(instance.pk, (State.PROVISIONING,))
    tasks._put(None, job)
    assert sent["registry_auth"] == {
        "registry": "registry.example.com",
        "username": "ci-bot",
        "password": "s3cr3t",
    }
    assert sent["image"] == REF


def test_a_template_keeps_the_reference(api, catalog, tenant):
    catalog.host(gpus=1, mode=Mode.SHARED)
    created = api.post(
        "/api/v1/templates/",
        {"name": "t", "spec": "a100-quarter", "image_ref": REF},
        format="json",
    )
    assert created.status_code == 201, created.json()
    assert created.json()["image_ref"] == REF
    response = api.post(URL, {"name": "from-t", "template": "t"}, format="json")
    assert response.status_code == 202, response.json()
    assert Instance.objects.get().image_reference == REF
    both = api.post(
        "/api/v1/templates/",
        {"name": "t2", "spec": "a100-quarter", "image_ref": REF, "image": catalog.image.name},
        format="json",
    )
    assert both.status_code == 400 and "image_ref" in both.json()["errors"]
    # a launch naming a catalog image overrides the template's reference
    api.post(URL, {"name": "over", "template": "t", "image": catalog.image.name}, format="json")
    assert Instance.objects.get(name="over").image == catalog.image
    saved = template_services.save_from_instance(Instance.objects.get(name="from-t"), "again")
    assert saved.image_ref == REF
