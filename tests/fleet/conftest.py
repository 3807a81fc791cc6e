import hashlib
import json

import pytest
from django.test import Client

from console.catalog.models import Mode
from console.fleet import services
from console.instances.models import Allocation, GpuClaim, Instance
from tests.factories import (
    GpuModelFactory,
    ImageFactory,
    RegionFactory,
    SpecFactory,
    TenantFactory,
    UserFactory,
)


def make_gpu(index: int, hostname: str = "host-x", model: str = "a100-80gb", mode: str = "mig"):
    return {
        "index": index,
        "uuid": f"GPU-{hostname}-{index}",
        "name": "NVIDIA A100-SXM4-80GB",
        "model": model,
        "pci_bus_id": f"00000000:{0x10 + index:02X}:00.0",
        "memory_mib": 81920,
        "mode": mode,
        "mig_enabled": mode == "mig",
        "healthy": True,
        "health_reason": None,
        "driver_version": "550.54.15",
        "cuda_version": "12.4",
        "mig_devices": [],
    }


def make_inventory(hostname: str = "host-x", gpus: int = 4, **gpu_kwargs) -> dict:
    inventory = {
        "hostname": hostname,
        "agent_version": "0.1.0",
        "backend": "sim",
        "runtime": "sim",
        "cpu_count": 64,
        "memory_mib": 515000,
        "gpus": [make_gpu(i, hostname, **gpu_kwargs) for i in range(gpus)],
    }
    return with_digest(inventory)


def with_digest(inventory: dict) -> dict:
    body = {k: v for k, v in inventory.items() if k != "digest"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return {**body, "digest": hashlib.sha256(canonical.encode()).hexdigest()}


@pytest.fixture
def region(db):
    return RegionFactory(code="local-1", name="Local 1")


@pytest.fixture
def a100(db):
    return GpuModelFactory()


@pytest.fixture
def h100(db):
    return GpuModelFactory(code="h100-80gb", name="NVIDIA H100 80GB", memory_mib=81559)


@pytest.fixture
def register(region, a100):
    """Register a host through the service, as an agent would; answers (host, secret)."""

    def do(hostname="host-x", gpus=4, **inventory_kwargs):
        _, raw = services.create_join_token(region)
        return services.register_host(
            join_token=raw,
            hostname=hostname,
            address="http://127.0.0.1:9101",
            remote_addr="127.0.0.1",
            region_code=region.code,
            agent_version="0.1.0",
            inventory=make_inventory(hostname, gpus, **inventory_kwargs),
        )

    return do


@pytest.fixture
def claim(db, region):
    """Allocate a slice of `gpu` to a fresh instance, as the scheduler would."""
    tenant = TenantFactory(slug="acme")
    image = ImageFactory()
    counter = iter(range(1000))

    def do(gpu, slot=0, milli=0):
        n = next(counter)
        spec = SpecFactory(gpu_model=gpu.model, mode=Mode.SHARED)
        instance = Instance.objects.create(
            tenant=tenant, name=f"i{n}", spec=spec, image=image, region=region
        )
        allocation = Allocation.objects.create(
            id=f"alloc-{n}", instance=instance, host=gpu.host, mode=gpu.mode
        )
        return GpuClaim.objects.create(allocation=allocation, gpu=gpu, slot=slot, milli=milli)

    return do


@pytest.fixture
def staff_client(db):
    client = Client()
    client.force_login(UserFactory(username="operator", is_staff=True, is_superuser=True))
    return client


def agent_client_for(secret: str) -> Client:
    return Client(headers={"Authorization": f"Bearer {secret}"})


def post_json(client: Client, url: str, body):
    return client.post(url, data=json.dumps(body), content_type="application/json")
