"""The `process` runtime: real workloads with their slice's CUDA environment."""

import json
import sys
import time

import pytest

from tests.agent.agents import wait_for

pytestmark = pytest.mark.integration

DUMP_ENV = (
    "import json, os, sys, time\n"
    "with open(sys.argv[1] + '.tmp', 'w') as f:\n"
    "    json.dump(dict(os.environ), f)\n"
    "os.rename(sys.argv[1] + '.tmp', sys.argv[1])\n"
    "print('env written', flush=True)\n"
    "time.sleep(60)\n"
)
IGNORE_TERM = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "open(sys.argv[1], 'w').close()\n"
    "time.sleep(60)\n"
)


def _logs(agent, instance: str) -> list[str]:
    return agent.client.get(f"/v1/instances/{instance}/logs").json()["lines"]


def _env_of(path) -> dict:
    wait_for(path.exists)
    return json.loads(path.read_text())


def test_workload_gets_its_slice_environment(start_agent, tmp_path):
    agent = start_agent("--gpus", "2", "--mode", "shared,mig", "--runtime", "process")
    gpus = agent.client.get("/v1/inventory").json()["gpus"]

    shared_env = tmp_path / "shared.json"
    body = {
        "mode": "shared",
        "gpus": [0],
        "shared": {"milli": 250, "memory_mib": 20480},
        "command": [sys.executable, "-c", DUMP_ENV, str(shared_env)],
        "env": {"HF_HOME": "/data/hf"},
    }
    alloc = agent.client.put("/v1/allocations/shared-1", json=body).json()
    assert alloc["state"] == "running" and alloc["pid"] > 0
    env = _env_of(shared_env)
    assert env["CUDA_VISIBLE_DEVICES"] == gpus[0]["uuid"]
    assert not [name for name in env if name.startswith("CUDA_MPS_")]  # the daemon's, not env
    assert env["GPUCLOUD_ALLOCATION_ID"] == "shared-1"
    assert env["HF_HOME"] == "/data/hf"
    assert env["PATH"]  # where programs are, and nothing else of the agent's environment
    assert not {"GPUCLOUD_TEST_AGENT_ONLY", "PYTHONPATH", "HOME"} & set(env)
    assert {k: env[k] for k in alloc["env"]} == alloc["env"]
    assert wait_for(lambda: "env written" in _logs(agent, "shared-1"))

    mig_env = tmp_path / "mig.json"
    body = {
        "mode": "mig",
        "gpus": [1],
        "mig": {"profile": "2g.20gb", "start": 2},
        "command": [sys.executable, "-c", DUMP_ENV, str(mig_env)],
    }
    alloc = agent.client.put("/v1/allocations/mig-1", json=body).json()
    env = _env_of(mig_env)
    assert env["CUDA_VISIBLE_DEVICES"] == alloc["mig"]["uuid"]
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in env


def test_stop_sends_term_then_kill_after_the_grace(start_agent, tmp_path):
    agent = start_agent("--gpus", "2", "--runtime", "process", "--stop-grace", "1")
    plain = agent.client.put("/v1/allocations/plain", json={"mode": "whole", "gpus": [0]})
    started = time.monotonic()
    stopped = agent.client.post("/v1/allocations/plain/stop").json()
    assert time.monotonic() - started < 1.0
    assert stopped["state"] == "stopped"
    assert stopped["exit_code"] == -15  # SIGTERM
    assert stopped["pid"] is None
    assert plain.json()["pid"] > 0

    ready = tmp_path / "ready"
    body = {
        "mode": "whole",
        "gpus": [1],
        "command": [sys.executable, "-c", IGNORE_TERM, str(ready)],
    }
    agent.client.put("/v1/allocations/stubborn", json=body)
    wait_for(ready.exists)
    started = time.monotonic()
    stopped = agent.client.post("/v1/allocations/stubborn/stop").json()
    elapsed = time.monotonic() - started
    assert 1.0 <= elapsed < 4.0
    assert stopped["state"] == "stopped"
    assert stopped["exit_code"] == -9  # SIGKILL after the grace

    assert agent.client.post("/v1/allocations/stubborn/start").json()["state"] == "running"
    rebooted = agent.client.post("/v1/allocations/plain/reboot").json()
    assert rebooted["state"] == "running"
    assert agent.client.delete("/v1/allocations/plain").status_code == 204


def test_workload_exit_is_reported(start_agent):
    agent = start_agent("--gpus", "3", "--runtime", "process")
    for index, (name, code) in enumerate([("done", 0), ("crashed", 3)]):
        command = [sys.executable, "-c", f"raise SystemExit({code})"]
        agent.client.put(
            f"/v1/allocations/{name}", json={"mode": "whole", "gpus": [index], "command": command}
        )
    done = agent.wait_state("done", "exited")
    assert done["exit_code"] == 0 and done["pid"] is None
    crashed = agent.wait_state("crashed", "failed")
    assert crashed["exit_code"] == 3
    assert crashed["reason"] == "exit code 3"
    assert crashed["finished_at"]

    missing = {"mode": "whole", "gpus": [2], "command": ["/nonexistent/binary"]}
    failed = agent.client.put("/v1/allocations/missing", json=missing).json()
    assert failed["state"] == "failed"
    assert failed["reason"].startswith("command_not_found")
