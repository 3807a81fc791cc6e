"""/metrics' operational families, beside the DCGM ones: what an operator pages on. Each scrape
costs three aggregate queries (hosts by status with their heartbeats, instances by state), one
Redis pipeline for the queue lengths, one HGETALL for the shared counters and one hash per web
process for the websocket clients.

- `gpucloud_hosts{status}`: hosts by status (every status, 0 when none).
- `gpucloud_host_heartbeat_age_seconds{host}`: seconds since each host's agent was last heard
  (hosts that are not retired and have been heard).
- `gpucloud_host_ssh_gateway_certified{host}`: 1 when a host's SSH gateway holds a valid
  certificate of the console's CA, 0 when users cannot reach it through the SSH front (hosts
  with a gateway, not retired, behind a console that runs a front).
- `gpucloud_instances{state}`: instances by state (every state, 0 when none).
- `gpucloud_celery_queue_length{queue}`: tasks waiting in each broker queue (Redis broker);
  `gpucloud_celery_unacked_tasks`: tasks workers have taken and not finished.
- `gpucloud_websocket_clients{kind}`: connected websocket clients by consumer kind.
- counted families (console.metrics.counters): task outcomes and billing jobs
  (console.metrics.task_outcomes), launch latency and failures (console.metrics.launches)."""

from collections import defaultdict

from django.conf import settings
from django.db.models import Count
from django.utils import timezone
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.registry import Collector

from console import socket_census
from console.fleet import ssh_authority
from console.fleet.models import Host
from console.instances.models import Instance, State
from console.metrics import counters

# Kombu's Redis transport keeps a queue's tasks of priority p > 0 in `<queue>\x06\x16<p>`.
_PRIORITY_SEPARATOR = "\x06\x16"
_PRIORITY_STEPS = (0, 3, 6, 9)

COUNTERS = {
    "gpucloud_celery_tasks_total": "Celery task runs by task and outcome.",
    "gpucloud_instance_launch_failures_total": "Launches that failed before running, by reason.",
    "gpucloud_billing_job_runs_total": "Billing job runs by job and outcome.",
}
GAUGES = {
    "gpucloud_billing_job_last_success_timestamp_seconds": "When each billing job last succeeded.",
}
HISTOGRAMS = {
    "gpucloud_instance_launch_seconds": "Seconds from a launch request to its first running.",
    "gpucloud_billing_job_duration_seconds": "Seconds each billing job run took.",
}


def queues() -> list[str]:
    """The broker queues the settings route tasks to."""
    names = {settings.CELERY_TASK_DEFAULT_QUEUE}
    names.update(route["queue"] for route in settings.CELERY_TASK_ROUTES.values())
    return sorted(names)


def queue_lengths() -> tuple[dict[str, int], int] | None:
    """(queue → waiting tasks, unacked tasks), or None without a Redis broker."""
    if not settings.CELERY_BROKER_URL.startswith(("redis://", "rediss://", "unix://")):
        return None
    import redis

    prefix = settings.CELERY_BROKER_TRANSPORT_OPTIONS.get("global_keyprefix", "")
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL, socket_timeout=2)
    try:
        pipe = client.pipeline(transaction=False)
        names = queues()
        for name in names:
            for step in _PRIORITY_STEPS:
                pipe.llen(prefix + (f"{name}{_PRIORITY_SEPARATOR}{step}" if step else name))
        pipe.hlen(prefix + "unacked")
        *lengths, unacked = pipe.execute()
    finally:
        client.close()
    per_queue = len(_PRIORITY_STEPS)
    return {
        name: sum(lengths[i * per_queue : (i + 1) * per_queue]) for i, name in enumerate(names)
    }, unacked


class OperationsCollector(Collector):
    def collect(self):
        yield from self._hosts()
        yield from self._instances()
        yield from self._queues()
        websockets = GaugeMetricFamily(
            "gpucloud_websocket_clients", "Connected websocket clients by consumer kind.",
            labels=["kind"],
        )  # fmt: skip
        for kind, n in sorted(socket_census.connected().items()):
            websockets.add_metric([kind], n)
        yield websockets
        yield from self._counted()

    def _hosts(self):
        by_status = GaugeMetricFamily("gpucloud_hosts", "Hosts by status.", labels=["status"])
        heartbeat = GaugeMetricFamily(
            "gpucloud_host_heartbeat_age_seconds",
            "Seconds since each host's agent was last heard.",
            labels=["host"],
        )
        certified = GaugeMetricFamily(
            "gpucloud_host_ssh_gateway_certified",
            "1 when the host's SSH gateway holds a valid certificate of the console's CA.",
            labels=["host"],
        )
        engine_up = GaugeMetricFamily(
            "gpucloud_host_engine_up",
            "0 while the host's agent says its container engine does not answer, else 1.",
            labels=["host"],
        )
        counts = dict.fromkeys(Host.Status.values, 0)
        now = timezone.now()
        hosts = Host.objects.only(
            "name", "status", "last_heartbeat_at", "ssh_port", "ssh_host_key",
            "ssh_certificate_expires_at", "engine_down_since",
        ).order_by("name")  # fmt: skip
        for host in hosts:
            counts[host.status] = counts.get(host.status, 0) + 1
            if host.status == Host.Status.RETIRED:
                continue
            if host.last_heartbeat_at is not None:
                age = (now - host.last_heartbeat_at).total_seconds()
                heartbeat.add_metric([host.name], max(age, 0.0))
            if settings.SSH_FRONT and host.ssh_port and host.ssh_host_key:
                certified.add_metric([host.name], 0 if ssh_authority.uncertified(host, now) else 1)
            engine_up.add_metric([host.name], 0 if host.engine_down_since else 1)
        for status, n in counts.items():
            by_status.add_metric([status], n)
        yield by_status
        yield heartbeat
        yield certified
        yield engine_up

    def _instances(self):
        metric = GaugeMetricFamily("gpucloud_instances", "Instances by state.", labels=["state"])
        counts = dict.fromkeys(State.values, 0)
        for row in Instance.objects.order_by().values("state").annotate(n=Count("pk")):
            counts[row["state"]] = row["n"]
        for state, n in counts.items():
            metric.add_metric([state], n)
        yield metric

    def _queues(self):
        found = queue_lengths()
        if found is None:
            return
        lengths, unacked = found
        metric = GaugeMetricFamily(
            "gpucloud_celery_queue_length", "Tasks waiting in each Celery queue.", labels=["queue"]
        )
        for name, n in lengths.items():
            metric.add_metric([name], n)
        yield metric
        yield GaugeMetricFamily(
            "gpucloud_celery_unacked_tasks",
            "Tasks that workers have taken and not yet finished.",
            value=unacked,
        )

    def _counted(self):
        values = counters.read()
        by_name: dict[str, list] = defaultdict(list)
        for (name, labels), value in sorted(values.items()):
            by_name[name].append((dict(labels), value))
        for name, documentation in COUNTERS.items():
            yield _family(CounterMetricFamily, name, documentation, by_name.get(name, []))
        for name, documentation in GAUGES.items():
            yield _family(GaugeMetricFamily, name, documentation, by_name.get(name, []))
        for name, documentation in HISTOGRAMS.items():
            yield _histogram(name, documentation, by_name)


def _family(kind, name, documentation, rows):
    keys = sorted({k for labels, _ in rows for k in labels})
    family = kind(name.removesuffix("_total"), documentation, labels=keys)
    for labels, value in rows:
        family.add_metric([labels.get(k, "") for k in keys], value)
    return family


def _histogram(name, documentation, by_name):
    """A histogram family from its counted `_bucket`, `_sum` and `_count` fields."""
    series: dict[tuple, dict] = defaultdict(lambda: {"buckets": {}, "sum": 0.0})
    for labels, value in by_name.get(f"{name}_bucket", []):
        le = labels.pop("le")
        series[tuple(sorted(labels.items()))]["buckets"][le] = value
    for labels, value in by_name.get(f"{name}_sum", []):
        series[tuple(sorted(labels.items()))]["sum"] = value
    keys = sorted({k for labels in series for k, _ in labels})
    family = HistogramMetricFamily(name, documentation, labels=keys)
    bounds = [counters.le(b) for b in counters.SECONDS_BUCKETS]
    for labels, data in sorted(series.items()):
        known = dict(labels)
        # Each observation counted in every bucket it fits: a bound without a field has none.
        buckets = [(bound, data["buckets"].get(bound, 0.0)) for bound in bounds]
        family.add_metric([known.get(k, "") for k in keys], buckets, data["sum"])
    return family
