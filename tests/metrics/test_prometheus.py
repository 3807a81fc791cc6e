"""/metrics: DCGM exporter names and labels, parsed as Prometheus parses them; operators only."""

import time

import pytest
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from agent.samples import make_sample
from console.catalog.models import Mode
from console.fleet.models import Gpu
from console.instances.models import Allocation
from console.metrics import ingest
from tests.metrics.conftest import alloc_sample, gpu_sample

DCGM = {
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_SM_CLOCK",
}


def scrape(client=None, **extra) -> tuple[int, str]:
    response = (client or Client()).get("/metrics", **extra)
    return response.status_code, response.content.decode()


def families(text: str) -> dict[str, list]:
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def by_labels(samples, **match):
    return [s for s in samples if all(s.labels.get(k) == v for k, v in match.items())]


@pytest.fixture
def scraped(world):
    now = time.time()
    ingest.ingest_samples(
        world.host,
        [
            gpu_sample(now, 0, util=87.0, mem_used_mib=30000, temperature_c=66.0, power_w=310.5),
            gpu_sample(now, 1, util=0.0, mem_used_mib=0, sm_clock_mhz=210),
            alloc_sample(now, "alloc-train", util=40.0, mem_used_mib=8000),
            alloc_sample(now, "alloc-infer", util=95.0, mem_used_mib=12000),
        ],
    )
    ingest.ingest_samples(
        world.host_b,
        [
            gpu_sample(now, 0, host="host-b", util=100.0),
            gpu_sample(now, 1, host="host-b", util=98.0),
            alloc_sample(now, "alloc-big", host="host-b", util=99.0),
        ],
    )
    status, text = scrape()
    assert status == 200
    return families(text)


def test_names_are_the_dcgm_exporters(scraped):
    assert set(scraped) >= DCGM
    assert all(f.startswith(("DCGM_FI_DEV_", "gpucloud_")) for f in scraped)


def test_gpu_series_have_dcgm_labels_and_values(world, scraped):
    def gpu_value(name, index="0"):
        [sample] = by_labels(scraped[name], Hostname="host-a", gpu=index, tenant=None)
        return sample

    gpu0 = gpu_value("DCGM_FI_DEV_GPU_UTIL")
    assert gpu0.labels == {
        "gpu": "0",
        "UUID": "GPU-host-a-0",
        "device": "nvidia0",
        "modelName": "NVIDIA A100-SXM4-80GB",
        "Hostname": "host-a",
    }
    assert gpu0.value == 87.0
    assert gpu_value("DCGM_FI_DEV_FB_USED").value == 30000
    assert gpu_value("DCGM_FI_DEV_FB_FREE").value == 81920 - 30000
    assert gpu_value("DCGM_FI_DEV_GPU_TEMP").value == 66.0
    assert gpu_value("DCGM_FI_DEV_POWER_USAGE").value == 310.5
    assert gpu_value("DCGM_FI_DEV_SM_CLOCK", "1").value == 210
    assert gpu_value("DCGM_FI_DEV_GPU_UTIL", "1").value == 0.0


def test_time_shared_slices_carry_tenant_and_instance(world, scraped):
    util = by_labels(scraped["DCGM_FI_DEV_GPU_UTIL"], Hostname="host-a", gpu="0")
    assert len(util) == 3  # the GPU itself, and each tenant's slice of it
    slices = {s.labels.get("tenant"): s for s in util}
    assert slices["acme"].labels["instance"] == str(world.train.pk)
    assert slices["acme"].value == 40.0
    assert slices["globex"].labels["instance"] == str(world.infer.pk)
    assert slices["globex"].value == 95.0
    assert "instance" not in slices[None].labels


def test_whole_gpus_carry_their_instance(world, scraped):
    for index, value in (("0", 100.0), ("1", 98.0)):
        [gpu] = by_labels(scraped["DCGM_FI_DEV_GPU_UTIL"], Hostname="host-b", gpu=index)
        assert (gpu.labels["tenant"], gpu.labels["instance"]) == ("acme", str(world.big.pk))
        assert gpu.value == value


def test_mig_devices_carry_profile_and_owner(world):
    gpu = Gpu.objects.get(host=world.host, index=1)
    gpu.mode = Mode.MIG
    gpu.mig_devices = [{"uuid": "MIG-1", "profile": "3g.40gb", "start": 4, "size": 4}]
    gpu.save()
    Allocation.objects.filter(pk="alloc-train").update(
        mode="mig",
        request={"mode": "mig", "gpus": [1], "mig": {"profile": "3g.40gb", "start": 4, "size": 4}},
    )
    now = time.time()
    mig = make_sample(now, "mig", 1, "GPU-host-a-1", mig_uuid="MIG-1", gpu_util=33.0,
                      mem_used_mib=1000, mem_total_mib=40192)  # fmt: skip
    ingest.ingest_samples(
        world.host, [mig, {**mig, "kind": "allocation", "allocation": "alloc-train"}]
    )
    util = families(scrape()[1])["DCGM_FI_DEV_GPU_UTIL"]
    [series] = util
    assert series.labels == {
        "gpu": "1",
        "UUID": "GPU-host-a-1",
        "device": "nvidia1",
        "modelName": "NVIDIA A100-SXM4-80GB",
        "Hostname": "host-a",
        "GPU_I_PROFILE": "3g.40gb",
        "GPU_I_ID": "4",
        "tenant": "acme",
        "instance": str(world.train.pk),
    }
    assert series.value == 33.0


def test_stale_series_are_not_exposed(world, monkeypatch):
    ingest.ingest_samples(world.host, [gpu_sample(time.time() - 120, 0)])
    assert not families(scrape()[1]).get("DCGM_FI_DEV_GPU_UTIL")


@pytest.mark.parametrize(
    ("remote", "header", "status"),
    [
        ("127.0.0.1", None, 200),
        ("10.1.2.3", None, 403),
        ("10.1.2.3", "Bearer scrape-secret", 200),
        ("10.1.2.3", "Bearer wrong", 403),
        ("192.168.7.9", None, 200),  # inside an allowed network
    ],
)
def test_operators_only(db, settings, remote, header, status):
    settings.METRICS_SCRAPE_TOKEN = "scrape-secret"
    settings.METRICS_ALLOWED_IPS = ["127.0.0.1", "::1", "192.168.7.0/24"]
    extra = {"REMOTE_ADDR": remote}
    if header:
        extra["HTTP_AUTHORIZATION"] = header
    code, text = scrape(**extra)
    assert code == status
    if status == 403:
        assert "DCGM" not in text


def test_without_a_token_setting_no_bearer_gets_in(db, settings):
    settings.METRICS_SCRAPE_TOKEN = ""
    assert scrape(REMOTE_ADDR="10.1.2.3", HTTP_AUTHORIZATION="Bearer ")[0] == 403
