"""The rule of which image references a tenant may launch in a region
(console/catalog/registries.py): the form, the API and the launch all ask it."""

import pytest

from console.catalog import registries
from console.catalog.models import Region


def region(**fields) -> Region:
    return Region(code="local-1", name="Local 1", **fields)


@pytest.mark.parametrize(
    "reference, registry",
    [
        ("ghcr.io/x/y:1", "ghcr.io"),
        ("127.0.0.1:5000/x/y", "127.0.0.1:5000"),
        ("localhost/gpucloud/jupyter", "localhost"),
        ("ubuntu", ""),
        ("team/app:1", ""),
        ("Quay.IO/x/y", "quay.io"),
    ],
)
def test_registry_of(reference, registry):
    assert registries.registry_of(reference) == registry


def test_any_registry_by_default():
    assert registries.refusal("registry.example.com/team/app:1", region()) is None


def test_an_allowed_list_names_the_rule():
    rules = region(allowed_registries=["ghcr.io", "quay.io"])
    assert registries.refusal("ghcr.io/team/app:1", rules) is None
    assert registries.refusal("registry.example.com/team/app:1", rules) == (
        "registry.example.com is not among the registries region local-1 allows: ghcr.io, quay.io."
    )


def test_the_mirror_is_always_allowed():
    rules = region(allowed_registries=["ghcr.io"], registry_mirror="127.0.0.1:5001")
    assert registries.refusal("127.0.0.1:5001/team/app:1", rules) is None
    assert "ghcr.io, 127.0.0.1:5001" in registries.refusal("docker.io/library/ubuntu", rules)


def test_a_region_may_refuse_tenant_images():
    refusal = registries.refusal("ghcr.io/team/app:1", region(tenant_images=False))
    assert refusal == "Region local-1 runs only the catalog's images: choose one of those."


@pytest.mark.parametrize("reference", ["localhost/gpucloud/jupyter:latest", "ubuntu", "team/app"])
def test_the_hosts_own_images_are_the_operators(reference):
    refusal = registries.refusal(reference, region())
    assert refusal is not None and "only the operator's catalog runs" in refusal


@pytest.mark.parametrize(
    "reference",
    [
        "",
        "ghcr.io/x/" + "a" * 300,
        "ghcr.io/x/y:1 ; rm -rf /",
        "https://ghcr.io/x/y",
        "ghcr.io/X/Y",
        "ghcr.io/x/y:tag\n",
        "ghcr.io/x/y\x00",
        "-ghcr.io/x",
        "ghcr.io/x/y@sha256:zz",
        "ghcr.io/../etc/passwd",
    ],
)
def test_hostile_references_are_refused(reference):
    assert registries.refusal(reference, region()) is not None


def test_pinned_runs_the_repository_at_its_digest():
    digest = "sha256:" + "a" * 64
    assert registries.pinned("127.0.0.1:5000/team/app:1", digest) == (
        f"127.0.0.1:5000/team/app@{digest}"
    )
    assert registries.pinned("ghcr.io/team/app", "") == "ghcr.io/team/app"


def test_region_clean_checks_the_list():
    with pytest.raises(Exception, match="host"):
        region(allowed_registries=["https://ghcr.io"]).clean()
    region(allowed_registries=["ghcr.io", "127.0.0.1:5000"]).clean()
