"""The end-to-end snapshot tests share a snapshot store and a region of two real container
hosts (the catalog, members and task recorder of the others are tests/conftest.py's)."""

import pytest

from agent.devtools.engine import DEMO_IMAGE
from tests.factories import ImageFactory
from tests.instances.e2e import api_client, make_catalog, make_tenant, start_agent

SNAPSHOT_MASTER_SECRET = "e2e-snapshot-master-secret-of-32-characters-at-least"
SNAPSHOT_PASSWORD = "e2e-restic-password"  # the shared store's, of before the split


@pytest.fixture
def snapshot_store(tmp_path, monkeypatch, settings):
    """The console processes' snapshot store: a folder of this test's, the same for this
    process (console.snapshots.store gives each tenant's repository and password)."""
    store = {
        "SNAPSHOT_REPOSITORY": str(tmp_path / "restic"),
        "SNAPSHOT_PASSWORD": SNAPSHOT_PASSWORD,
        "SNAPSHOT_MASTER_SECRET": SNAPSHOT_MASTER_SECRET,
    }
    for name, value in store.items():
        monkeypatch.setenv(name, value)
        setattr(settings, name, value)
    return tmp_path / "restic"


@pytest.fixture
def cloud(snapshot_store, stack, container_engine):
    """A region with two real container hosts and a tenant's API client."""
    make_catalog()
    ImageFactory(name="demo-busybox", reference=DEMO_IMAGE, command=[], cuda_version="-")
    _, membership = make_tenant()
    first = start_agent(stack, "gpu-1", gpus=2, runtime="oci", engine_url=container_engine.url)[1]
    second = start_agent(stack, "gpu-2", gpus=2, runtime="oci", engine_url=container_engine.url)[1]
    return api_client(stack, membership), first, second
