"""Helpers of the tests that run the real stack: a real agent process registers with the real
ASGI server, instances are placed on its GPUs and their allocations created on the agent, as
the provisioning task does."""

import asyncio
import json
import time

import websockets

from accounts import services as accounts_services
from console import processes
from console.catalog.models import Mode
from console.fleet import agent_client
from console.fleet import services as fleet_services
from console.fleet.models import Host
from console.instances import placement
from console.instances.models import Instance, State
from tests.factories import GpuModelFactory, ImageFactory, RegionFactory, SpecFactory


def bring_up_host(stack, hostname: str, gpus: int = 2, mode: str = Mode.SHARED) -> Host:
    region = RegionFactory()
    GpuModelFactory()
    _, raw = fleet_services.create_join_token(region)
    stack.start_agent(hostname, region=region.code, gpus=gpus, mode=mode, join_token=raw)
    deadline = time.monotonic() + 45
    while time.monotonic() < deadline:
        host = Host.objects.filter(name=hostname).first()
        if host is not None and host.gpus.count() == gpus:
            processes.wait_http(f"{host.address}/v1/healthz", timeout=30)
            return host
        time.sleep(0.2)
    raise TimeoutError(f"{hostname} did not register:\n{stack.logs()}")


def launch(host: Host, tenant, name: str, util: float | None = None) -> Instance:
    """A running instance with a 1/4 GPU, its allocation created on the host's agent."""
    spec = SpecFactory(
        code="quarter-a100", gpu_model=host.gpus.first().model, mode=Mode.SHARED, milli=250,
        gpu_memory_mib=20480, vcpus=0, ram_mib=0,
    )  # fmt: skip
    instance = Instance.objects.create(
        tenant=tenant, name=name, spec=spec, image=ImageFactory(), region=host.region
    )
    allocation = placement.allocate(instance, spec)
    assert allocation is not None, "no room on the host"
    body = dict(allocation.request)
    if util is not None:
        body["sim"] = {"util": util}
    agent_client.create_allocation(host, allocation.pk, body)
    Instance.objects.filter(pk=instance.pk).update(state=State.RUNNING)
    return instance


def token_of(membership) -> str:
    return accounts_services.issue_token(membership.user, membership.tenant, "metrics").raw


def ws_url(stack, path: str) -> str:
    return stack.url.replace("http://", "ws://") + path


async def watch(stack, path: str, token: str, seconds: float) -> dict:
    """Connect with a bearer token; gather what arrives for `seconds`, with arrival times.
    {"refused": status} when the handshake is refused."""
    try:
        socket = await websockets.connect(
            ws_url(stack, path),
            additional_headers={"Authorization": f"Bearer {token}"},
            origin=stack.url,
            open_timeout=10,
        )
    except websockets.InvalidStatus as refused:
        return {"refused": refused.response.status_code, "messages": []}
    got = []
    deadline = time.monotonic() + seconds
    async with socket:
        while (left := deadline - time.monotonic()) > 0:
            try:
                raw = await asyncio.wait_for(socket.recv(), timeout=left)
            except TimeoutError:
                break
            got.append((time.time(), json.loads(raw)))
    return {"refused": None, "messages": got}
