"""Whether a region can obtain an image, from what its agents find, end to end: a real agent
with the `oci` runtime on Podman checks the registries of the catalog's images (a real
registry, Debian's docker-registry, and an address where none listens), reports them in its
inventory, and the API shows the image behind the unreachable one as unavailable and refuses
its launch on the field."""

import pytest

from console import processes
from console.fleet.models import Host
from tests.factories import ImageFactory
from tests.instances.e2e import api_client, make_catalog, make_tenant, start_agent, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.containers]
SLEEP = ["sleep", "1000"]


def test_an_unreachable_registry_is_reported_by_the_agent_and_its_image_is_unavailable(
    stack, container_engine, registry, push_image
):
    near = push_image("near")
    nowhere = f"127.0.0.1:{processes.free_port()}"  # nothing listens there
    make_catalog()
    ImageFactory(name="near", reference=near, command=SLEEP)
    ImageFactory(name="far", reference=f"{nowhere}/team/far:1", command=SLEEP)
    _, membership = make_tenant()
    _, host = start_agent(stack, "gpu-1", runtime="oci", engine_url=container_engine.url)

    def checked():
        checks = {c["registry"]: c for c in Host.objects.get(pk=host.pk).registry_checks}
        return checks if {registry, nowhere} <= set(checks) else None

    checks = wait_for(checked, timeout=60, what="the agent's registry checks", stack=stack)
    assert checks[registry]["reachable"] and checks[registry]["error"] == ""
    assert not checks[nowhere]["reachable"]
    assert "Connection refused" in checks[nowhere]["error"]

    api = api_client(stack, membership)
    listed = api.get("/images/", params={"region": "local-1"}).json()["results"]
    found = {image["name"]: image["availability"] for image in listed}
    assert found["near"]["status"] == "registry" and found["near"]["launchable"]
    assert found["far"]["status"] == "unreachable" and not found["far"]["launchable"]
    assert f"can reach {nowhere}" in found["far"]["detail"]
    assert "Connection refused" in found["far"]["detail"]

    refused = api.post("/instances/", json={"spec": "a100-quarter", "image": "far"})
    assert refused.status_code == 400
    assert refused.json()["errors"]["image"][0].startswith("far cannot run in Local 1: ")
    launched = api.post("/instances/", json={"spec": "a100-quarter", "image": "near"})
    assert launched.status_code == 202, launched.text
