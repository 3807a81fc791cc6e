"""Snapshots and shelving end to end: the API, a Celery worker (and beat), two real agents
running real containers on Podman, restic writing to a repository on this machine."""

import json
import math
import os
import re
import subprocess
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from billing.rating import seconds_in_month
from billing.usage import usage_report
from console import processes
from console.fleet.models import Host
from console.instances.models import Instance
from console.snapshots import store as stores
from console.snapshots.models import Schedule, Shelf, Snapshot, StoreMeasurement
from tests.instances.e2e import wait_for, wait_state
from tests.snapshots.conftest import SNAPSHOT_MASTER_SECRET

pytestmark = [pytest.mark.integration, pytest.mark.containers, pytest.mark.timeout(400)]
# 32 MiB of random data written once to the disk, and its sha256 printed at every start
KEEPER = (
    "test -f /workspace/data.bin || head -c 33554432 /dev/urandom > /workspace/data.bin; "
    "sha256sum /workspace/data.bin; sleep 1000"
)
SUM = re.compile(r"^([0-9a-f]{64})  /workspace/data.bin$")


def _sums(api, iid: int) -> list[str]:
    lines = api.get(f"/instances/{iid}/logs/", params={"tail": 50}).json()["lines"]
    return [m[1] for m in map(SUM.match, lines) if m]


def _launch(api, stack, name: str) -> int:
    body = {"name": name, "spec": "a100-quarter", "image": "demo-busybox",
            "command": ["sh", "-c", KEEPER]}  # fmt: skip
    created = api.post("/instances/", json=body)
    assert created.status_code == 202, created.text
    iid = created.json()["id"]
    wait_state(api, iid, "running", stack, timeout=60)
    return iid


def _cordon(host: Host) -> None:
    Host.objects.filter(pk=host.pk).update(
        admin_status=Host.Status.CORDONED, status=Host.Status.CORDONED
    )


def _wait_snapshot(api, sid: int, stack, seen: list | None = None) -> dict:
    def done():
        shown = api.get(f"/snapshots/{sid}/").json()
        if seen is not None:
            seen.append(shown)
        return shown if shown["state"] != "running" else None

    return wait_for(done, timeout=90, what=f"snapshot {sid}", stack=stack, interval=0.2)


def test_a_shelved_instance_restarts_on_the_other_host_with_its_data(snapshot_store, stack, cloud):
    api, first, second = cloud
    _cordon(second)
    iid = _launch(api, stack, "keeper")
    instance = Instance.objects.get(pk=iid)
    assert instance.disk_host_id == first.pk
    written = wait_for(lambda: _sums(api, iid), what="the data's sum", stack=stack)[0]

    # a snapshot while it runs: crash-consistent, with its progress to the end
    taken = api.post("/snapshots/", json={"instance": iid})
    assert taken.status_code == 202, taken.text
    assert taken.json()["state"] == "running"
    seen: list = []
    snapshot = _wait_snapshot(api, taken.json()["id"], stack, seen)
    assert snapshot["state"] == "done", snapshot
    assert snapshot["bytes_done"] == snapshot["bytes_total"] >= 32 * 1024 * 1024
    assert snapshot["percent"] == 100 and snapshot["bytes_stored"] > 0
    assert snapshot["source_name"] == "keeper" and "host" not in snapshot  # tenants see none
    assert Snapshot.objects.get(pk=snapshot["id"]).host_id == first.pk
    store = stores.for_snapshot(Snapshot.objects.get(pk=snapshot["id"]))
    secrets = (store["repository"], store["password"], SNAPSHOT_MASTER_SECRET)
    assert not [secret for secret in secrets if secret in str(seen)]

    # shelve: refused while it runs, then its disk leaves gpu-1
    refused = api.post(f"/instances/{iid}/shelve/")
    assert refused.status_code == 409, refused.text
    assert api.post(f"/instances/{iid}/stop/").status_code == 202
    before = wait_state(api, iid, "stopped", stack)
    shelved = api.post(f"/instances/{iid}/shelve/")
    assert shelved.status_code == 202, shelved.text
    assert shelved.json()["state"] == "shelving"
    wait_for(
        lambda: Shelf.objects.filter(instance_id=iid, state=Shelf.State.SHELVED).exists(),
        timeout=90, what="shelved", stack=stack,
    )  # fmt: skip
    disk = stack.log_dir / "agent-gpu-1" / "disks" / instance.disk_name
    wait_for(lambda: not disk.exists(), what="its disk gone from gpu-1", stack=stack)
    assert Instance.objects.get(pk=iid).disk_host_id is None
    assert api.post(f"/instances/{iid}/shelve/").status_code == 409  # shelved already

    # start: gpu-1 takes nothing new, so it is placed on gpu-2, where its disk is restored
    _cordon(first)
    Host.objects.filter(pk=second.pk).update(
        admin_status=Host.Status.ACTIVE, status=Host.Status.ACTIVE
    )
    assert api.post(f"/instances/{iid}/start/").status_code == 202
    after = wait_state(api, iid, "running", stack, timeout=120)
    assert Instance.objects.get(pk=iid).disk_host_id == second.pk
    wait_for(lambda: len(_sums(api, iid)) >= 1, what="the sum on gpu-2", stack=stack)
    assert _sums(api, iid)[-1] == written  # the same bytes, read inside the new container
    assert (after["id"], after["name"], after["env"]) == (
        before["id"],
        before["name"],
        before["env"],
    )
    assert [p["url"] for p in after["ports"]] == [p["url"] for p in before["ports"]]
    assert after["ssh"]["user"] == str(iid)
    assert not Shelf.objects.filter(instance_id=iid).exists()
    events = [e["message"] for e in api.get(f"/instances/{iid}/events/").json()["results"]]
    assert any(m.startswith("Unshelving: restoring its disk") for m in events), events
    assert any(m == "Unshelved: its disk was restored on gpu-2" for m in events), events
    # the shelve's snapshot went with the unshelve; the one taken on demand stays
    assert [s["id"] for s in api.get("/snapshots/").json()["results"]] == [snapshot["id"]]

    # the tenant's repository is billed to the second, for what each measurement said it held
    # (after the first backup, the shelve's, and the prune of the shelve's snapshot), from the
    # first until now; the kept snapshot shows its share of it
    kept = Snapshot.objects.get(pk=snapshot["id"])
    of_tenant = StoreMeasurement.objects.filter(tenant=kept.tenant).order_by("measured_at", "pk")
    wait_for(lambda: of_tenant.count() == 3, what="the prune's measurement", stack=stack)
    measured = list(of_tenant)
    assert all(m.bytes > 0 for m in measured)
    now = timezone.now()
    report = usage_report(kept.tenant, now.date().replace(day=1), now)
    store = [line for line in report.lines if line.kind == "snapshot"]
    assert {line.snapshot_id for line in store} == {0}  # the store's lines, none per snapshot
    if measured[0].measured_at.month == now.month:
        held = math.ceil((now - measured[0].measured_at).total_seconds())
        assert sum(line.seconds for line in store) == held
    for line in store:  # each a size held, over one or more measurements' time
        cost = Decimal(line.disk_gib) * kept.price_per_gib_month * line.seconds
        assert abs(line.amount - cost / seconds_in_month(now)) <= Decimal("0.000002")
    wait_for(lambda: api.get(f"/snapshots/{kept.pk}/").json()["bytes_unique"], stack=stack,
             what="its share")  # fmt: skip
    shown = api.get(f"/snapshots/{kept.pk}/").json()
    assert shown["bytes_unique"] + shown["bytes_shared"] > 0
    assert shown["bytes_unique"] == measured[-1].bytes  # alone in the repository now


def test_a_schedule_keeps_the_newest_n(snapshot_store, stack, cloud):
    api, _, _ = cloud
    iid = _launch(api, stack, "scheduled")
    made = api.post("/snapshot-schedules/", json={"instance": iid, "every_hours": 1, "keep": 2})
    assert made.status_code == 201, made.text
    stack.start("beat", processes.beat_cmd(stack.log_dir), SNAPSHOT_SCHEDULES_SECONDS="1")
    taken = []
    for run in range(3):
        if run:  # an hour later, as far as the schedule is concerned
            Schedule.objects.filter(instance_id=iid).update(
                last_run_at=timezone.now() - timedelta(hours=2)
            )
        taken.append(
            wait_for(
                lambda: (
                    Snapshot.objects.filter(kind="scheduled", state="done")
                    .exclude(pk__in=[s.pk for s in taken])
                    .first()
                ),
                timeout=90,
                what=f"scheduled snapshot {run + 1}",
                stack=stack,
            )  # fmt: skip
        )
    oldest = taken[0]
    wait_for(
        lambda: Snapshot.objects.filter(pk=oldest.pk, forgotten=True).exists(),
        timeout=90, what="the oldest forgotten", stack=stack,
    )  # fmt: skip
    kept = [s["id"] for s in api.get("/snapshots/").json()["results"]]
    assert kept == [taken[2].pk, taken[1].pk]
    store = stores.for_snapshot(oldest)  # the tenant's own repository
    in_store = subprocess.run(
        ["restic", "snapshots", "--json"], capture_output=True, text=True, check=True,
        env={**os.environ, "RESTIC_REPOSITORY": store["repository"],
             "RESTIC_PASSWORD": store["password"]},
    )  # fmt: skip
    restic_ids = {s["id"] for s in json.loads(in_store.stdout)}
    assert restic_ids == {taken[1].restic_id, taken[2].restic_id}
