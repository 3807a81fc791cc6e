"""The images make run's demo and the example catalog offer say what they are: the local ones
are built here (make run, make images), the others say they need a registry, and one that
says Jupyter serves it (a port with "app": "jupyter")."""

import tomllib
from pathlib import Path

from console.catalog import demo
from console.catalog.models import port_errors

EXAMPLE = Path(demo.__file__).parent / "examples" / "catalog.example.toml"
FIELDS = ("name", "reference", "cuda_version", "description", "command", "env", "ports")


def example_images() -> list[dict]:
    images = tomllib.loads(EXAMPLE.read_text())["images"]
    return [
        {"cuda_version": "", "command": [], "env": {}, "ports": [], **image} for image in images
    ]


def test_the_demo_and_the_example_offer_the_same_images():
    assert [dict(zip(FIELDS, image, strict=True)) for image in demo.IMAGES] == example_images()


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
        "jupyterlab"
    ]
