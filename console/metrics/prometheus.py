"""/metrics: the live window's latest sample of every GPU, MIG device and time-shared slice, in
Prometheus exposition format with the names and labels of NVIDIA's DCGM exporter, so that the
usual DCGM Grafana dashboards work on gpucloud.

Labels: `gpu` (index), `UUID` (the GPU's), `device` (`nvidia<index>`), `modelName`, `Hostname`;
MIG devices add `GPU_I_PROFILE` and `GPU_I_ID` (its first memory slice); a GPU, MIG device or
slice that an instance holds adds `tenant` (the tenant's slug) and `instance` (the instance id).
A time-shared GPU has its own series (no tenant) plus one per tenant's slice, with the slice's
own readings. Prometheus keeps a scraped `instance` label as `exported_instance` unless the scrape
job sets `honor_labels: true`.

Operators only: `Authorization: Bearer <METRICS_SCRAPE_TOKEN>`, or a client address in
METRICS_ALLOWED_IPS (addresses or networks)."""

import hmac
import ipaddress
import math

from django.conf import settings
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from console.fleet.models import Gpu
from console.metrics import live
from console.metrics.ingest import mig_devices

# A series whose latest sample is older than this is gone (its agent stopped reporting it).
STALE_SECONDS = 60


def _used(v):
    return v.get("mem_used_mib")


def _free(v):
    used, total = v.get("mem_used_mib"), v.get("mem_total_mib")
    return None if used is None or total is None else max(total - used, 0)


FAMILIES = [
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", lambda v: v.get("gpu_util")),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", _used),
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", _free),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", lambda v: v.get("temperature_c")),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", lambda v: v.get("power_w")),
    ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", lambda v: v.get("sm_clock_mhz")),
]


def _gpu_details() -> dict[tuple[int, int], tuple[str, str, dict[str, dict]]]:
    """(host id, index) → (UUID, model name, {MIG uuid: device}) of every GPU, in one query."""
    return {
        (host_id, index): (uuid, name, mig_devices(devices))
        for host_id, index, uuid, name, devices in Gpu.objects.values_list(
            "host_id", "index", "uuid", "name", "mig_devices"
        )
    }


def series_labels(value: dict, details: dict) -> dict[str, str] | None:
    """The DCGM labels of a latest sample, or None when it is not exported. The GPU's and MIG
    device's identity come from the console's records: a GPU or MIG device the console does not
    have (any more) is not exported."""
    kind = value.get("kind")
    if kind == "allocation" and value.get("mode") != "shared":
        return None  # whole GPUs and MIG devices are exported as such, with their owner
    index = value.get("gpu")
    known = details.get((value.get("host"), index))
    if known is None:
        return None
    uuid, model, devices = known
    labels = {
        "gpu": str(index),
        "UUID": uuid,
        "device": f"nvidia{index}",
        "modelName": model,
        "Hostname": value.get("hostname") or "",
    }
    if kind == "mig":
        device = devices.get(value.get("mig_uuid"))
        if device is None:
            return None
        labels["GPU_I_PROFILE"] = str(device.get("profile", ""))
        labels["GPU_I_ID"] = str(device.get("start", ""))
    if value.get("tenant"):
        labels["tenant"] = str(value["tenant"])
        labels["instance"] = str(value["instance"])
    return labels


class LiveCollector(Collector):
    """Collects the live window's latest samples at each scrape."""

    def __init__(self, now: float | None = None):
        self.now = now

    def collect(self):
        now = live.now() if self.now is None else self.now
        latest = live.store().latest()
        details = _gpu_details() if latest else {}
        rows = []
        for series in sorted(latest):
            value = latest[series]
            if value.get("ts", 0) < now - STALE_SECONDS:
                continue
            labels = series_labels(value, details)
            if labels is not None:
                rows.append((labels, value))
        for name, documentation, read in FAMILIES:
            metric = Metric(name, documentation, "gauge")
            for labels, value in rows:
                number = read(value)
                if number is None or (isinstance(number, float) and math.isnan(number)):
                    continue
                metric.add_sample(name, labels, float(number))
            yield metric


def scrape_allowed(request) -> bool:
    token = settings.METRICS_SCRAPE_TOKEN
    header = request.headers.get("Authorization", "")
    if token and header.startswith("Bearer "):
        return hmac.compare_digest(header[len("Bearer ") :].strip().encode(), token.encode())
    try:
        client = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        return False
    client = getattr(client, "ipv4_mapped", None) or client
    for allowed in settings.METRICS_ALLOWED_IPS:
        try:
            if client in ipaddress.ip_network(allowed.strip(), strict=False):
                return True
        except ValueError:
            continue
    return False
