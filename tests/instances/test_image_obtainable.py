"""A launch of an image no host of its region can obtain is refused before anything is made,
with the reason on the `image` field (the API's 400, the form's error); the API's image list
says the same of each image in a region."""

from console.fleet.models import Host, HostImage
from console.instances.models import Instance
from tests.factories import ImageFactory

UNREACHABLE = [
    {"registry": "quay.io", "reachable": False, "error": "timed out", "checked_at": 1.0},
    {"registry": "docker.io", "reachable": True, "error": "", "checked_at": 1.0},
]
SETTINGS = {"pre_pull": [], "mirror": "", "registries": ["docker.io", "quay.io"]}


def oci_host(catalog):
    host = catalog.host(gpus=1)
    Host.objects.filter(pk=host.pk).update(image_settings=SETTINGS, registry_checks=UNREACHABLE)
    return host


def test_an_image_behind_an_unreachable_registry_is_a_400_on_the_image(
    catalog, member, token_client
):
    oci_host(catalog)
    ImageFactory(name="quay-one", reference="quay.io/team/one:1")
    api = token_client(member)
    answer = api.post("/api/v1/instances/", {"spec": "a100-quarter", "image": "quay-one"},
                      format="json")  # fmt: skip
    assert answer.status_code == 400, answer.content
    (message,) = answer.json()["errors"]["image"]
    assert message.startswith(
        "quay-one cannot run in Local 1: No host of Local 1 can reach quay.io"
    )
    assert not Instance.objects.exists()


def test_a_local_image_no_host_holds_is_refused_and_one_a_host_holds_launches(
    catalog, member, token_client
):
    host = oci_host(catalog)
    ImageFactory(name="jupyter", reference="localhost/gpucloud/jupyter:latest")
    api = token_client(member)
    body = {"spec": "a100-quarter", "image": "jupyter"}
    answer = api.post("/api/v1/instances/", body, format="json")
    assert answer.status_code == 400
    assert "make images" in answer.json()["errors"]["image"][0]
    HostImage.objects.create(host=host, reference="localhost/gpucloud/jupyter:latest",
                             image_id="sha256:1", size_bytes=2_000_000_000)  # fmt: skip
    assert api.post("/api/v1/instances/", body, format="json").status_code == 202


def test_the_image_list_says_where_each_can_come_from_in_a_region(catalog, member, token_client):
    oci_host(catalog)
    ImageFactory(name="quay-one", reference="quay.io/team/one:1")
    api = token_client(member)
    listed = api.get("/api/v1/images/", {"region": "local-1"}).json()["results"]
    found = {image["name"]: image["availability"] for image in listed}
    assert found["quay-one"]["status"] == "unreachable" and not found["quay-one"]["launchable"]
    assert found[catalog.image.name]["status"] == "registry"  # docker.io: reached
    assert api.get("/api/v1/images/").json()["results"][0]["availability"] is None
    assert api.get("/api/v1/images/", {"region": "mars"}).status_code == 400


def test_the_launch_form_shows_each_images_availability_and_grays_out_what_cannot_run(catalog, web):
    import html
    import json
    import re

    host = oci_host(catalog)
    HostImage.objects.create(host=host, reference="docker.io/" + catalog.image.reference,
                             image_id="sha256:1", size_bytes=8_100_000_000)  # fmt: skip
    ImageFactory(name="quay-one", reference="quay.io/team/one:1", description="From Quay",
                 ports=[{"port": 8888, "name": "Jupyter", "app": "jupyter"},
                        {"port": 6006, "name": "TensorBoard"}])  # fmt: skip
    page = web.get("/instances/launch/").content.decode()
    options = dict(re.findall(r'<label class="image-option" data-image="([^"]+)"(.*?)</label>',
                              page, re.S))  # fmt: skip
    held, far = options[catalog.image.name], options["quay-one"]
    assert 'data-testid="image-status">on hosts<' in held and "8.1 GB" in held
    assert "Held by 1 host of Local 1 (8.1 GB)" in held
    assert re.search(r'<input type="radio" name="image" value="quay-one"[^>]* disabled>', far)
    assert "registry unreachable" in far and "No host of Local 1 can reach quay.io" in far
    assert "From Quay" in far and "Serves JupyterLab (8888) · TensorBoard (6006)" in far
    by_region = json.loads(html.unescape(re.search(r'data-availability="([^"]+)"', held)[1]))
    # where a spec would go to the host that holds the image, it starts without a pull
    assert by_region["local-1"]["cached"] == {"a100-quarter": host.name, "a100-half": host.name}
    body = {"region": "local-1", "spec": "a100-quarter", "image": catalog.image.name,
            "name": "Not A Name"}  # fmt: skip
    again = web.post("/instances/launch/", body).content.decode()  # refused: shown again
    assert f'data-testid="image-cached">on {host.name}: cached</span>' in again
    body["image"] = "quay-one"
    refused = web.post("/instances/launch/", body).content.decode()
    assert "Image: quay-one cannot run in Local 1: No host of Local 1 can reach quay.io" in (
        html.unescape(refused)
    )
    assert not Instance.objects.exists()
