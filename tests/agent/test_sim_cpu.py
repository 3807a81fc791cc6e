"""The sim backend's utilisation follows what the workload does with the CPU: a workload that
sleeps reads ~0 %, one that spins a core reads ~100 % (real processes, read from /proc)."""

import asyncio
import os
import sys
import time

import pytest

from agent.backends.sim import SimBackend
from agent.cpu import CpuMeter, process_seconds
from agent.gpu_models import MODELS
from agent.host import LocalHost
from agent.runtimes.process import ProcessRuntime
from agent.state import StateStore


class Alloc:
    def __init__(self, alloc_id: str):
        self.id = alloc_id


def test_the_meter_reads_the_share_of_one_cpu_between_readings():
    used = {"a": 0.0}
    clock = iter([0.0, 2.0, 4.0, 5.0]).__next__
    meter = CpuMeter(lambda alloc: used.get(alloc.id), clock)
    a = Alloc("a")
    assert meter.percent(a) == 0.0  # the first reading has nothing to compare with
    used["a"] = 1.0
    assert meter.percent(a) == 50.0
    used["a"] = 5.0
    assert meter.percent(a) == 100.0  # never more than one core's worth
    del used["a"]
    assert meter.percent(a) is None


def test_process_seconds_counts_a_process_that_works():
    assert process_seconds(2**22 + 12345) is None
    before = process_seconds(os.getpid())
    deadline = time.process_time() + 0.2
    while time.process_time() < deadline:
        pass
    assert process_seconds(os.getpid()) >= before + 0.1


@pytest.mark.integration
def test_an_idle_workload_reads_idle_and_a_busy_one_busy(tmp_path):
    runtime = ProcessRuntime(tmp_path / "logs", stop_grace=1.0)
    backend = SimBackend("sim-host", MODELS["a100-80gb"], ["whole", "whole"])
    backend.follow_cpu(runtime.cpu_seconds)
    host = LocalHost("sim-host", backend, runtime, StateStore(tmp_path / "state"))
    spin = [sys.executable, "-c", "while True: pass"]
    bodies = {
        "idle": {"mode": "whole", "gpus": [0], "command": ["sleep", "60"]},
        "busy": {"mode": "whole", "gpus": [1], "command": spin},
    }
    try:
        for alloc_id, body in bodies.items():
            asyncio.run(host.put(alloc_id, body))
        host.poll()
        time.sleep(1.0)
        samples = host.poll()
        util = {s["allocation"]: s["gpu_util"] for s in samples if s["kind"] == "allocation"}
        assert util["idle"] < 5
        assert util["busy"] > 10  # a shared, loaded machine gives it less than a core
    finally:
        for alloc_id in bodies:
            asyncio.run(host.delete(alloc_id))
