"""A restarted agent takes its allocations back from its state directory."""

import os
import signal

import pytest

pytestmark = pytest.mark.integration

MIG_1G = {"mode": "mig", "gpus": [0], "mig": {"profile": "1g.10gb", "start": 2}}


def test_sim_runtime_restores_allocations(start_agent):
    args = ("--gpus", "3", "--mode", "mig,shared,whole")
    agent = start_agent(*args)
    agent.client.put("/v1/allocations/mig-1", json=MIG_1G)
    shared = {"mode": "shared", "gpus": [1], "shared": {"milli": 500, "memory_mib": 1024}}
    agent.client.put("/v1/allocations/shared-1", json={**shared, "labels": {"instance": "i-9"}})
    agent.client.post("/v1/allocations/shared-1/stop")
    agent.client.put("/v1/gpus/2/mode", json={"mode": "mig"})
    before = agent.client.get("/v1/allocations").json()
    devices = agent.client.get("/v1/inventory").json()["gpus"][0]["mig_devices"]
    agent.kill()

    again = start_agent(*args, state_dir=agent.state_dir)
    assert again.client.get("/v1/allocations").json() == before
    assert [a["state"] for a in before["allocations"]] == ["running", "stopped"]
    gpus = again.client.get("/v1/inventory").json()["gpus"]
    assert gpus[0]["mig_devices"] == devices
    assert [g["mode"] for g in gpus] == ["mig", "shared", "mig"]  # as set through the API
    # the restored slices are still held
    response = again.client.put("/v1/allocations/mig-2", json=MIG_1G)
    assert response.json()["error"] == "mig_overlap"


def test_process_runtime_adopts_survivors_and_loses_the_dead(start_agent):
    args = ("--gpus", "2", "--runtime", "process")
    agent = start_agent(*args)
    survivor = agent.client.put(
        "/v1/allocations/survivor", json={"mode": "whole", "gpus": [0]}
    ).json()
    victim = agent.client.put("/v1/allocations/victim", json={"mode": "whole", "gpus": [1]}).json()
    assert survivor["state"] == victim["state"] == "running"
    agent.kill()
    os.killpg(victim["pid"], signal.SIGKILL)

    again = start_agent(*args, state_dir=agent.state_dir)
    adopted = again.allocation("survivor")
    assert adopted["state"] == "running"
    assert adopted["pid"] == survivor["pid"]
    lost = again.allocation("victim")
    assert lost["state"] == "lost"
    assert lost["reason"] == "agent_restarted"
    assert lost["pid"] is None

    # the adopted workload is still under control: stopping it ends its process
    stopped = again.client.post("/v1/allocations/survivor/stop").json()
    assert stopped["state"] == "stopped"
    assert not _alive(survivor["pid"])


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False
