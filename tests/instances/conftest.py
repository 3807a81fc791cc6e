"""Fixtures of the instance tests: a small catalog and hosts made straight in the database
(the integration tests register real simulated agents instead). Its `catalog` fixture, the
member and the task recorder are tests/conftest.py's: every package's tests ask for them."""

import itertools
from decimal import Decimal

import pytest

from console.catalog.models import Mode
from console.fleet.models import Gpu, Host
from tests.factories import (
    GpuModelFactory,
    ImageFactory,
    RegionFactory,
    SpecFactory,
    mig_profile,
)

_serial = itertools.count(1)


class Catalog:
    def __init__(self):
        self.region = RegionFactory(code="local-1", name="Local 1")
        self.region2 = RegionFactory(code="local-2", name="Local 2")
        self.a100 = GpuModelFactory()
        self.image = ImageFactory()
        common = {"gpu_model": self.a100, "vcpus": 4, "ram_mib": 16384, "disk_gib": 50}
        self.quarter = SpecFactory(
            code="a100-quarter", name="A100 1/4", mode=Mode.SHARED, milli=250,
            gpu_memory_mib=20480, price_per_hour=Decimal("0.9000"), **common,
        )  # fmt: skip
        self.half = SpecFactory(
            code="a100-half", name="A100 1/2", mode=Mode.SHARED, milli=500,
            gpu_memory_mib=40960, price_per_hour=Decimal("1.8000"), **common,
        )  # fmt: skip
        self.mig1g = SpecFactory(
            code="a100-1g10gb", name="A100 MIG 1g.10gb", mode=Mode.MIG, milli=None,
            mig_profile=mig_profile(self.a100, "1g.10gb"), gpu_memory_mib=9984,
            price_per_hour=Decimal("0.5000"), **common,
        )  # fmt: skip
        self.mig3g = SpecFactory(
            code="a100-3g40gb", name="A100 MIG 3g.40gb", mode=Mode.MIG, milli=None,
            mig_profile=mig_profile(self.a100, "3g.40gb"), gpu_memory_mib=40192,
            price_per_hour=Decimal("1.6000"), **common,
        )  # fmt: skip
        self.whole1 = SpecFactory(
            code="a100-1x", name="A100 x1", mode=Mode.WHOLE, milli=None, gpu_count=1,
            gpu_memory_mib=81920, price_per_hour=Decimal("3.2000"), **common,
        )  # fmt: skip
        self.whole2 = SpecFactory(
            code="a100-2x", name="A100 x2", mode=Mode.WHOLE, milli=None, gpu_count=2,
            gpu_memory_mib=163840, price_per_hour=Decimal("6.4000"), **common,
        )  # fmt: skip

    def host(self, name=None, *, gpus=1, mode=Mode.SHARED, status=Host.Status.ACTIVE,
             region=None, vcpus=64, ram_mib=512000, address="http://127.0.0.1:9"):  # fmt: skip
        name = name or f"host-{next(_serial)}"
        host = Host(
            name=name, region=region or self.region, address=address, status=status,
            admin_status=status if status != Host.Status.UNREACHABLE else Host.Status.ACTIVE,
            vcpus=vcpus, ram_mib=ram_mib,
        )  # fmt: skip
        host.set_secret(f"secret-{name}")
        host.save()
        for index in range(gpus):
            Gpu.objects.create(
                host=host, index=index, uuid=f"GPU-{name}-{index}", model=self.a100,
                name="NVIDIA A100-SXM4-80GB", memory_mib=81920, mode=mode,
            )  # fmt: skip
        return host

    def cordoned(self) -> Host:
        """Hardware for every spec in the region, none of it schedulable: launches are
        accepted (something could hold them) and wait in the queue."""
        host = self.host(gpus=4, status=Host.Status.CORDONED)
        Gpu.objects.filter(host=host, index=1).update(mode=Mode.MIG)
        Gpu.objects.filter(host=host, index__in=[2, 3]).update(mode=Mode.WHOLE)
        return host


@pytest.fixture(autouse=True)
def fast_passwords(request, settings):
    """Test users get their passwords hashed fast; not in browser tests, where the server
    process checks a password with its own (default) hashers."""
    if request.node.get_closest_marker("browser"):
        return
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


# --- the real stack ------------------------------------------------------------------------

# Retries short enough for a test: an agent that stays down fails an instance in seconds.
STACK_ENV = {
    "INSTANCE_AGENT_MAX_RETRIES": "2",
    "INSTANCE_AGENT_RETRY_BACKOFF": "1",
    "AGENT_TIMEOUT_SECONDS": "3",
}


@pytest.fixture
def stack_env():
    """Extra environment of the stack's processes; a test module overrides it."""
    return {}


@pytest.fixture
def stack(transactional_db, redis_url, tmp_path, request, monkeypatch, stack_env):
    """The conftest's stack (uvicorn + Celery worker on the test database), with short agent
    retries and a clean broker: no task left over from an earlier test is redelivered."""
    import redis

    from tests.harness import running_stack

    redis.Redis.from_url(redis_url).flushdb()
    for name, value in {**STACK_ENV, **stack_env}.items():
        monkeypatch.setenv(name, value)
    with running_stack(redis_url, tmp_path, request.node) as running:
        yield running
