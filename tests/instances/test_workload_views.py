"""The console's pages of what an instance runs: the launch form's command line and
environment lines, and the instance page's image reference, command, exit code, disk and
Logs panel; the catalog's image validation for operators."""

import pytest
from django.core.exceptions import ValidationError
from django.test import Client

from console.catalog.models import Image, Mode
from console.instances.models import Instance, State
from console.instances.reasons import Code
from tests.instances.helpers import make_instance

pytestmark = pytest.mark.usefixtures("no_tasks")


@pytest.fixture
def web(member):
    client = Client()
    client.force_login(member.user)
    return client


def post_launch(web, catalog, **fields):
    body = {"region": "local-1", "spec": "a100-quarter", "image": catalog.image.name}
    return web.post("/instances/launch/", {**body, "name": "nb", **fields})


def test_the_form_splits_the_command_line_and_reads_env_lines(web, catalog, tenant):
    catalog.host(gpus=1, mode=Mode.SHARED)
    env = "SEED=7\r\n\r\nMSG=a b=c\r\n"
    response = post_launch(web, catalog, command="python -c 'print(1)' --x", env=env)
    assert response.status_code == 302
    instance = Instance.objects.get(name="nb")
    assert instance.command == ["python", "-c", "print(1)", "--x"]
    assert instance.env == {"SEED": "7", "MSG": "a b=c"}


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"command": "echo 'unclosed"}, "Cannot split this command line"),
        ({"env": "NOEQUALS"}, "Line 1: write NAME=value."),
        ({"env": "lower=x"}, "is not a variable name"),
    ],
)
def test_bad_command_or_env_is_said_on_the_form(web, catalog, tenant, fields, message):
    response = post_launch(web, catalog, **fields)
    assert response.status_code == 200
    assert message in response.content.decode().replace("&#x27;", "'")
    assert not Instance.objects.exists()


def test_the_instance_page_shows_what_it_runs_its_disk_and_logs(web, catalog, tenant):
    host = catalog.host("gpu-a", gpus=1)
    instance = make_instance(
        catalog, tenant, state=State.FAILED, command=["sh", "-c", "exit 3"], exit_code=3,
        disk_gib=50, disk_host=host, state_reason_code=Code.EXIT_CODE,
        state_reason_detail="3",
    )  # fmt: skip
    page = web.get(f"/instances/{instance.pk}/").content.decode()
    assert catalog.image.reference in page
    # the argv as a shell line that gives it back: copyable, quoting kept
    assert 'data-testid="command-line">sh -c &#x27;exit 3&#x27;<' in page
    assert 'data-testid="exit-code">3<' in page
    assert "50 GiB at /workspace on gpu-a" in page
    assert f'data-logs-url="/api/v1/instances/{instance.pk}/logs/?tail=500"' in page
    assert "js/instance_logs.js" in page


def test_operators_images_are_validated(catalog):
    image = Image(name="x", reference="Not A Reference", cuda_version="12.4")
    image.command = "echo"
    image.env = {"bad-name": "x"}
    image.ports = [{"port": 70000, "name": "web"}, {"port": 22}]
    with pytest.raises(ValidationError) as error:
        image.full_clean()
    assert set(error.value.message_dict) == {"reference", "command", "env", "ports"}
    good = Image(
        name="y", reference="registry.local:5000/team/train:v1", cuda_version="12.4",
        command=["python", "train.py"], env={"HF_HOME": "/workspace/hf"},
        ports=[{"port": 8888, "name": "Jupyter"}],
    )  # fmt: skip
    good.full_clean()


def test_the_catalog_api_shows_what_an_image_runs(catalog, member, token_client):
    catalog.image.ports = [{"port": 8888, "name": "Jupyter"}]
    catalog.image.save()
    image = token_client(member).get("/api/v1/images/").json()["results"][0]
    assert image["reference"] == "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"
    assert (image["command"], image["env"]) == ([], {})
    assert image["ports"] == [{"port": 8888, "name": "Jupyter"}]
