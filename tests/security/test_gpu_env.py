"""The environment names the driver, the NVIDIA container toolkit, CUDA's MPS and the agent read
are the platform's: a tenant cannot name them at launch (API 400 on `env`, the form's error on
its field), an operator cannot put them in an image, and the agent refuses them too.

Names are case-sensitive (Linux, the toolkit and CUDA read them as written): the console's names
are upper case only, so `nvidia_visible_devices` is refused as no variable name there; the agent,
which takes any name, refuses exactly the names that something reads."""

from pathlib import Path

import pytest
from django.core.exceptions import ValidationError
from django.test import Client

from agent.allocations import parse_spec
from agent.errors import ApiError
from console.catalog import apply, demo
from console.catalog.models import Image, env_errors
from console.instances import queue
from console.instances.models import Instance

RESERVED = [
    "NVIDIA_VISIBLE_DEVICES",
    "NVIDIA_DRIVER_CAPABILITIES",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_MPS_PIPE_DIRECTORY",
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
    "GPUCLOUD_ALLOCATION_ID",
    "GPUCLOUD_CDI_DEVICES",
]
# a tenant's own CUDA settings, and names that only contain a reserved word
ALLOWED = {"CUDA_LAUNCH_BLOCKING": "1", "CUDA_MODULE_LOADING": "LAZY", "MY_NVIDIA_HOME": "/x",
           "CUDA_VISIBLE_DEVICES_NOTE": "mine"}  # fmt: skip


@pytest.fixture(autouse=True)
def _no_tasks(monkeypatch):
    monkeypatch.setattr(queue, "enqueue", lambda *args: None)


def _launch(client, env):
    body = {"name": "trainer", "spec": "a100-quarter", "image": "pytorch-2.5-cuda12.4", "env": env}
    return client.post("/api/v1/instances/", body, format="json")


@pytest.mark.parametrize("name", RESERVED)
def test_the_api_refuses_the_platforms_names_on_env(catalog, member, token_client, name):
    catalog.host()
    response = _launch(token_client(member), {"SEED": "7", name: "all"})
    assert response.status_code == 400, response.json()
    assert list(response.json()["errors"]) == ["env"]
    assert f"{name} is the platform's" in response.json()["errors"]["env"][0]
    assert not Instance.objects.exists()


@pytest.mark.parametrize("name", ["nvidia_visible_devices", "Nvidia_Visible_Devices"])
def test_other_cases_are_no_variable_names_to_the_console(catalog, member, token_client, name):
    catalog.host()
    response = _launch(token_client(member), {name: "all"})
    assert response.status_code == 400
    assert "is not a variable name" in response.json()["errors"]["env"][0]


def test_a_tenants_own_cuda_settings_pass(catalog, member, token_client):
    catalog.host()
    response = _launch(token_client(member), ALLOWED)
    assert response.status_code == 202, response.json()
    assert response.json()["env"] == ALLOWED


def test_the_launch_form_says_it_on_the_env_field(catalog, member):
    catalog.host()
    web = Client()
    web.force_login(member.user)
    body = {"region": "local-1", "spec": "a100-quarter", "image": catalog.image.name,
            "name": "nb", "env": "SEED=7\r\nNVIDIA_VISIBLE_DEVICES=all\r\n"}  # fmt: skip
    response = web.post("/instances/launch/", body)
    assert response.status_code == 200
    errors = response.context["form"].errors
    assert list(errors) == ["env"]
    assert "NVIDIA_VISIBLE_DEVICES is the platform's" in errors["env"][0]
    assert "NVIDIA_VISIBLE_DEVICES is the platform&#x27;s" in response.content.decode()
    assert not Instance.objects.exists()


def test_an_image_cannot_set_them(db):
    image = Image(name="x", reference="docker.io/library/python:3.12", cuda_version="12.4")
    image.env = {"NVIDIA_DRIVER_CAPABILITIES": "all", "HF_HOME": "/workspace/hf"}
    with pytest.raises(ValidationError) as error:
        image.full_clean()
    assert list(error.value.message_dict) == ["env"]


def test_the_shipped_catalogs_images_set_none():
    example = Path(apply.__file__).parent / "examples" / "catalog.example.toml"
    images = apply.load(example)["images"]
    envs = [image.get("env", {}) for image in images] + [image[5] for image in demo.IMAGES]
    assert len(envs) == len(images) + len(demo.IMAGES) > 5
    assert [problem for env in envs for problem in env_errors(env)] == []


GPUS = [{"index": 0, "model": "a100-80gb"}]


@pytest.mark.parametrize("name", RESERVED)
def test_the_agent_refuses_them_too(name):
    with pytest.raises(ApiError) as error:
        parse_spec({"mode": "whole", "gpus": [0], "env": {"SEED": "7", name: "all"}}, GPUS)
    assert (error.value.status, error.value.code) == (400, "reserved_env")
    assert name in error.value.detail


def test_the_agent_takes_what_nothing_of_the_platform_reads():
    env = {**ALLOWED, "nvidia_visible_devices": "all"}  # another variable: nothing reads it
    assert parse_spec({"mode": "whole", "gpus": [0], "env": env}, GPUS)["env"] == env
