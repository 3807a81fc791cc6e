"""A real Prometheus server (Debian's `prometheus`) scrapes /metrics of the live stack."""

import shutil
import subprocess
import time

import httpx
import pytest

from console import processes
from tests.metrics.realstack import bring_up_host, launch

PROMETHEUS = shutil.which("prometheus")

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        PROMETHEUS is None, reason="no prometheus binary: apt-get install -y prometheus"
    ),
]


def query(base: str, promql: str) -> list[dict]:
    response = httpx.get(f"{base}/api/v1/query", params={"query": promql}, timeout=5)
    response.raise_for_status()
    return response.json()["data"]["result"]


def test_prometheus_scrapes_dcgm_series_with_tenants(stack, tenant, other_tenant, tmp_path):
    host = bring_up_host(stack, "gpu-host-3")
    train = launch(host, tenant, "train", util=30.0)
    infer = launch(host, other_tenant, "infer", util=80.0)

    port = processes.free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        "scrape_configs:\n  - job_name: gpucloud\n    metrics_path: /metrics\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{stack.port}']\n"
    )
    log = (tmp_path / "prometheus.log").open("wb")
    server = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        processes.wait_http(f"{base}/-/ready", timeout=30, proc=server)
        deadline = time.monotonic() + 30
        series = []
        while time.monotonic() < deadline:
            series = query(base, 'DCGM_FI_DEV_GPU_UTIL{Hostname="gpu-host-3"}')
            if len({s["metric"].get("exported_instance") for s in series}) == 3:
                break
            time.sleep(0.5)
        assert query(base, 'up{job="gpucloud"}')[0]["value"][1] == "1"
        by_owner = {s["metric"].get("exported_instance"): s for s in series}
        # gpu0 and gpu1 themselves (nobody's), and each tenant's slice of gpu0
        assert set(by_owner) == {None, str(train.pk), str(infer.pk)}, series
        assert {s["metric"]["gpu"] for s in series if "tenant" not in s["metric"]} == {"0", "1"}
        acme = by_owner[str(train.pk)]["metric"]
        assert (acme["tenant"], acme["gpu"], acme["UUID"]) == (
            "acme",
            "0",
            host.gpus.get(index=0).uuid,
        )
        assert acme["modelName"] and acme["Hostname"] == "gpu-host-3"
        assert abs(float(by_owner[str(infer.pk)]["value"][1]) - 80.0) <= 2.5
        for name in (
            "DCGM_FI_DEV_FB_USED",
            "DCGM_FI_DEV_FB_FREE",
            "DCGM_FI_DEV_GPU_TEMP",
            "DCGM_FI_DEV_POWER_USAGE",
            "DCGM_FI_DEV_SM_CLOCK",
        ):
            assert query(base, f'{name}{{Hostname="gpu-host-3"}}'), name
        # the operational families, from the same scrape
        assert float(query(base, 'gpucloud_hosts{status="active"}')[0]["value"][1]) == 1
        [age] = query(base, 'gpucloud_host_heartbeat_age_seconds{host="gpu-host-3"}')
        assert 0 <= float(age["value"][1]) < 30
        assert float(query(base, 'gpucloud_instances{state="running"}')[0]["value"][1]) == 2
        queues = {s["metric"]["queue"] for s in query(base, "gpucloud_celery_queue_length")}
        assert queues >= {"default", "provisioning", "billing", "metrics"}
    finally:
        server.terminate()
        server.wait(timeout=10)
        log.close()
