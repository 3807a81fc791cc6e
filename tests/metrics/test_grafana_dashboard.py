"""deploy/grafana/gpucloud.json parses as a Grafana dashboard, and every metric its queries
use is one that /metrics exposes (by the families' TYPE lines: a counter as `<name>_total`, a
histogram as `<name>_bucket`, `_sum` and `_count`)."""

import json
import re
from pathlib import Path

from tests.metrics.test_prometheus import scrape

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "gpucloud.json"
METRIC = re.compile(r"\b(gpucloud_[a-z_]+|DCGM_FI_DEV_[A-Z_]+)\b")
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def exposed_names(text: str) -> set[str]:
    names = set()
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", text, re.MULTILINE):
        names.update(name.removesuffix("_total") + suffix for suffix in SUFFIXES[kind])
    return names


def test_every_query_uses_an_exposed_metric(db, settings, redis_url):
    settings.CELERY_BROKER_URL = redis_url  # the queue families come with a Redis broker
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {m for expr in exprs for m in METRIC.findall(expr)}
    status, text = scrape()
    assert status == 200
    exposed = exposed_names(text) | {
        # DCGM families have series only while agents push samples
        "DCGM_FI_DEV_GPU_UTIL",
    }
    assert used - exposed == set()
    # a panel for each operational family
    families = {re.sub(r"_(total|bucket|sum|count)$", "", m) for m in used}
    assert families >= {
        "gpucloud_hosts",
        "gpucloud_host_heartbeat_age_seconds",
        "gpucloud_instances",
        "gpucloud_instance_launch_seconds",
        "gpucloud_instance_launch_failures",
        "gpucloud_celery_queue_length",
        "gpucloud_celery_unacked_tasks",
        "gpucloud_celery_tasks",
        "gpucloud_websocket_clients",
        "gpucloud_billing_job_runs",
        "gpucloud_billing_job_duration_seconds",
        "gpucloud_billing_job_last_success_timestamp_seconds",
    }


def test_panels_are_well_formed():
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"] == "gpucloud"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert panel["targets"], panel["title"]
        assert all(t["expr"] and t["refId"] for t in panel["targets"])
