"""The demo's hosts simulate GPU servers, with a server's vCPUs and RAM (the catalog's specs are
sized for those). Where that is beyond the machine they run on, `make run`'s banner and the
console's fleet pages say they are simulated; a host with real GPUs is never so marked."""

import os

import pytest
from django.test import Client

from agent.backends.sim import sim_capacity
from agent.host import memory_mib
from console.fleet.models import Host
from console.launcher import DEMO_AGENTS, simulated_hosts
from tests.factories import UserFactory
from tests.instances.e2e import make_catalog, start_agent


def staff() -> Client:
    client = Client()
    client.force_login(UserFactory(username="operator", is_staff=True, is_superuser=True))
    return client


@pytest.mark.parametrize(
    "machine_cpus, machine_mib, beyond",
    [(2, 24 * 1024, True), (os.cpu_count(), memory_mib(), None), (512, 4096 * 1024, False)],
)
def test_the_banner_says_which_demo_hosts_go_beyond_this_machine(machine_cpus, machine_mib, beyond):
    lines = simulated_hosts(machine_cpus, machine_mib)
    assert len(lines) == len(DEMO_AGENTS)
    for line, (hostname, gpus, _, _) in zip(lines, DEMO_AGENTS, strict=True):
        cpus, mib = sim_capacity(gpus)
        assert line.startswith(f"{hostname}: simulated {gpus}× ")
        assert f"{cpus} vCPU, {mib // 1024} GiB RAM" in line
        exceeds = cpus > machine_cpus or mib > machine_mib
        assert beyond in (None, exceeds)
        said = f"beyond this machine's {machine_cpus} vCPU, {machine_mib // 1024} GiB" in line
        assert said == exceeds


@pytest.mark.integration
def test_a_demo_agent_beyond_this_machine_is_marked_simulated_on_the_fleet_pages(stack):
    make_catalog()
    _, gpus, _, _ = DEMO_AGENTS[0]
    _, host = start_agent(stack, "host-a", gpus=gpus, mode="shared")
    assert (host.backend, (host.vcpus, host.ram_mib)) == ("sim", sim_capacity(gpus))
    client = staff()
    page = client.get(f"/fleet/hosts/{host.pk}/").content.decode()
    fleet = client.get("/fleet/").content.decode()
    if host.vcpus > (os.cpu_count() or 1) or host.ram_mib > memory_mib():
        assert "data-simulated" in page and "share the real CPUs and memory" in page
        assert "MiB RAM (simulated)" in fleet
    Host.objects.filter(pk=host.pk).update(backend="nvml")  # real GPUs: what it has is real
    assert "data-simulated" not in client.get(f"/fleet/hosts/{host.pk}/").content.decode()
    assert "(simulated)" not in client.get("/fleet/").content.decode()
