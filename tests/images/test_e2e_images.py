"""Images where they are needed, end to end: real agents with the `oci` runtime on two Podman
engines of their own storage (one host holds an image, the other does not), images of random
layers in a real registry (Debian's docker-registry), a registry mirror (docker-registry as a
pull-through cache), the real web server and Celery worker."""

import os
import re

import pytest
from celery import Celery
from django.conf import settings
from django.db import connection
from django.test import Client

from console import processes
from console.catalog.models import Image, Region
from console.fleet.images import normalize
from console.fleet.models import Host, HostEvent, HostImage
from console.instances.models import Instance
from tests.factories import ImageFactory, UserFactory
from tests.instances.e2e import api_client, make_catalog, make_tenant, start_agent, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.containers]
SLEEP = ["sleep", "1000"]


def beat(redis_url: str, task: str, *args) -> None:
    """Queue `task` on the stack's broker, as the beat (or a web process) would: under the
    stack's deployment name, which its processes take from the test database's name."""
    name = connection.settings_dict["NAME"] if connection.vendor != "sqlite" else "gpucloud"
    deployment = os.environ.get("DEPLOYMENT_NAME") or re.sub(r"[^A-Za-z0-9_.-]", "-", name)
    options = {**settings.CELERY_BROKER_TRANSPORT_OPTIONS}
    options["global_keyprefix"] = f"{deployment.lstrip('_.-')[:50]}:celery:"
    sender = Celery(broker=redis_url, broker_transport_options=options)
    sender.send_task(task, args=list(args), queue=settings.CELERY_TASK_DEFAULT_QUEUE)
    sender.close()


def launch(stack, api, name: str, image: str) -> int:
    body = {"name": name, "spec": "a100-quarter", "image": image}
    iid = api.post("/instances/", json=body).json()["id"]
    wait_for(
        lambda: api.get(f"/instances/{iid}/").json()["state"] == "running",
        timeout=90,
        what=f"{name} running",
        stack=stack,
    )
    return iid


def events(api, iid: int) -> list[str]:
    return [e["message"] for e in api.get(f"/instances/{iid}/events/").json()["results"]]


def host_of(iid: int) -> str:
    return Instance.objects.get(pk=iid).current_allocation().host.name


def holds(host: Host, reference: str) -> bool:
    return HostImage.objects.filter(host=host, reference=normalize(reference)).exists()


def pre_pull_state(host: Host, reference: str) -> dict:
    states = Host.objects.get(pk=host.pk).pre_pulls
    return next((s for s in states if s["reference"] == normalize(reference)), {})


def fleet_page(host: Host) -> str:
    operator = Client()
    operator.force_login(UserFactory(username=f"ops-{host.pk}", is_staff=True))
    return operator.get("/fleet/").content.decode()


def test_placement_prefers_the_host_that_holds_the_image_and_says_when_it_pulls(
    stack, container_engine, second_engine, push_image
):
    held, cold = push_image("held"), push_image("cold")
    assert second_engine.podman("pull", held).returncode == 0  # only gpu-b holds it
    make_catalog()
    ImageFactory(name="held", reference=held, command=SLEEP)
    ImageFactory(name="cold", reference=cold, command=SLEEP)
    _, membership = make_tenant()
    start_agent(stack, "gpu-a", gpus=2, runtime="oci", engine_url=container_engine.url)
    _, gpu_b = start_agent(stack, "gpu-b", gpus=2, runtime="oci", engine_url=second_engine.url)
    wait_for(lambda: holds(gpu_b, held), what="gpu-b's inventory with the image", stack=stack)
    api = api_client(stack, membership)

    # both hosts are empty and alike: the one that holds the image takes it, and no pull
    warm = launch(stack, api, "warm", "held")
    assert host_of(warm) == "gpu-b"
    assert not [m for m in events(api, warm) if m.lower().startswith("pull")], events(api, warm)

    # no host holds this one: the launch's events say it is pulled, and where
    fresh = launch(stack, api, "fresh", "cold")
    notes = events(api, fresh)
    said = [m for m in notes if m.startswith("Pulling ")]
    assert said == [f"Pulling {cold} on {host_of(fresh)} (not on any host that fits)"], notes
    assert [m for m in notes if m.startswith(f"pulled {cold} in ")], notes


def test_pre_pull_on_join_and_after_a_catalog_change_on_the_fleet_page_kept_by_clean_up(
    stack, redis_url, second_engine, push_image
):
    early, later, junk, used = (push_image(n) for n in ("early", "later", "junk", "used"))
    make_catalog()
    ImageFactory(name="early", reference=early, command=SLEEP, pre_pull=True)
    ImageFactory(name="later", reference=later, command=SLEEP)
    ImageFactory(name="junk", reference=junk, command=SLEEP)
    ImageFactory(name="used", reference=used, command=SLEEP)
    _, membership = make_tenant()
    _, host = start_agent(stack, "gpu-b", gpus=2, runtime="oci", engine_url=second_engine.url)

    # on join: the console hands the agent its pre-pull list, the agent pulls
    wait_for(lambda: pre_pull_state(host, early).get("state") == "pulled", timeout=60,
             what="the pre-pull at join", stack=stack)  # fmt: skip
    assert holds(host, early)
    page = fleet_page(host)
    assert re.search(rf"{re.escape(normalize(early))}</span> <span [^>]*>pulled</span>", page)

    # the catalog changes: the beat's push (the save's own is tested apart) reaches the agent
    Image.objects.filter(name="later").update(pre_pull=True)
    beat(redis_url, "console.fleet.tasks.push_due_image_settings")
    wait_for(lambda: pre_pull_state(host, later).get("state") == "pulled", timeout=60,
             what="the pre-pull after the catalog changed", stack=stack)  # fmt: skip
    assert "later" in fleet_page(host)

    # one image pulled for an instance now gone, one for a running instance
    api = api_client(stack, membership)
    gone = launch(stack, api, "gone", "junk")
    api.post(f"/instances/{gone}/terminate/")
    wait_for(lambda: Instance.objects.get(pk=gone).state == "terminated", what="terminated",
             stack=stack)  # fmt: skip
    launch(stack, api, "running", "used")
    wait_for(lambda: holds(host, junk) and holds(host, used), what="both in the inventory",
             stack=stack)  # fmt: skip

    beat(redis_url, "console.fleet.tasks.clean_up_images", host.pk, "ops")
    cleaned = wait_for(
        lambda: HostEvent.objects.filter(host=host, message__startswith="image clean-up").first(),
        what="the clean-up's event",
        stack=stack,
    )
    assert f"removed {normalize(junk)} " in cleaned.message, cleaned.message
    wait_for(lambda: not holds(host, junk), what="the inventory without it", stack=stack)
    listed = second_engine.podman("images", "--format", "{{.Repository}}:{{.Tag}}").stdout
    assert junk not in listed
    for kept in (early, later, used):  # pre-pulled, or used by a running instance
        assert kept in listed and holds(host, kept), (kept, listed)


def test_pulls_go_through_the_region_mirror_first_and_to_the_origin_when_it_fails(
    stack, redis_url, second_engine, mirror, push_image
):
    mirror_address, mirror_storage = mirror
    through, around = push_image("through"), push_image("around")
    region = make_catalog()
    Region.objects.filter(pk=region.pk).update(registry_mirror=mirror_address)
    ImageFactory(name="through", reference=through, command=SLEEP)
    ImageFactory(name="around", reference=around, command=SLEEP)
    _, membership = make_tenant()
    _, host = start_agent(stack, "gpu-b", gpus=2, runtime="oci", engine_url=second_engine.url)
    wait_for(lambda: Host.objects.get(pk=host.pk).image_settings.get("mirror") == mirror_address,
             what="the mirror handed to the agent", stack=stack)  # fmt: skip
    api = api_client(stack, membership)

    first = launch(stack, api, "first", "through")
    notes = events(api, first)
    assert [m for m in notes if m.startswith(f"pulled {through} (via mirror {mirror_address})")]
    name = through.split("/", 1)[1].split(":")[0]
    assert (mirror_storage / "docker/registry/v2/repositories" / name).is_dir()  # it cached it
    wait_for(lambda: holds(host, through), what="the original name in the inventory", stack=stack)
    mirrored_name = f"{mirror_address}/{through.split('/', 1)[1]}"
    assert not holds(host, mirrored_name)  # tagged as the original, the mirror's name gone

    # a mirror that does not answer: the pull goes to the image's own registry, and says so
    dead = f"127.0.0.1:{processes.free_port()}"  # nothing listens there
    Region.objects.filter(pk=region.pk).update(registry_mirror=dead)
    beat(redis_url, "console.fleet.tasks.push_due_image_settings")
    wait_for(lambda: Host.objects.get(pk=host.pk).image_settings.get("mirror") == dead,
             what="the new mirror handed to the agent", stack=stack)  # fmt: skip
    second = launch(stack, api, "second", "around")
    notes = events(api, second)
    assert [m for m in notes if m.startswith(f"mirror {dead} failed (")], notes
    assert [m for m in notes if m.startswith(f"pulled {around} in ")], notes
