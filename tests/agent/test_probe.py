"""`gpucloud-agent probe` against the strict fake NVML (there is no GPU here): what it reads,
what it says is missing, and that it changes nothing."""

import json

import pynvml
import pytest

from agent import __main__ as agent_main
from agent import probe
from agent.backends import nvml as nvml_backend
from agent.backends.nvml import dcgm as nvml_dcgm
from agent.backends.nvml.access import MigAccess
from tests.agent.fake_nvml import MIB, FakeNvml, gpu, gpu_instance, mig_device

ROOT = MigAccess(root=True, cap_sys_admin=True, config=None, monitor=None)
USER = MigAccess(root=False, cap_sys_admin=False, config=False, monitor=False)


@pytest.fixture
def host(monkeypatch):
    """host([gpu dicts], access) -> the fake NVML the probe will read."""

    def make(gpus, access=ROOT):
        fake = FakeNvml(gpus)
        monkeypatch.setattr(nvml_backend, "pynvml", fake.module)
        monkeypatch.setattr(nvml_backend, "mig_access", lambda: access)
        monkeypatch.setattr(
            nvml_dcgm, "connect", lambda: (None, "DCGM: not installed (no dcgm_agent bindings)")
        )
        return fake

    return make


def a_host(privileged=True):
    mig = gpu(
        0,
        mig=(1, 1),
        privileged=privileged,
        instances=[
            mig_device("MIG-aaaa", gi=1, start=0, profile="3g.40gb"),
            gpu_instance(2, "3g.40gb", 4),  # an orphan: no compute instance
        ],
    )
    l4 = gpu(1, name="NVIDIA L4", total=23034 * MIB, mig=None, power_mw=30000)
    return [mig, l4]


def test_the_probe_reports_what_it_reads_and_changes_nothing(host, capsys):
    fake = host(a_host())
    assert probe.main([]) == 0
    out = capsys.readouterr().out
    assert "read-only" in out
    assert "NVIDIA driver 550.54.15, CUDA 12.4, NVML 12.550.54.15, 2 GPU(s)" in out
    assert "GPU 0: NVIDIA A100-SXM4-80GB" in out
    assert "model a100-80gb, memory 81920 MiB, healthy" in out
    assert "MIG enabled (pending: enabled); mode mig" in out
    assert "3g.40gb      start 0  size 4   40192 MiB  GPU instance 1  MIG-aaaa" in out
    assert "GPU instance 2  orphan: no compute instance" in out
    # MIG-enabled GPU: NVML has no utilization for it (nvml.h), which the probe says
    assert "unsupported: nvmlDeviceGetProcessUtilization" not in out  # never asked on MIG
    assert "nvmlDeviceGetUtilizationRates" in out.split("GPU 0:")[1].split("unsupported:")[1]
    assert "GPU 1: NVIDIA L4" in out and "model l4, memory 23034 MiB" in out
    assert "offers: the whole GPU (whole mode)" in out
    assert "offers: MIG profiles 1g.10gb, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb" in out
    assert "existing devices usable for allocations: 3g.40gb at slot 0" in out
    assert "GPU 0: GPU instance 2 (3g.40gb at slot 4) has no compute instance" in out
    assert "MIG devices will show no utilization" in out
    assert fake.mutating_calls() == []


def test_without_mig_privileges_the_probe_says_what_is_refused(host, capsys):
    fake = host(a_host(privileged=False), access=USER)
    assert probe.main([]) == 0
    out = capsys.readouterr().out
    gpu0 = out.split("GPU 0:")[1].split("GPU 1:")[0]
    refused = gpu0.split("refused (no permission): ")[1].splitlines()[0]
    for call in (
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetGpuInstanceById",
        "nvmlDeviceGetGpuInstances",
        "nvmlDeviceGetComputeRunningProcesses",
    ):
        assert call in refused
    assert "model a100-80gb, memory unreadable, healthy" in gpu0  # recognised by name
    assert "3g.40gb      start ?  size 4" in gpu0
    assert "existing devices usable for allocations: 3g.40gb at an unreadable slot" in gpu0
    assert "privileges: not root, no CAP_SYS_ADMIN; mig/monitor: no, mig/config: no" in out
    assert "--manage-mig would be refused" in out
    assert "GPU 0: NVML refuses nvmlDeviceGetMemoryInfo, nvmlDeviceGetGpuInstances" in out
    assert fake.mutating_calls() == []


def test_the_probe_in_json_is_the_inventory_and_the_readings(host, capsys):
    host(a_host())
    assert probe.main(["--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["read_only"] is True
    assert (report["driver_version"], report["cuda_version"]) == ("550.54.15", "12.4")
    first, second = report["gpus"]
    assert (first["model"], first["mode"], first["mig_enabled"]) == ("a100-80gb", "mig", True)
    assert [(d["profile"], d["start"], d["uuid"]) for d in first["mig_devices"]] == [
        ("3g.40gb", 0, "MIG-aaaa"),
        ("3g.40gb", 4, None),
    ]
    assert "nvmlDeviceGetPowerUsage" in second["readings"]["supported"]
    assert "nvmlDeviceGetUtilizationRates" in first["readings"]["unsupported"]
    assert second["offer"].startswith("the whole GPU")


def test_a_host_without_nvml(host, monkeypatch, capsys):
    fake = host([])

    def missing():
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(fake.module, "nvmlInit", missing)
    assert probe.main([]) == 1
    assert "NVML cannot be used on this host" in capsys.readouterr().err


def test_gpucloud_agent_probe_runs_the_probe(host, capsys):
    host(a_host())
    with pytest.raises(SystemExit) as done:
        agent_main.main(["probe", "--json"])
    assert done.value.code == 0
    assert json.loads(capsys.readouterr().out)["gpus"][1]["model"] == "l4"
