"""Volumes end to end: the API, a Celery worker, a real agent running real containers on
Podman. Data written to a volume outlives its instance and is read from another one; a write
past its size fails inside the container; an instance's kept disk is a volume with its data;
an attached volume is not deleted; the quota, another tenant and a viewer are refused."""

import pytest

from accounts.models import Quota
from accounts.roles import Role
from agent.devtools.engine import DEMO_IMAGE
from console.volumes.models import Volume
from tests.factories import ImageFactory, MembershipFactory, UserFactory
from tests.instances.e2e import (
    api_client,
    make_catalog,
    make_tenant,
    start_agent,
    wait_for,
    wait_state,
)

pytestmark = [pytest.mark.integration, pytest.mark.containers, pytest.mark.timeout(300)]


@pytest.fixture
def cloud(stack, container_engine):
    make_catalog()
    ImageFactory(name="demo-busybox", reference=DEMO_IMAGE, command=[], cuda_version="-")
    _, membership = make_tenant()
    host = start_agent(stack, "gpu-1", gpus=2, runtime="oci", engine_url=container_engine.url)[1]
    return api_client(stack, membership), host


def _refusals(api, stack, vid: int) -> None:
    """Past the storage quota, another tenant, a viewer: each refused, through the stack."""
    tenant = Volume.objects.get(pk=vid).tenant
    Quota.objects.filter(tenant=tenant).update(storage_quota_gib=5)
    over = api.post("/volumes/", json={"name": "more", "size_gib": 5})
    assert over.status_code == 400 and "size_gib" in over.json()["errors"]
    Quota.objects.filter(tenant=tenant).update(storage_quota_gib=500)
    _, theirs = make_tenant(slug="globex", username="eve")
    foreign = api_client(stack, theirs)
    assert foreign.get(f"/volumes/{vid}/").status_code == 404
    assert foreign.post(f"/volumes/{vid}/attach/", json={"instance": 1}).status_code == 404
    body = {"name": "thief", "spec": "a100-quarter", "image": "demo-busybox",
            "volumes": [{"volume": str(vid), "mount_path": "/data"}]}  # fmt: skip
    assert foreign.post("/instances/", json=body).status_code == 400
    viewer = MembershipFactory(user=UserFactory(username="vic"), tenant=tenant, role=Role.VIEWER)
    as_viewer = api_client(stack, viewer)
    assert as_viewer.get(f"/volumes/{vid}/").status_code == 200
    assert as_viewer.delete(f"/volumes/{vid}/").status_code == 403
    assert as_viewer.post("/volumes/", json={"name": "v", "size_gib": 1}).status_code == 403


def _launch(api, stack, name: str, script: str, volumes: list) -> int:
    body = {"name": name, "spec": "a100-quarter", "image": "demo-busybox",
            "command": ["sh", "-c", script], "volumes": volumes}  # fmt: skip
    created = api.post("/instances/", json=body)
    assert created.status_code == 202, created.text
    iid = created.json()["id"]
    wait_state(api, iid, "running", stack, timeout=60)
    return iid


def _said(api, iid: int, text: str, stack) -> list[str]:
    def lines():
        found = api.get(f"/instances/{iid}/logs/", params={"tail": 50}).json()["lines"]
        return found if any(text in line for line in found) else None

    return wait_for(lines, timeout=30, what=f"{text!r} in the output", stack=stack)


def test_a_volume_outlives_its_instance_and_is_read_from_another(stack, cloud):
    api, host = cloud
    made = api.post("/volumes/", json={"name": "data", "size_gib": 1})
    assert made.status_code == 201, made.text
    vid = made.json()["id"]
    assert made.json()["price_per_month"] == "0.10"
    _refusals(api, stack, vid)

    writer = _launch(
        api, stack, "writer",
        "echo hello-volume > /data/note && "
        "(dd if=/dev/zero of=/data/big bs=1M count=2000 2>/dev/null && echo WROTE-ALL "
        "|| echo NO-SPACE); sleep 1000",
        [{"volume": "data", "mount_path": "/data"}],
    )  # fmt: skip
    _said(api, writer, "NO-SPACE", stack)  # 2000 MiB do not fit in 1 GiB
    assert Volume.objects.get(pk=vid).host_id == host.pk
    assert api.delete(f"/volumes/{vid}/").status_code == 409  # attached

    assert api.post(f"/instances/{writer}/terminate/").status_code == 202
    wait_state(api, writer, "terminated", stack, timeout=60)
    assert api.get(f"/volumes/{vid}/").json()["state"] == "available"

    reader = _launch(
        api, stack, "reader", "echo kept-data > /workspace/k; cat /data/note; sleep 1000",
        [{"volume": str(vid), "mount_path": "/data"}],
    )  # fmt: skip
    _said(api, reader, "hello-volume", stack)

    # its own disk kept at terminate: a volume with its data, for the next instance
    assert api.post(f"/instances/{reader}/stop/").status_code == 202
    wait_state(api, reader, "stopped", stack, timeout=60)
    assert api.post(f"/volumes/{vid}/detach/").status_code == 200
    kept = api.post(f"/instances/{reader}/terminate/", json={"keep_disk": True})
    assert kept.status_code == 202, kept.text
    wait_state(api, reader, "terminated", stack, timeout=60)
    disk = Volume.objects.get(kept_from_id=reader)
    assert disk.name == "reader-disk"
    heir = _launch(
        api,
        stack,
        "heir",
        "cat /old/k; sleep 1000",
        [{"volume": "reader-disk", "mount_path": "/old"}],
    )
    _said(api, heir, "kept-data", stack)

    assert api.delete(f"/volumes/{vid}/").status_code == 204
    folder = stack.log_dir / "agent-gpu-1" / "disks" / Volume.objects.get(pk=vid).disk_name
    wait_for(lambda: not folder.exists(), what="the deleted volume's disk gone", stack=stack)
