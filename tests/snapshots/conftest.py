"""The end-to-end snapshot tests share a snapshot store and a region of two real container
hosts (the catalog, members and task recorder of the others are tests/conftest.py's)."""

import pytest

from agent.devtools.engine import DEMO_IMAGE
from tests.factories import ImageFactory
from tests.instances.e2e import api_client, make_catalog, make_tenant, start_agent


@pytest.fixture
def snapshot_store(tmp_path, monkeypatch):
    """The console processes' restic repository: a folder of this test's."""
    monkeypatch.setenv("SNAPSHOT_REPOSITORY", str(tmp_path / "restic"))
    monkeypatch.setenv("SNAPSHOT_PASSWORD", "e2e-restic-password")
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
