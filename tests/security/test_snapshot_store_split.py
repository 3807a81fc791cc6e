"""The snapshot store is split per tenant: a host running one tenant's snapshot job receives
that tenant's repository and password only, which open no other tenant's snapshots, and
restic's deduplication never crosses tenants (a snapshot's `bytes_stored` says nothing of what
another tenant stored). Snapshots taken before the split stay readable in the shared store."""

import json
import os
import subprocess

import pytest

from agent.devtools.engine import DEMO_IMAGE
from console.snapshots import services, tasks
from console.snapshots import store as stores
from console.snapshots.models import Snapshot
from console.volumes.models import Volume
from tests.factories import ImageFactory
from tests.instances.conftest import Catalog
from tests.instances.e2e import (
    api_client,
    make_catalog,
    make_tenant,
    start_agent,
    wait_for,
    wait_state,
)
from tests.snapshots.conftest import SNAPSHOT_PASSWORD, snapshot_store  # noqa: F401 - a fixture

MASTER = "the-operators-master-secret-of-32-characters"
# the same 1.9 MB written by each tenant: a store shared by both would keep it once
SAME = "seq 1 300000 > /workspace/same.txt && sync && echo written; sleep 1000"
SAME_BYTES = sum(len(f"{n}\n") for n in range(1, 300001))


def _restic(store: dict, *args: str, cwd=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "RESTIC_REPOSITORY": store["repository"],
           "RESTIC_PASSWORD": store["password"]}  # fmt: skip
    command = ["restic", "--no-cache", *args]
    return subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True)


def _store(base: str, key) -> dict:
    return {
        "repository": stores.tenant_repository(base, key),
        "password": stores.tenant_password(MASTER, key),
    }


def _volume_snapshot(catalog: Catalog, tenant, host) -> Snapshot:
    volume = Volume.objects.create(
        tenant=tenant, name="data", size_gib=1, region=catalog.region, host=host
    )
    snapshot = services.take_volume_snapshot(volume)
    Snapshot.objects.filter(pk=snapshot.pk).update(state="done", restic_id="ab" * 32)
    return Snapshot.objects.get(pk=snapshot.pk)


def test_each_tenants_jobs_carry_its_own_store_only(settings, tenant, other_tenant):
    settings.SNAPSHOT_REPOSITORY, settings.SNAPSHOT_MASTER_SECRET = "s3:https://s3/b", MASTER
    catalog = Catalog()
    host = catalog.host(gpus=1)
    theirs = {}
    for owner in (tenant, other_tenant):
        snapshot = _volume_snapshot(catalog, owner, host)
        restore = services.restore_to_volume(snapshot, name="copy")
        bodies = [
            tasks._backup(snapshot)[2],
            tasks._restore(restore)[2],
            tasks._forget(snapshot)[2],
        ]
        assert bodies[0]["store"] == bodies[1]["store"] == bodies[2]["store"]  # one per tenant
        theirs[owner.pk] = bodies[0]["store"]
    mine, other = theirs[tenant.pk], theirs[other_tenant.pk]
    assert mine["repository"] != other["repository"] and mine["password"] != other["password"]
    for store in (mine, other):
        assert store["repository"].startswith("s3:https://s3/b/tenants/")
        assert MASTER not in json.dumps(store) and store["password"] != SNAPSHOT_PASSWORD
    assert tasks._backup(Snapshot.objects.get(tenant=tenant))[2]["store"] == mine  # stable


def test_a_legacy_snapshots_jobs_go_to_the_shared_store(settings, tenant):
    settings.SNAPSHOT_REPOSITORY, settings.SNAPSHOT_MASTER_SECRET = "/srv/snapshots", MASTER
    settings.SNAPSHOT_PASSWORD = "the-old-shared-password"
    catalog = Catalog()
    snapshot = _volume_snapshot(catalog, tenant, catalog.host(gpus=1))
    Snapshot.objects.filter(pk=snapshot.pk).update(store=Snapshot.Store.LEGACY)
    snapshot.refresh_from_db()
    shared = {"repository": "/srv/snapshots", "password": "the-old-shared-password"}
    assert tasks._forget(snapshot)[2]["store"] == shared
    settings.SNAPSHOT_PASSWORD = ""  # a console that never had the shared store's password
    with pytest.raises(stores.StoreUnavailable):
        tasks._forget(snapshot)


@pytest.mark.integration
def test_neither_tenants_password_opens_the_others_repository(tmp_path, tenant, other_tenant):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "secret.txt").write_text("acme's data")
    base = str(tmp_path / "store")
    keys = [stores.tenant_key(tenant.pk), stores.tenant_key(other_tenant.pk)]
    mine, theirs = (_store(base, key) for key in keys)
    assert _restic(mine, "init").returncode == 0
    assert _restic(mine, "backup", ".", cwd=tmp_path / "data").returncode == 0
    for password in (theirs["password"], MASTER):
        for command in (["cat", "config"], ["snapshots"]):
            tried = _restic({**mine, "password": password}, *command)
            assert tried.returncode != 0 and "wrong password" in tried.stderr
    assert _restic(theirs, "snapshots").returncode != 0  # theirs is another repository
    assert len(json.loads(_restic(mine, "snapshots", "--json").stdout)) == 1


@pytest.fixture
def two_tenants(snapshot_store, stack, container_engine):  # noqa: F811
    """One real container host, the API clients of two tenants, and the store's folder."""
    make_catalog()
    ImageFactory(name="demo-busybox", reference=DEMO_IMAGE, command=[], cuda_version="-")
    _, acme = make_tenant("acme", "mia")
    _, bolt = make_tenant("bolt", "bob")
    host = start_agent(stack, "gpu-1", gpus=2, runtime="oci", engine_url=container_engine.url)[1]
    return api_client(stack, acme), api_client(stack, bolt), host, snapshot_store


def _ended(api, url: str, stack) -> dict:
    def ended():
        shown = api.get(url).json()
        return shown if shown["state"] != "running" else None

    return wait_for(ended, timeout=120, what=url, stack=stack, interval=0.2)


@pytest.mark.integration
@pytest.mark.containers
@pytest.mark.timeout(400)
def test_two_tenants_storing_the_same_data_each_store_it_and_legacy_snapshots_restore(
    two_tenants, stack, tmp_path
):
    acme, bolt, host, folder = two_tenants
    # a snapshot of acme's from before the split, in the shared repository
    old = tmp_path / "old"
    old.mkdir()
    (old / "old.txt").write_bytes(b"taken before the split\n" * 4096)
    shared = {"repository": str(folder), "password": SNAPSHOT_PASSWORD}
    assert _restic(shared, "init").returncode == 0
    assert _restic(shared, "backup", ".", "--host", "gpucloud", cwd=old).returncode == 0
    (old_id,) = [s["id"] for s in json.loads(_restic(shared, "snapshots", "--json").stdout)]

    taken = {}
    for api, name in ((acme, "a"), (bolt, "b")):
        body = {"name": name, "spec": "a100-quarter", "image": "demo-busybox",
                "command": ["sh", "-c", SAME]}  # fmt: skip
        created = api.post("/instances/", json=body)
        assert created.status_code == 202, created.text
        iid = created.json()["id"]
        wait_state(api, iid, "running", stack, timeout=90)
        wait_for(
            lambda api=api, iid=iid: "written"
            in api.get(f"/instances/{iid}/logs/", params={"tail": 5}).json()["lines"],
            timeout=60, what="the data written", stack=stack,
        )  # fmt: skip
        started = api.post("/snapshots/", json={"instance": iid})
        assert started.status_code == 202, started.text
        taken[name] = _ended(api, f"/snapshots/{started.json()['id']}/", stack)

    # each stored the whole data: nothing tells bolt that acme holds the same
    for shown in taken.values():
        assert shown["state"] == "done", shown
        assert shown["bytes_stored"] >= SAME_BYTES, shown
    rows = {name: Snapshot.objects.get(pk=shown["id"]) for name, shown in taken.items()}
    mine, theirs = (stores.for_snapshot(rows[name]) for name in ("a", "b"))
    assert mine["repository"] != theirs["repository"]
    assert [s["id"] for s in json.loads(_restic(mine, "snapshots", "--json").stdout)] == [
        rows["a"].restic_id
    ]
    wrong = _restic({**mine, "password": theirs["password"]}, "snapshots")
    assert wrong.returncode != 0 and "wrong password" in wrong.stderr

    # acme's snapshot of before the split restores from the shared repository, and is
    # forgotten there
    legacy = Snapshot.objects.create(
        tenant=rows["a"].tenant, region=rows["a"].region, source_name="old",
        disk_name="gpucloud-old", size_gib=1, host=host, state=Snapshot.State.DONE,
        store=Snapshot.Store.LEGACY, restic_id=old_id,
    )  # fmt: skip
    restore = acme.post(f"/snapshots/{legacy.pk}/restore/", json={"name": "old-copy"})
    assert restore.status_code == 202, restore.text
    restored = _ended(acme, f"/snapshot-restores/{restore.json()['id']}/", stack)
    assert restored["state"] == "done", restored
    assert restored["bytes_total"] == len(b"taken before the split\n") * 4096
    assert acme.delete(f"/snapshots/{legacy.pk}/").status_code == 204
    wait_for(
        lambda: Snapshot.objects.filter(pk=legacy.pk, forgotten=True).exists(),
        timeout=60, what="the legacy snapshot forgotten", stack=stack,
    )  # fmt: skip
    assert json.loads(_restic(shared, "snapshots", "--json").stdout) == []
