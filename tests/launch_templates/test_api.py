"""/api/v1/templates/ and launching from a template with `template` in the launch body: the
tenant's own and the published ones, any field overridden, a foreign tenant's not found, a
viewer read-only, a published one read-only to tenants."""

import pytest

from console import secret_env
from console.audit.models import AuditEntry
from console.catalog.models import Mode
from console.instances.models import Instance
from console.launch_templates import services
from console.launch_templates.models import LaunchTemplate

pytestmark = pytest.mark.usefixtures("no_tasks")
MASK = secret_env.MASK


@pytest.fixture
def api(member, token_client):
    return token_client(member)


def _body(**extra) -> dict:
    return {"name": "trainer", "spec": "a100-quarter", "image": "pytorch-2.5-cuda12.4",
            "command": ["python", "train.py"], "env": {"SEED": "7"},
            "secret_env": {"HF_TOKEN": "hf_x"}, "ports": [{"port": 8080, "name": "app"}],
            "disk_gib": 80, "restart_policy": "never", "on_host_loss": "fresh_disk",
            **extra}  # fmt: skip


def test_crud(catalog, api):
    created = api.post("/api/v1/templates/", _body(), format="json")
    assert created.status_code == 201, created.json()
    shown = created.json()
    assert shown["secret_env"] == {"HF_TOKEN": MASK}
    assert (shown["spec"], shown["image"], shown["public"], shown["mine"]) == (
        "a100-quarter", "pytorch-2.5-cuda12.4", False, True,
    )  # fmt: skip
    pk = shown["id"]
    assert [t["name"] for t in api.get("/api/v1/templates/").json()["results"]] == ["trainer"]
    changed = api.patch(f"/api/v1/templates/{pk}/", {"disk_gib": 100}, format="json")
    assert changed.status_code == 200 and changed.json()["disk_gib"] == 100
    template = LaunchTemplate.objects.get(pk=pk)
    assert secret_env.open_all(template.secret_env) == {"HF_TOKEN": "hf_x"}  # untouched
    # the secrets as shown keep their values; a new one is added, one left out is removed
    secrets = {"HF_TOKEN": MASK, "DB_PASSWORD": "pw"}
    api.patch(f"/api/v1/templates/{pk}/", {"secret_env": secrets}, format="json")
    template.refresh_from_db()
    assert secret_env.open_all(template.secret_env) == {"HF_TOKEN": "hf_x", "DB_PASSWORD": "pw"}
    api.patch(f"/api/v1/templates/{pk}/", {"secret_env": {"DB_PASSWORD": MASK}}, format="json")
    template.refresh_from_db()
    assert secret_env.open_all(template.secret_env) == {"DB_PASSWORD": "pw"}
    assert api.delete(f"/api/v1/templates/{pk}/").status_code == 204
    assert not LaunchTemplate.objects.exists()


@pytest.mark.parametrize(
    "field, value, error",
    [("name", "", "blank"), ("spec", "nope", "nope"), ("disk_gib", 10, "at least"),
     ("env", {"bad name": "x"}, "not a variable name"), ("command", [], "at least"),
     ("secret_env", {"HF_TOKEN": MASK}, "is how a secret is shown"),
     ("ports", [{"port": 0, "name": "x"}], "A whole number from 1 to 65535")],
)  # fmt: skip
def test_bad_fields_are_field_errors(catalog, api, field, value, error):
    response = api.post("/api/v1/templates/", _body(**{field: value}), format="json")
    assert response.status_code == 400, response.json()
    assert list(response.json()["errors"]) == [field]
    assert error in str(response.json()["errors"][field])


def test_a_name_is_one_template_per_tenant(catalog, api):
    assert api.post("/api/v1/templates/", _body(), format="json").status_code == 201
    again = api.post("/api/v1/templates/", _body(), format="json")
    assert again.status_code == 400
    assert again.json()["errors"] == {"name": ["A template named trainer already exists."]}


def test_another_tenants_template_is_not_found(catalog, api, other_tenant, make_member,
                                               token_client):  # fmt: skip
    theirs = services.create_template(other_tenant, name="theirs", spec=catalog.quarter)
    assert api.get(f"/api/v1/templates/{theirs.pk}/").status_code == 404
    assert (
        api.patch(f"/api/v1/templates/{theirs.pk}/", {"name": "x"}, format="json").status_code
        == 404
    )
    assert api.delete(f"/api/v1/templates/{theirs.pk}/").status_code == 404
    assert api.get("/api/v1/templates/").json()["results"] == []
    catalog.host(gpus=1, mode=Mode.SHARED)
    launch = api.post("/api/v1/instances/", {"template": str(theirs.pk)}, format="json")
    assert launch.status_code == 400
    assert "No template" in launch.json()["errors"]["template"][0]


def test_a_viewer_reads_but_changes_nothing(catalog, api, viewer, token_client):
    pk = api.post("/api/v1/templates/", _body(), format="json").json()["id"]
    client = token_client(viewer)
    assert client.get(f"/api/v1/templates/{pk}/").status_code == 200
    assert client.post("/api/v1/templates/", _body(name="x"), format="json").status_code == 403
    assert (
        client.patch(f"/api/v1/templates/{pk}/", {"disk_gib": 90}, format="json").status_code == 403
    )
    assert client.delete(f"/api/v1/templates/{pk}/").status_code == 403
    catalog.host(gpus=1, mode=Mode.SHARED)
    assert (
        client.post("/api/v1/instances/", {"template": "trainer"}, format="json").status_code == 403
    )
    assert client.post(f"/api/v1/templates/{pk}/", {}, format="json").status_code in (403, 405)


def test_published_templates_are_every_tenants_and_read_only(catalog, api):
    published = services.create_template(None, name="PyTorch + JupyterLab", spec=catalog.quarter)
    assert published.public
    (shown,) = api.get("/api/v1/templates/").json()["results"]
    assert (shown["name"], shown["public"], shown["mine"]) == ("PyTorch + JupyterLab", True, False)
    assert api.patch(f"/api/v1/templates/{published.pk}/", {"disk_gib": 90},
                     format="json").status_code == 404  # fmt: skip
    assert api.delete(f"/api/v1/templates/{published.pk}/").status_code == 404
    # a tenant cannot publish: `public` is read-only
    mine = api.post("/api/v1/templates/", _body(public=True), format="json").json()
    assert mine["public"] is False


def test_launch_from_a_template_by_name_or_id_with_overrides(catalog, api):
    catalog.host(gpus=1, mode=Mode.SHARED)
    pk = api.post("/api/v1/templates/", _body(), format="json").json()["id"]
    by_name = api.post("/api/v1/instances/", {"template": "trainer"}, format="json")
    assert by_name.status_code == 202, by_name.json()
    shown = by_name.json()
    assert shown["name"].startswith("a100-quarter-")  # generated
    assert (shown["spec"], shown["command"], shown["env"], shown["disk"]["size_gib"]) == (
        "a100-quarter", ["python", "train.py"], {"SEED": "7"}, 80,
    )  # fmt: skip
    assert (shown["restart_policy"], shown["on_host_loss"]) == ("never", "fresh_disk")
    assert shown["secret_env"] == {"HF_TOKEN": MASK}
    assert [p["port"] for p in shown["ports"]] == [8080]
    body = {"template": str(pk), "name": "custom", "spec": "a100-half", "disk_gib": 90,
            "env": {"EPOCHS": "3"}, "secret_env": {"HF_TOKEN": MASK, "DB_PASSWORD": "pw"},
            "on_host_loss": "keep_disk"}  # fmt: skip
    custom = api.post("/api/v1/instances/", body, format="json")
    assert custom.status_code == 202, custom.json()
    shown = custom.json()
    assert (shown["name"], shown["spec"], shown["disk"]["size_gib"]) == ("custom", "a100-half", 90)
    assert shown["env"] == {"SEED": "7", "EPOCHS": "3"}
    assert shown["on_host_loss"] == "keep_disk" and shown["command"] == ["python", "train.py"]
    instance = Instance.objects.get(name="custom")
    assert secret_env.open_all(instance.secret_env) == {"HF_TOKEN": "hf_x", "DB_PASSWORD": "pw"}


def test_a_launch_needs_a_spec_or_a_template(catalog, api):
    response = api.post("/api/v1/instances/", {"name": "x"}, format="json")
    assert response.status_code == 400
    assert response.json()["errors"] == {"spec": ["Give a spec, or a template."]}


def test_save_an_instance_as_a_template(catalog, api, tenant, other_tenant, make_member,
                                        token_client):  # fmt: skip
    catalog.host(gpus=1, mode=Mode.SHARED)
    iid = api.post("/api/v1/instances/", _body(name="nb"), format="json").json()["id"]
    saved = api.post(f"/api/v1/instances/{iid}/save-template/", {"name": "nb"}, format="json")
    assert saved.status_code == 201, saved.json()
    assert (saved.json()["spec"], saved.json()["disk_gib"], saved.json()["command"]) == (
        "a100-quarter", 80, ["python", "train.py"],
    )  # fmt: skip
    again = api.post(f"/api/v1/instances/{iid}/save-template/", {"name": "nb"}, format="json")
    assert again.status_code == 400 and "already exists" in again.json()["errors"]["name"][0]
    stranger = token_client(make_member(other_tenant))
    foreign = stranger.post(f"/api/v1/instances/{iid}/save-template/", {"name": "x"}, format="json")
    assert foreign.status_code == 404


def test_the_schema_documents_templates(client):
    schema = client.get("/api/v1/schema/?format=json").json()
    assert "/api/v1/templates/" in schema["paths"]
    assert "/api/v1/templates/{id}/" in schema["paths"]
    assert "/api/v1/instances/{id}/save-template/" in schema["paths"]
    launch = schema["components"]["schemas"]["LaunchRequest"]["properties"]
    assert "template" in launch and "secret_env" in launch


def test_volumes_go_with_the_template_to_the_launch(catalog, api):
    volumes = [{"volume": "data", "mount_path": "/data"}]
    created = api.post("/api/v1/templates/", _body(volumes=volumes), format="json")
    assert created.status_code == 201, created.json()
    assert created.json()["volumes"] == volumes
    template = LaunchTemplate.objects.get()
    assert services.launch_fields(template, {})["volumes"] == volumes
    assert services.launch_fields(template, {"volumes": []})["volumes"] == []


def test_a_template_is_on_record_without_its_secrets(catalog, api):
    assert api.post("/api/v1/templates/", _body(), format="json").status_code == 201
    [entry] = AuditEntry.objects.filter(action="launchtemplate.create")
    assert entry.after["name"] == "trainer" and entry.after["env"] == {"SEED": "7"}
    assert "hf_x" not in str(entry.after) and "secret_env" not in entry.after
