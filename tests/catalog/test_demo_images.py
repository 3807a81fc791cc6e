"""The images make run's demo and the example catalog offer say what they are: the demo offers
only the local ones, built here (make run, make images); the example adds real-world ones that
say they need a registry; one that says Jupyter serves it (a port with "app": "jupyter")."""

import tomllib
from pathlib import Path

import pytest

from console.catalog import demo
from console.catalog.models import Image, port_errors

EXAMPLE = Path(demo.__file__).parent / "examples" / "catalog.example.toml"
FIELDS = ("name", "reference", "cuda_version", "description", "command", "env", "ports")


def example_images() -> list[dict]:
    images = tomllib.loads(EXAMPLE.read_text())["images"]
    return [
        {"cuda_version": "", "command": [], "env": {}, "ports": [], **image} for image in images
    ]


def test_the_example_offers_the_demos_images_first():
    demos = [dict(zip(FIELDS, image, strict=True)) for image in demo.IMAGES]
    assert example_images()[: len(demos)] == demos
    assert all(image["reference"].startswith("localhost/gpucloud/") for image in demos)


def test_each_image_works_offline_or_says_it_needs_a_registry():
    for image in example_images():
        local = image["reference"].startswith("localhost/gpucloud/")
        assert local or "needs a registry" in image["description"], image["name"]
        assert not port_errors(image["ports"])


def test_an_image_that_says_jupyter_serves_it():
    for image in example_images():
        says = "jupyter" in (image["description"] + str(image["ports"])).lower()
        serves = any(port.get("app") == "jupyter" for port in image["ports"])
        assert says == serves, image["name"]
    assert [i["name"] for i in example_images() if "make images" in i["description"]] == [
        "jupyterlab",
        "pytorch",
    ]


@pytest.mark.django_db
def test_seeding_again_retires_the_registry_images_an_earlier_demo_offered():
    old = Image.objects.create(
        name="pytorch-2.5-cuda12.4", reference=demo.RETIRED_IMAGES["pytorch-2.5-cuda12.4"]
    )
    moved = Image.objects.create(name="vllm-0.6-cuda12.4", reference="mirror.lab/vllm:v0.6.6")
    demo.load_catalog()
    demo.load_catalog()
    old.refresh_from_db()
    moved.refresh_from_db()
    assert not old.active  # kept for the instances that use it, no longer offered
    assert moved.active  # the operator's own
    offered = Image.objects.filter(active=True).exclude(pk=moved.pk)
    assert sorted(offered.values_list("name", flat=True)) == [
        "demo-busybox",
        "jupyterlab",
        "pytorch",
    ]
