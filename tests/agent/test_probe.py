"""`gpucloud-agent probe` against the strict fake NVML (there is no GPU here): what it reads,
what it says is missing, and that it changes nothing."""

import json
import subprocess

import pynvml
import pytest

from agent import __main__ as agent_main
from agent import firewall, probe
from agent.backends import nvml as nvml_backend
from agent.backends.nvml import dcgm as nvml_dcgm
from agent.backends.nvml.access import MigAccess
from agent.runtimes import oci
from tests.agent.fake_nvml import MIB, FakeNvml, gpu, gpu_instance, mig_device

ROOT = MigAccess(root=True, cap_sys_admin=True, config=None, monitor=None)
USER = MigAccess(root=False, cap_sys_admin=False, config=False, monitor=False)
NO_ENGINE = {"url": None, "line": "container engine: none found", "gpu_path": None, "warnings": []}


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
        monkeypatch.setattr(firewall, "check", lambda: ("nftables v1.0.6; usable", True))
        monkeypatch.setattr(probe, "describe_engine", lambda url: NO_ENGINE)
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
    monkeypatch.setattr(probe, "describe_engine", lambda url: oci_engine(monkeypatch, DOCKER))
    assert probe.main([]) == 1
    said = capsys.readouterr()
    assert "NVML cannot be used on this host" in said.err
    # the rest of the host is reported all the same
    assert "GPUs: NVML cannot be used on this host" in said.out
    assert "container engine: docker 27.5.1 at unix:///x.sock" in said.out
    assert "user namespaces: remapped (dockerd --userns-remap)" in said.out
    assert "writable layers: bounded (btrfs driver)" in said.out
    assert "engine restart: every container is stopped (live-restore off)" in said.out
    assert "nftables: nftables v1.0.6; usable" in said.out
    assert "  - engine restart: every container is stopped" in said.out
    assert probe.main(["--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["gpus"] == [] and report["engine"]["kind"] == "docker"


DOCKER = (
    {"Version": "27.5.1", "Components": [{"Name": "Engine"}]},
    {
        "SecurityOptions": ["name=seccomp,profile=builtin", "name=userns"],
        "LiveRestoreEnabled": False,
        "Driver": "btrfs",
        "DriverStatus": [["Btrfs", ""]],
    },
)


class FakeClient:
    answers = DOCKER

    def __init__(self, base_url, timeout):
        self.base_url = base_url

    def version(self):
        return self.answers[0]

    def info(self):
        return self.answers[1]

    def close(self):
        pass


def oci_engine(monkeypatch, answers, url="unix:///x.sock"):
    """describe_engine against an engine that answers `answers` (version, info)."""
    monkeypatch.setattr(FakeClient, "answers", answers)
    monkeypatch.setattr(oci.docker, "DockerClient", FakeClient)
    return oci.describe_engine(url)


def test_the_engine_report_says_what_a_docker_restart_would_do(monkeypatch):
    version, info = DOCKER
    off = oci_engine(monkeypatch, DOCKER)
    assert (off["kind"], off["version"], off["gpu_path"]) == ("docker", "27.5.1", "nvidia")
    assert off["restart"].startswith("every container is stopped (live-restore off)")
    assert '"live-restore": true' in off["restart"]
    assert [w.split(":")[0] for w in off["warnings"]] == ["engine restart"]
    on = oci_engine(monkeypatch, (version, {**info, "LiveRestoreEnabled": True}))
    assert on["restart"].startswith("containers survive (live-restore on)")
    assert on["warnings"] == []


def test_the_engine_report_warns_of_shared_user_namespaces_and_unbounded_layers(monkeypatch):
    version, info = DOCKER
    bare = {"SecurityOptions": ["name=seccomp"], "Driver": "overlay2", "LiveRestoreEnabled": True}
    bare["DriverStatus"] = [["Backing Filesystem", "extfs"]]
    report = oci_engine(monkeypatch, (version, bare))
    assert report["user_namespaces"].startswith("NOT remapped")
    assert report["writable_layers"] == "not bounded (overlay2 driver on extfs)"
    assert [w.split(":")[0] for w in report["warnings"]] == [
        "user namespaces",
        "containers' writable layers not bounded (overlay2 driver on extfs)",
    ]


def test_podmans_containers_outlive_its_service(monkeypatch):
    monkeypatch.setattr(oci, "_subid_range", lambda owner: owner == "containers")
    version = {"Version": "4.3.1", "Components": [{"Name": "Podman Engine"}]}
    report = oci_engine(monkeypatch, (version, {"Driver": "btrfs"}))
    assert (report["kind"], report["gpu_path"]) == ("podman", "cdi")
    assert "conmon runs each container" in report["restart"]
    assert report["user_namespaces"].startswith("each container its own")
    assert report["warnings"] == []


def test_no_engine_or_one_that_does_not_answer(monkeypatch):
    monkeypatch.setattr(oci, "running_engine", lambda: None)
    assert oci.describe_engine(None)["line"].startswith("container engine: none found")

    class Refused(FakeClient):
        def version(self):
            raise oci.DockerException("connection refused")

    monkeypatch.setattr(oci.docker, "DockerClient", Refused)
    report = oci.describe_engine("unix:///gone.sock")
    assert (
        report["line"]
        == "container engine at unix:///gone.sock does not answer: connection refused"
    )
    assert report["gpu_path"] is None


@pytest.mark.parametrize(
    "version, listing, said, usable",
    [
        (
            (0, "nftables v1.0.6\n", ""),
            (0, "table inet gpucloud\n", ""),
            "usable (the agent's table is there)",
            True,
        ),
        (
            (0, "nftables v1.0.6\n", ""),
            (0, "table ip nat\n", ""),
            "usable (the agent's table is not there yet)",
            True,
        ),
        (
            (0, "nftables v1.0.6\n", ""),
            (1, "", "Error: Operation not permitted\n"),
            "fails (Error: Operation not permitted): the agent needs root",
            False,
        ),
    ],
)
def test_nftables_is_checked_without_changing_it(monkeypatch, version, listing, said, usable):
    answers = iter([version, listing])
    asked = []

    def run(command, **kwargs):
        asked.append(command)
        code, out, err = next(answers)
        return subprocess.CompletedProcess(command, code, out, err)

    monkeypatch.setattr(firewall.subprocess, "run", run)
    text, ok = firewall.check()
    assert said in text and ok is usable
    assert asked == [["nft", "--version"], ["nft", "list", "tables"]]  # reads only


def test_without_nft_the_probe_says_so(monkeypatch):
    def run(command, **kwargs):
        raise FileNotFoundError(2, "No such file or directory", "nft")

    monkeypatch.setattr(firewall.subprocess, "run", run)
    text, ok = firewall.check()
    assert text.startswith("nft cannot be run") and not ok


def test_gpucloud_agent_probe_runs_the_probe(host, capsys):
    host(a_host())
    with pytest.raises(SystemExit) as done:
        agent_main.main(["probe", "--json"])
    assert done.value.code == 0
    assert json.loads(capsys.readouterr().out)["gpus"][1]["model"] == "l4"
