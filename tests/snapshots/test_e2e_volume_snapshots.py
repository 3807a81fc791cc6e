"""A volume's snapshot restored into a new volume on another host, end to end: the API, a
Celery worker, two real agents running real containers on Podman, restic writing to a
repository on this machine. Random data written into a volume on gpu-1 reads back, byte for
byte (sha256), in a container on gpu-2 from the restored volume."""

import json
import re

import pytest

from billing.usage import usage_report
from console.fleet.models import Host
from console.instances.models import Allocation
from console.snapshots.models import StoreMeasurement
from console.volumes.models import Volume
from tests.instances.e2e import wait_for, wait_state

pytestmark = [pytest.mark.integration, pytest.mark.containers, pytest.mark.timeout(400)]
WRITER = (
    "head -c 16777216 /dev/urandom > /data/data.bin && sync && sha256sum /data/data.bin; sleep 1000"
)
READER = "sha256sum /data/data.bin; sleep 1000"
SUM = re.compile(r"^([0-9a-f]{64})  /data/data.bin$")


def _set(host: Host, status: str) -> None:
    Host.objects.filter(pk=host.pk).update(admin_status=status, status=status)


def _launch(api, stack, name: str, script: str, volume: str) -> int:
    body = {"name": name, "spec": "a100-quarter", "image": "demo-busybox",
            "command": ["sh", "-c", script],
            "volumes": [{"volume": volume, "mount_path": "/data"}]}  # fmt: skip
    created = api.post("/instances/", json=body)
    assert created.status_code == 202, created.text
    iid = created.json()["id"]
    wait_state(api, iid, "running", stack, timeout=90)
    return iid


def _sum(api, iid: int, stack) -> str:
    def found():
        lines = api.get(f"/instances/{iid}/logs/", params={"tail": 50}).json()["lines"]
        return [m[1] for m in map(SUM.match, lines) if m]

    return wait_for(found, timeout=60, what="the data's sum", stack=stack)[0]


def _finished(api, url: str, stack) -> dict:
    def ended():
        shown = api.get(url).json()
        return shown if shown["state"] != "running" else None

    return wait_for(ended, timeout=120, what=url, stack=stack, interval=0.2)


def test_a_volume_snapshot_is_restored_into_a_new_volume_on_another_host(
    snapshot_store, stack, cloud
):
    api, first, second = cloud
    _set(second, Host.Status.CORDONED)
    made = api.post("/volumes/", json={"name": "data", "size_gib": 1})
    assert made.status_code == 201, made.text
    writer = _launch(api, stack, "writer", WRITER, "data")
    written = _sum(api, writer, stack)
    assert Volume.objects.get(name="data").host_id == first.pk

    # a snapshot of the volume while its instance runs, by its name
    taken = api.post("/snapshots/", json={"volume": "data"})
    assert taken.status_code == 202, taken.text
    snapshot = _finished(api, f"/snapshots/{taken.json()['id']}/", stack)
    assert snapshot["state"] == "done", snapshot
    assert snapshot["volume"] == made.json()["id"] and snapshot["source_name"] == "data"
    assert snapshot["bytes_total"] >= 16 * 1024 * 1024 and snapshot["bytes_stored"] > 0

    # restored into a new volume on gpu-2, at least the source's size
    _set(second, Host.Status.ACTIVE)
    url = f"/snapshots/{snapshot['id']}/restore/"
    assert api.post(url, json={"name": "copy", "size_gib": 0}).status_code == 400
    restore = api.post(url, json={"name": "copy", "host": "gpu-2"})
    assert restore.status_code == 202, restore.text
    done = _finished(api, f"/snapshot-restores/{restore.json()['id']}/", stack)
    assert done["state"] == "done", done
    assert done["percent"] == 100 and done["bytes_total"] >= 16 * 1024 * 1024
    copy = Volume.objects.get(name="copy")
    assert (copy.host_id, copy.size_gib) == (second.pk, 1)
    record = stack.log_dir / "agent-gpu-2" / "disks" / copy.disk_name / "disk.json"
    assert json.loads(record.read_text())["instance"] == f"volume-{copy.pk}"

    # an instance on gpu-2 reads the same bytes from it
    _set(first, Host.Status.CORDONED)
    reader = _launch(api, stack, "reader", READER, "copy")
    assert Allocation.objects.filter(instance_id=reader, host=second).exists()
    assert _sum(api, reader, stack) == written

    # the tenant's snapshot store is on the bill, and the snapshot, alone in it, holds it all
    tenant = copy.tenant
    lines = usage_report(tenant, copy.created_at.date().replace(day=1)).lines
    store = [line for line in lines if line.kind == "snapshot"]
    assert [line.instance_name for line in store] == ["snapshot store"], lines
    shown = api.get(f"/snapshots/{snapshot['id']}/").json()
    assert (shown["bytes_unique"], shown["bytes_shared"]) == (
        StoreMeasurement.objects.get(tenant=tenant).bytes, 0,
    )  # fmt: skip


KEEPER = (
    "test -f /data/data.bin || head -c 16777216 /dev/urandom > /data/data.bin; sync; "
    "sha256sum /data/data.bin; sleep 1000"
)


def test_a_shelved_instance_takes_its_volume_to_the_other_host(snapshot_store, stack, cloud):
    api, first, second = cloud
    _set(second, Host.Status.CORDONED)
    made = api.post("/volumes/", json={"name": "data", "size_gib": 1})
    assert made.status_code == 201, made.text
    iid = _launch(api, stack, "keeper", KEEPER, "data")
    written = _sum(api, iid, stack)
    volume = Volume.objects.get(name="data")
    assert volume.host_id == first.pk

    assert api.post(f"/instances/{iid}/stop/").status_code == 202
    wait_state(api, iid, "stopped", stack, timeout=60)
    shelved = api.post(f"/instances/{iid}/shelve/")
    assert shelved.status_code == 202, shelved.text
    wait_for(
        lambda: api.get(f"/instances/{iid}/shelve/").json().get("state") == "shelved",
        timeout=120, what="shelved", stack=stack, interval=0.2,
    )  # fmt: skip
    folder = stack.log_dir / "agent-gpu-1" / "disks" / volume.disk_name
    wait_for(lambda: not folder.exists(), what="the volume's disk gone from gpu-1", stack=stack)
    assert Volume.objects.get(pk=volume.pk).host_id is None
    refused = api.post(f"/volumes/{volume.pk}/detach/")
    assert refused.status_code == 409 and refused.json()["code"] == "instance_shelved"

    # started: placed on gpu-2, where its disk and its volume are restored first
    _set(first, Host.Status.CORDONED)
    _set(second, Host.Status.ACTIVE)
    assert api.post(f"/instances/{iid}/start/").status_code == 202
    wait_state(api, iid, "running", stack, timeout=180)
    assert Volume.objects.get(pk=volume.pk).host_id == second.pk
    assert Allocation.objects.filter(instance_id=iid, host=second).exists()
    assert _sum(api, iid, stack) == written
    events = [e["message"] for e in api.get(f"/instances/{iid}/events/").json()["results"]]
    assert any("volume data from" in m for m in events), events
    assert api.get(f"/instances/{iid}/shelve/").status_code == 404
