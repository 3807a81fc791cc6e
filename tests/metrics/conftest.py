"""Fixtures of the live-metrics tests: a host with GPUs, two tenants' instances placed on it,
and samples shaped as the agent sends them."""

import pytest
from channels.layers import channel_layers

from accounts.roles import Role
from agent.samples import make_sample
from console.catalog.models import Mode
from console.fleet.models import Gpu, Host
from console.instances.models import Allocation, Instance, State
from console.metrics import ingest, live
from tests.factories import GpuModelFactory, ImageFactory, RegionFactory, SpecFactory


@pytest.fixture(autouse=True)
def fresh_metrics():
    """Each test starts with an empty live window, attribution cache and channel layer."""
    live.reset_store()
    live.store().clear()
    ingest.allocations.clear()
    channel_layers.backends.clear()
    yield
    live.store().clear()
    ingest.allocations.clear()
    channel_layers.backends.clear()


@pytest.fixture(params=["memory", "redis"])
def window_backend(request, settings):
    """Run a test with the in-process window and with the Redis one (the embedded server, or
    REDIS_URL)."""
    if request.param == "redis":
        settings.REDIS_URL = request.getfixturevalue("redis_url")
    else:
        settings.REDIS_URL = ""
    live.reset_store()
    live.store().clear()
    yield request.param
    live.store().clear()
    live.reset_store()


def add_host(name: str, region, gpu_model, gpus: int = 2, mode: str = Mode.SHARED) -> Host:
    host = Host(name=name, region=region, address=f"http://{name}.invalid:9101")
    host.set_secret(f"secret-of-{name}")
    host.save()
    for index in range(gpus):
        Gpu.objects.create(
            host=host,
            index=index,
            uuid=f"GPU-{name}-{index}",
            model=gpu_model,
            name="NVIDIA A100-SXM4-80GB",
            memory_mib=81920,
            mode=mode,
            mig_devices=[
                {"uuid": f"MIG-{name}-{index}-0", "profile": "3g.40gb", "start": 4, "size": 4}
            ]
            if mode == Mode.MIG
            else [],
        )
    return host


def place(instance: Instance, host: Host, alloc_id: str, mode: str, gpus=(0,), **slice_):
    return Allocation.objects.create(
        id=alloc_id,
        instance=instance,
        host=host,
        mode=mode,
        request={"mode": mode, "gpus": list(gpus), "mig": slice_.get("mig"), "shared": None},
    )


class World:
    pass


@pytest.fixture
def world(db, tenant, other_tenant, make_member):
    """host-a (2 shared GPUs): acme's `train` and globex's `infer` share gpu0; acme's `big` holds
    gpu1 of host-b (whole). Members: alice (acme), bob (globex)."""
    w = World()
    w.region = RegionFactory()
    w.model = GpuModelFactory()
    w.host = add_host("host-a", w.region, w.model, mode=Mode.SHARED)
    w.host_b = add_host("host-b", w.region, w.model, mode=Mode.WHOLE)
    image = ImageFactory()
    spec = SpecFactory(gpu_model=w.model)
    w.tenant, w.other_tenant = tenant, other_tenant

    def instance(owner, name):
        return Instance.objects.create(
            tenant=owner, name=name, spec=spec, image=image, region=w.region, state=State.RUNNING
        )

    w.train = instance(tenant, "train")
    w.infer = instance(other_tenant, "infer")
    w.big = instance(tenant, "big")
    place(w.train, w.host, "alloc-train", Mode.SHARED)
    place(w.infer, w.host, "alloc-infer", Mode.SHARED)
    place(w.big, w.host_b, "alloc-big", Mode.WHOLE, gpus=(0, 1))
    w.alice = make_member(tenant, Role.VIEWER, username="alice")
    w.bob = make_member(other_tenant, Role.MEMBER, username="bob")
    return w


def gpu_sample(ts, index, host="host-a", util=50.0, **kw):
    kw.setdefault("mem_used_mib", 1000)
    kw.setdefault("mem_total_mib", 81920)
    kw.setdefault("temperature_c", 60.0)
    kw.setdefault("power_w", 200.0)
    kw.setdefault("sm_clock_mhz", 1410)
    return make_sample(ts, "gpu", index, f"GPU-{host}-{index}", gpu_util=util, **kw)


def alloc_sample(ts, alloc_id, index=0, host="host-a", util=25.0, **kw):
    kw.setdefault("mem_used_mib", 500)
    kw.setdefault("mem_total_mib", 20480)
    kw.setdefault("temperature_c", 60.0)
    kw.setdefault("power_w", 50.0)
    kw.setdefault("sm_clock_mhz", 1410)
    return make_sample(
        ts, "allocation", index, f"GPU-{host}-{index}", allocation=alloc_id, gpu_util=util, **kw
    )
