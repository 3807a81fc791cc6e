"""An operator repartitions a GPU through a real agent: the agent is called outside any
transaction (the autouse check in tests/conftest.py fails the test otherwise) while the GPU
is fenced off from placement, and the fence is lifted whatever the agent answers."""

import pytest
from django.core.exceptions import ValidationError

from console.fleet import agent_client, services
from console.fleet.models import Gpu
from console.instances import placement
from tests.agent.agents import SECRET, standalone

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    with standalone(
        tmp_path_factory.mktemp("mode") / "state", "--gpus", "2", "--mode", "mig"
    ) as agent:
        yield agent


@pytest.fixture
def host(register, agent):
    host, _ = register(gpus=2)
    host.address = agent.url
    host.set_secret(SECRET)
    host.save()
    return host


def placeable(gpu: Gpu) -> bool:
    snap = placement.snapshot(gpu.host.region_id)
    (seen,) = [
        g for h in snap.hosts for g in h.gpus if h.id == gpu.host_id and g.index == gpu.index
    ]
    return seen.healthy


def test_the_agent_switches_the_gpu_while_placement_keeps_off_it(host, agent, monkeypatch):
    gpu = host.gpus.get(index=1)
    assert placeable(gpu)
    seen_during_the_call = []
    real = agent_client.set_gpu_mode

    def watched(h, index, mode):
        seen_during_the_call.append(
            (Gpu.objects.get(pk=gpu.pk).mode_changing_to, placeable(Gpu.objects.get(pk=gpu.pk)))
        )
        return real(h, index, mode)

    monkeypatch.setattr(agent_client, "set_gpu_mode", watched)
    gpu = services.set_gpu_mode(gpu, "shared")
    assert seen_during_the_call == [("shared", False)]
    gpu.refresh_from_db()
    assert (gpu.mode, gpu.mig_enabled, gpu.mode_changing_to) == ("shared", False, "")
    assert placeable(gpu)
    on_agent = agent.client.get("/v1/inventory").json()["gpus"][1]
    assert on_agent["mode"] == "shared"


def test_a_refusal_lifts_the_fence_and_changes_nothing(host, agent):
    gpu = host.gpus.get(index=0)
    busy = {"mode": "mig", "gpus": [0], "mig": {"profile": "1g.10gb", "start": 0}}
    assert agent.client.put("/v1/allocations/held", json=busy).status_code == 201
    try:
        with pytest.raises(ValidationError, match="The agent refused"):
            services.set_gpu_mode(gpu, "whole")
    finally:
        agent.client.delete("/v1/allocations/held")
    gpu.refresh_from_db()
    assert (gpu.mode, gpu.mode_changing_to) == ("mig", "")
    assert placeable(gpu)
