"""REST API of snapshots, schedules and shelve: who may do what, bad input, states; and what
snapshot storage costs. The agents' side is the end-to-end tests'."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from accounts.roles import Role
from billing.usage import usage_report
from console.instances.models import State
from console.snapshots import services
from console.snapshots.models import Restore, Shelf, Snapshot
from tests.instances.helpers import make_instance

pytestmark = pytest.mark.usefixtures("no_tasks")
URL = "/api/v1/snapshots/"


@pytest.fixture
def client(member, token_client):
    return token_client(member)


@pytest.fixture
def host(catalog):
    return catalog.host(gpus=1)


@pytest.fixture
def stopped(catalog, tenant, host):
    return make_instance(catalog, tenant, state=State.STOPPED, name="keeper", disk_host=host)


def done_snapshot(instance, **fields) -> Snapshot:
    now = timezone.now()
    values = {"state": Snapshot.State.DONE, "finished_at": now, "restic_id": "ab" * 32,
              "bytes_stored": 1024**3, "bytes_total": 1024**3, **fields}  # fmt: skip
    return Snapshot.objects.create(
        tenant_id=instance.tenant_id, region_id=instance.region_id, instance=instance,
        source_name=instance.name, disk_name=instance.disk_name, size_gib=10,
        host_id=instance.disk_host_id, **values,
    )  # fmt: skip


def test_a_snapshot_is_taken_and_listed(client, stopped, no_tasks):
    made = client.post(URL, {"instance": stopped.pk}, format="json")
    assert made.status_code == 202, made.content
    shown = made.json()
    assert shown["state"] == "running" and shown["source_name"] == "keeper"
    assert "host" not in shown and "restic_id" not in shown
    snapshot = Snapshot.objects.get(pk=shown["id"])
    assert snapshot.price_per_gib_month == stopped.region.snapshot_price_per_gib_month
    assert [s["id"] for s in client.get(URL).json()["results"]] == [shown["id"]]


@pytest.mark.parametrize(
    ("body", "field"),
    [({}, "instance"), ({"instance": "x"}, "instance"), ({"instance": 999999}, "instance")],
)
def test_bad_input_is_a_field_error(client, stopped, body, field):
    answer = client.post(URL, body, format="json")
    assert answer.status_code == 400, answer.content
    assert field in answer.json()["errors"]


def test_an_instance_that_never_ran_has_nothing_to_snapshot(client, catalog, tenant):
    fresh = make_instance(catalog, tenant, state=State.PENDING, name="fresh")
    answer = client.post(URL, {"instance": fresh.pk}, format="json")
    assert answer.status_code == 409
    assert "never ran" in answer.json()["detail"]


def test_a_viewer_reads_but_changes_nothing(stopped, tenant, make_member, token_client):
    viewer = token_client(make_member(tenant, Role.VIEWER, username="vic"))
    snapshot = done_snapshot(stopped)
    assert viewer.get(URL).status_code == 200
    assert viewer.post(URL, {"instance": stopped.pk}, format="json").status_code == 403
    assert viewer.delete(f"{URL}{snapshot.pk}/").status_code == 403
    assert viewer.post(f"/api/v1/instances/{stopped.pk}/shelve/").status_code == 403
    assert Snapshot.objects.count() == 1 and not Shelf.objects.exists()


def test_delete_stops_the_billing_and_forgets_it_once(client, stopped, no_tasks):
    snapshot = done_snapshot(stopped)
    assert client.delete(f"{URL}{snapshot.pk}/").status_code == 204
    assert Snapshot.objects.get(pk=snapshot.pk).deleted_at is not None
    assert client.delete(f"{URL}{snapshot.pk}/").status_code == 404
    assert client.get(URL).json()["results"] == []


def test_shelve_needs_a_stopped_instance_and_happens_once(client, catalog, tenant, stopped, host):
    running = make_instance(catalog, tenant, state=State.RUNNING, name="busy", disk_host=host)
    answer = client.post(f"/api/v1/instances/{running.pk}/shelve/")
    assert answer.status_code == 409 and "stopped" in answer.json()["detail"]
    shelved = client.post(f"/api/v1/instances/{stopped.pk}/shelve/")
    assert shelved.status_code == 202, shelved.content
    assert shelved.json()["state"] == "shelving"
    assert client.post(f"/api/v1/instances/{stopped.pk}/shelve/").status_code == 409
    shelve = Snapshot.objects.get(shelf__instance=stopped)
    assert shelve.kind == "shelve"
    Snapshot.objects.filter(pk=shelve.pk).update(state="done")
    refused = client.delete(f"{URL}{shelve.pk}/")
    assert refused.status_code == 409 and refused.json()["code"] == "snapshot_shelved"


@pytest.mark.parametrize(
    ("body", "field"),
    [({"every_hours": 0, "keep": 1}, "every_hours"), ({"every_hours": 1, "keep": 0}, "keep"),
     ({"every_hours": 1}, "keep"), ({"every_hours": "often", "keep": 1}, "every_hours")],
)  # fmt: skip
def test_schedule_bad_input_is_a_field_error(client, stopped, body, field):
    answer = client.post("/api/v1/snapshot-schedules/", {"instance": stopped.pk, **body})
    assert answer.status_code == 400, answer.content
    assert field in answer.json()["errors"]


def test_a_schedule_is_one_per_instance(client, stopped):
    url = "/api/v1/snapshot-schedules/"
    assert (
        client.post(url, {"instance": stopped.pk, "every_hours": 6, "keep": 3}).status_code == 201
    )
    assert (
        client.post(url, {"instance": stopped.pk, "every_hours": 1, "keep": 2}).status_code == 201
    )
    assert [(s["every_hours"], s["keep"]) for s in client.get(url).json()["results"]] == [(1, 2)]


def test_a_schedule_runs_when_due_and_prunes_beyond_keep(stopped, no_tasks):
    schedule = services.set_schedule(stopped, every_hours=2, keep=2)
    start = timezone.now()
    taken = []
    for hours in (0, 1, 2, 4):
        snapshot = services.run_schedule(schedule.pk, now=start + timedelta(hours=hours))
        if snapshot is not None:
            Snapshot.objects.filter(pk=snapshot.pk).update(
                state="done", finished_at=start + timedelta(hours=hours), restic_id="cd" * 32
            )
            services.prune_schedule(schedule.pk)
            taken.append(snapshot.pk)
    assert len(taken) == 3  # not at one hour: not due
    kept = Snapshot.objects.filter(deleted_at__isnull=True).order_by("pk")
    assert list(kept.values_list("pk", flat=True)) == taken[1:]


def test_a_shared_store_snapshot_is_billed_per_gib_month_to_the_second(stopped):
    finished = datetime(2026, 11, 10, 12, 0, 0, 250000, tzinfo=UTC)
    snapshot = done_snapshot(
        stopped, finished_at=finished, deleted_at=finished + timedelta(seconds=3600.5),
        bytes_stored=3 * 1024**3, price_per_gib_month=Decimal("0.05"), store="legacy",
    )  # fmt: skip
    tenant, november = stopped.tenant, finished.date().replace(day=1)
    (line,) = usage_report(tenant, november, finished + timedelta(days=2)).lines
    assert (line.kind, line.snapshot_id, line.seconds) == ("snapshot", snapshot.pk, 3601)
    assert (
        line.description
        == f"Snapshot {snapshot.pk} of keeper: 3.000 GiB stored at 0.05 per GiB-month"
    )
    november_seconds = 30 * 24 * 3600
    assert line.amount == (Decimal(3) * Decimal("0.05") * 3601 / november_seconds).quantize(
        Decimal("0.000001")
    )
    december = datetime(2026, 12, 1, tzinfo=UTC)
    assert usage_report(tenant, december.date(), december + timedelta(days=1)).lines == []


def test_the_shelf_shows_its_restores_progress(client, stopped):
    url = f"/api/v1/instances/{stopped.pk}/shelve/"
    assert client.get(url).status_code == 404  # not shelved
    assert client.post(url).status_code == 202
    shelf = Shelf.objects.get(instance=stopped)
    assert client.get(url).json()["restore"] is None
    snapshot = Snapshot.objects.get(shelf=shelf)
    Restore.objects.create(
        snapshot=snapshot, tenant=stopped.tenant, instance=stopped, host=stopped.disk_host,
        disk_name=stopped.disk_name, shelf=shelf, bytes_done=300, bytes_total=1200,
        eta_seconds=4.5,
    )  # fmt: skip
    shown = client.get(url).json()
    assert shown["state"] == "shelving" and shown["snapshot"] == snapshot.pk
    assert shown["restore"] == {"state": "running", "bytes_done": 300, "bytes_total": 1200,
                                "percent": 25, "eta_seconds": 4.5, "error": ""}  # fmt: skip


def test_each_snapshot_shows_its_share_of_the_store(client, stopped):
    older = done_snapshot(stopped, restic_id="0a" * 32)
    newer = Snapshot.objects.create(
        tenant=stopped.tenant, region=stopped.region, instance=stopped, source_name="keeper",
        disk_name=stopped.disk_name, size_gib=10, host_id=stopped.disk_host_id,
    )  # fmt: skip
    held = {
        "0a" * 32: {"bytes": 5 * 1024**3, "unique": 1024**3, "shared": 4 * 1024**3},
        "0b" * 32: {"bytes": 6 * 1024**3, "unique": 2 * 1024**3, "shared": 4 * 1024**3},
    }
    result = {"snapshot": "0b" * 32, "bytes_added": 2 * 1024**3,
              "store": {"bytes": 7 * 1024**3, "snapshots": held}}  # fmt: skip
    services.snapshot_done(newer.pk, {"state": "done", "result": result})
    shown = {s["id"]: s for s in client.get(URL).json()["results"]}
    assert (shown[older.pk]["bytes_unique"], shown[older.pk]["bytes_shared"]) == (
        1024**3, 4 * 1024**3,
    )  # fmt: skip
    assert (shown[newer.pk]["bytes_unique"], shown[newer.pk]["bytes_shared"]) == (
        2 * 1024**3, 4 * 1024**3,
    )  # fmt: skip
    running = client.post(URL, {"instance": stopped.pk}, format="json").json()
    assert (running["bytes_unique"], running["bytes_shared"]) == (None, None)  # not measured
