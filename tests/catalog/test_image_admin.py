"""The admin's image form: ports and environment as rows of fields, each bad row named; CUDA
optional; a saved image checked against the CUDA the hosts' drivers support."""

import re

import pytest
from django.test import Client

from console.catalog.models import Image
from console.fleet import services
from console.fleet.models import Gpu
from tests.factories import GpuModelFactory, ImageFactory, RegionFactory, UserFactory
from tests.fleet.conftest import make_inventory

pytestmark = pytest.mark.django_db

ADD = "/admin/catalog/image/add/"


@pytest.fixture
def register():
    """Register a host as its agent would, its drivers supporting up to `cuda_version`."""
    region = RegionFactory()
    GpuModelFactory()

    def do(hostname: str, cuda_version: str = "12.4"):
        _, raw = services.create_join_token(region)
        host, _ = services.register_host(
            join_token=raw,
            hostname=hostname,
            address="http://127.0.0.1:9101",
            remote_addr="127.0.0.1",
            region_code=region.code,
            agent_version="0.1.0",
            inventory=make_inventory(hostname, 2),
        )
        Gpu.objects.filter(host=host).update(cuda_version=cuda_version)
        return host

    return do


@pytest.fixture
def admin_client():
    client = Client()
    client.force_login(UserFactory(username="root", is_staff=True, is_superuser=True))
    return client


def form(**fields) -> dict:
    data = {
        "name": "trainer",
        "reference": "registry.local:5000/team/train:v1",
        "cuda_version": "12.4",
        "description": "",
        "restart_policy": "on-failure",
        "active": "on",
    }
    data.update(fields)
    return data


def rows(name: str, *entries: tuple) -> dict:
    keys = {"ports": ("port", "name", "app"), "env": ("name", "value")}[name]
    return {
        f"{name}-{index}-{key}": value
        for index, entry in enumerate(entries)
        for key, value in zip(keys, entry, strict=True)
    }


def errors_of(response, field: str) -> list[str]:
    """The messages of one field's error list on the admin page."""
    page = response.content.decode()
    block = re.search(
        rf'<div class="form-row[^"]*field-{field}[^"]*">(.*?)</div>\s*</div>', page, re.S
    )
    assert block, f"no {field} row"
    return [
        re.sub(r"<[^>]+>", "", item).strip()
        for item in re.findall(r"<li>(.*?)</li>", block[1], re.S)
    ]


def test_saves_ports_and_env_from_rows(admin_client):
    data = form(
        **rows("ports", ("8888", "JupyterLab", "jupyter"), ("8000", "API", ""), ("", "", "")),
        **rows("env", ("HF_HOME", "/workspace/hf"), ("GREETING", "  hello world "), ("", "")),
    )
    response = admin_client.post(ADD, data)
    assert response.status_code == 302, response.content.decode()[:3000]
    image = Image.objects.get(name="trainer")
    assert image.ports == [
        {"port": 8888, "name": "JupyterLab", "app": "jupyter"},
        {"port": 8000, "name": "API"},
    ]
    assert image.env == {"HF_HOME": "/workspace/hf", "GREETING": "  hello world "}
    change = admin_client.get(f"/admin/catalog/image/{image.pk}/change/").content.decode()
    # The rows come back as fields (and three blank rows to add more), not JSON.
    assert 'name="ports-0-port" value="8888"' in change
    assert 'name="ports-1-name" value="API"' in change
    assert 'name="ports-4-port" value=""' in change and "ports-5-port" not in change
    assert 'name="env-1-value" value="  hello world "' in change
    assert "&quot;port&quot;" not in change  # no JSON textarea


def test_bad_rows_are_named_in_the_fields_errors(admin_client):
    data = form(
        **rows("ports", ("8888", "Web", ""), ("8888", "Again", ""), ("70000", "", "vnc")),
        **rows(
            "env",
            ("CUDA_VISIBLE_DEVICES", "0,1"),
            ("lower", "x"),
            ("", "orphan"),
            ("A", "1"),
            ("A", "2"),
        ),
    )
    response = admin_client.post(ADD, data)
    assert response.status_code == 200
    assert not Image.objects.filter(name="trainer").exists()
    ports = errors_of(response, "ports")
    assert "Row 2: port 8888 is already in row 1." in ports
    assert any(e.startswith("Row 3:") and "1 to 65535" in e for e in ports)
    assert any(e.startswith("Row 3:") and "the app is one of jupyter" in e for e in ports)
    assert any(e.startswith("Row 3:") and "name is 1 to 40 characters" in e for e in ports)
    env = errors_of(response, "env")
    assert any(e.startswith("Row 1: CUDA_VISIBLE_DEVICES is the platform&#x27;s") for e in env)
    assert any(e.startswith("Row 2: &#x27;lower&#x27; is not a variable name") for e in env)
    assert "Row 3: a value needs a name." in env
    assert "Row 5: A is already in row 4." in env
    # What was typed is shown again, to be corrected.
    assert 'name="ports-2-port" value="70000"' in response.content.decode()


def test_an_image_without_cuda_saves_without_a_cuda_version(admin_client, register):
    register("host-a")
    response = admin_client.post(
        ADD, form(cuda_version="", **rows("ports", ("8080", "Web", ""))), follow=True
    )
    assert response.status_code == 200
    image = Image.objects.get(name="trainer")
    assert image.cuda_version == ""
    page = response.content.decode()
    assert "was added successfully" in page and "messagelist" in page and "warning" not in page
    change = admin_client.get(f"/admin/catalog/image/{image.pk}/change/").content.decode()
    assert "No CUDA: every host runs it." in change
    bad = admin_client.post(ADD, form(name="other", cuda_version="latest"))
    assert bad.status_code == 200
    assert errors_of(bad, "cuda_version") == [
        "A CUDA version like 12.4, or empty for an image without CUDA."
    ]


def test_a_cuda_version_no_host_supports_is_warned_of(admin_client, register):
    register("host-a")  # drivers that support up to CUDA 12.4
    response = admin_client.post(ADD, form(cuda_version="12.6"), follow=True)
    page = response.content.decode()
    assert Image.objects.get(name="trainer").cuda_version == "12.6"
    assert 'class="warning"' in page
    assert "No host can run CUDA 12.6: host-a (up to CUDA 12.4)" in page
    fine = admin_client.post(
        ADD, form(name="older", cuda_version="12.1"), follow=True
    ).content.decode()
    assert 'class="warning"' not in fine
    older = Image.objects.get(name="older")
    assert (
        "Runs on host-a."
        in admin_client.get(f"/admin/catalog/image/{older.pk}/change/").content.decode()
    )


def test_some_hosts_too_old_are_named(admin_client, register):
    register("host-a")
    register("host-b", cuda_version="12.8")
    image = ImageFactory(name="new-cuda", cuda_version="12.4")
    data = form(name="new-cuda", cuda_version="12.6")
    page = admin_client.post(
        f"/admin/catalog/image/{image.pk}/change/", data, follow=True
    ).content.decode()
    assert "The drivers of host-a (up to CUDA 12.4) are older than CUDA 12.6" in page
    assert "It runs on host-b." in page


def test_a_retired_host_does_not_count(admin_client, register):
    host = register("host-a", cuda_version="12.8")
    register("host-b")
    services.set_host_status(host, "retired")
    page = admin_client.post(ADD, form(cuda_version="12.6"), follow=True).content.decode()
    assert "No host can run CUDA 12.6: host-b (up to CUDA 12.4)" in page


def test_the_command_is_a_shell_line_or_rows_of_arguments(admin_client):
    line = """sh -c 'echo start SEED=$SEED; sleep 1' --name "my run" """
    assert admin_client.post(ADD, form(**{"command-line": line})).status_code == 302
    image = Image.objects.get(name="trainer")
    assert image.command == ["sh", "-c", "echo start SEED=$SEED; sleep 1", "--name", "my run"]
    change = admin_client.get(f"/admin/catalog/image/{image.pk}/change/").content.decode()
    # Shown back as the line a shell reads as the same argv, copyable.
    shown = "sh -c &#x27;echo start SEED=$SEED; sleep 1&#x27; --name &#x27;my run&#x27;"
    assert f'name="command-line" value="{shown}"' in change
    rows = {"command-line": "", "command-0-arg": "python", "command-1-arg": "-c",
            "command-2-arg": "print(1)\nprint(2)", "command-3-arg": ""}  # fmt: skip
    response = admin_client.post(f"/admin/catalog/image/{image.pk}/change/", form(**rows))
    assert response.status_code == 302
    image.refresh_from_db()
    assert image.command == ["python", "-c", "print(1)\nprint(2)"]
    change = admin_client.get(f"/admin/catalog/image/{image.pk}/change/").content.decode()
    # An argument with a line break stays a row of its own.
    assert '<textarea name="command-2-arg"' in change and 'name="command-line" value=""' in change
    cleared = admin_client.post(
        f"/admin/catalog/image/{image.pk}/change/", form(**{"command-line": ""})
    )
    assert cleared.status_code == 302
    image.refresh_from_db()
    assert image.command == []


def test_an_unbalanced_quote_or_a_line_and_rows_are_refused_at_the_field(admin_client):
    response = admin_client.post(ADD, form(**{"command-line": "echo 'hello"}))
    assert response.status_code == 200 and not Image.objects.exists()
    assert errors_of(response, "command") == [
        "The line cannot be read as a shell would (No closing quotation): close each quote, or "
        "give the arguments as rows."
    ]
    assert 'name="command-line" value="echo &#x27;hello"' in response.content.decode()
    both = admin_client.post(ADD, form(**{"command-line": "ls", "command-0-arg": "ls"}))
    assert errors_of(both, "command") == ["Give the command as a line or as rows, not both."]
    many = admin_client.post(ADD, form(**{"command-line": "x " * 65}))
    assert errors_of(many, "command") == ["At most 64 arguments."]
