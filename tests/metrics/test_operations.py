"""/metrics' operational families after real actions: hosts and their heartbeats, instances by
state, a launch that ran and one that failed, Celery task outcomes and queue depth, billing job
runs, websocket clients; each with the counters in this process and in Redis (as workers and
web processes share them)."""

import time
from datetime import timedelta

import pytest
from django.db import DatabaseError
from django.utils import timezone

from billing import services as billing_services
from billing import tasks as billing_tasks
from console.catalog.models import Mode
from console.celery import app
from console.fleet.models import Host
from console.instances import services, tasks
from console.instances.models import State
from console.metrics import counters
from tests.instances.conftest import Catalog
from tests.instances.fakes import FakeAgents
from tests.metrics.test_prometheus import families, scrape


@pytest.fixture(params=["memory", "redis"])
def shared(request, settings):
    """Counters in this process, or in Redis."""
    settings.REDIS_URL = request.getfixturevalue("redis_url") if request.param == "redis" else ""
    counters.reset()
    yield request.param
    counters.reset()


@pytest.fixture
def catalog(db):
    return Catalog()


def values(name: str, **match) -> list[float]:
    found = families(scrape()[1]).get(name, [])
    return [s.value for s in found if all(s.labels.get(k) == v for k, v in match.items())]


def value(family: str, sample: str | None = None, **match) -> float:
    found = families(scrape()[1]).get(family, [])
    [hit] = [
        s.value
        for s in found
        if s.name == (sample or family) and all(s.labels.get(k) == v for k, v in match.items())
    ]
    return hit


def launch(catalog, tenant, name):
    return services.launch_instance(tenant, name=name, spec=catalog.quarter, image=catalog.image)


def test_hosts_by_status_and_heartbeat_age(catalog, tenant):
    up = catalog.host("gpu-a")
    catalog.host("gpu-b", status=Host.Status.CORDONED)
    silent = catalog.host("gpu-c", status=Host.Status.UNREACHABLE)
    catalog.host("gpu-old", status=Host.Status.RETIRED)
    now = timezone.now()
    Host.objects.filter(pk=up.pk).update(last_heartbeat_at=now - timedelta(seconds=2))
    Host.objects.filter(pk=silent.pk).update(last_heartbeat_at=now - timedelta(seconds=95))
    Host.objects.filter(name="gpu-old").update(last_heartbeat_at=now - timedelta(days=3))

    assert value("gpucloud_hosts", status="active") == 1
    assert value("gpucloud_hosts", status="cordoned") == 1
    assert value("gpucloud_hosts", status="unreachable") == 1
    assert value("gpucloud_hosts", status="maintenance") == 0
    assert 2 <= value("gpucloud_host_heartbeat_age_seconds", host="gpu-a") < 10
    assert 95 <= value("gpucloud_host_heartbeat_age_seconds", host="gpu-c") < 105
    # never heard from, or retired: no age to page on
    assert not values("gpucloud_host_heartbeat_age_seconds", host="gpu-b")
    assert not values("gpucloud_host_heartbeat_age_seconds", host="gpu-old")


def test_instances_by_state_and_launches(
    catalog,
    tenant,
    shared,
    monkeypatch,
    django_capture_on_commit_callbacks,
):
    from console.fleet import agent_client
    from console.fleet.agent_client import AgentRejected

    FakeAgents().install(monkeypatch)
    catalog.host(gpus=2, mode=Mode.SHARED)

    def refuse(host, alloc_id, body):
        raise AgentRejected(host, "bad body", 400, "invalid_body")

    # the transitions' signals go after commit, as in a worker
    with django_capture_on_commit_callbacks(execute=True):
        ran = launch(catalog, tenant, "ran")
        tasks.provision.apply(args=[ran.pk])
        waiting = launch(catalog, tenant, "waiting")
        monkeypatch.setattr(agent_client, "create_allocation", refuse)
        failed = launch(catalog, tenant, "failed")
        tasks.provision.apply(args=[failed.pk])
    failed.refresh_from_db()
    assert failed.state == State.FAILED

    assert value("gpucloud_instances", state="running") == 1
    assert value("gpucloud_instances", state="provisioning") == 1  # `waiting`, not provisioned
    assert value("gpucloud_instances", state="failed") == 1
    assert value("gpucloud_instances", state="terminated") == 0
    assert value("gpucloud_instance_launch_seconds", "gpucloud_instance_launch_seconds_count") == 1
    assert value("gpucloud_instance_launch_seconds", "gpucloud_instance_launch_seconds_bucket",
                 le="+Inf") == 1  # fmt: skip
    assert (
        0 <= value("gpucloud_instance_launch_seconds", "gpucloud_instance_launch_seconds_sum") < 30
    )
    failures = families(scrape()[1])["gpucloud_instance_launch_failures"]
    assert {s.labels["reason"]: s.value for s in failures} == {"agent_rejected": 1}
    assert waiting.pk  # a launch still on its way is neither


def test_task_outcomes_and_billing_job_runs(db, shared, monkeypatch):
    before = time.time()
    billing_tasks.meter.apply()
    assert value("gpucloud_celery_tasks", "gpucloud_celery_tasks_total",
                 task="billing.tasks.meter", outcome="succeeded") == 1  # fmt: skip
    assert value("gpucloud_billing_job_runs", "gpucloud_billing_job_runs_total",
                 job="meter", outcome="succeeded") == 1  # fmt: skip
    assert value("gpucloud_billing_job_duration_seconds",
                 "gpucloud_billing_job_duration_seconds_count", job="meter") == 1  # fmt: skip
    last = value("gpucloud_billing_job_last_success_timestamp_seconds", job="meter")
    assert before <= last <= time.time()

    def broken():
        raise DatabaseError("the database went away")

    monkeypatch.setattr(billing_services, "run_meter", broken)
    monkeypatch.setattr(billing_tasks.finalize_invoices, "max_retries", 1)
    billing_tasks.finalize_invoices.apply()
    outcomes = {
        s.labels["outcome"]: s.value
        for s in families(scrape()[1])["gpucloud_celery_tasks"]
        if s.labels["task"] == "billing.tasks.finalize_invoices" and s.name.endswith("_total")
    }
    assert outcomes == {"retried": 1, "failed": 1}
    runs = {
        s.labels["outcome"]: s.value
        for s in families(scrape()[1])["gpucloud_billing_job_runs"]
        if s.labels["job"] == "finalize_invoices" and s.name.endswith("_total")
    }
    assert runs == {"retried": 1, "failed": 1}
    # a job that never succeeded has no last success
    assert not values(
        "gpucloud_billing_job_last_success_timestamp_seconds", job="finalize_invoices"
    )


def test_celery_queue_lengths_on_the_redis_broker(db, settings, redis_url):
    settings.REDIS_URL = redis_url
    settings.CELERY_BROKER_URL = redis_url
    assert value("gpucloud_celery_queue_length", queue="billing") == 0
    with app.connection_for_write(redis_url) as connection:
        for _ in range(3):
            app.send_task("billing.tasks.meter", queue="billing", connection=connection)
        app.send_task("console.instances.tasks.reconcile", queue="provisioning",
                      connection=connection)  # fmt: skip
    try:
        assert value("gpucloud_celery_queue_length", queue="billing") == 3
        assert value("gpucloud_celery_queue_length", queue="provisioning") == 1
        assert value("gpucloud_celery_queue_length", queue="metrics") == 0
        assert value("gpucloud_celery_unacked_tasks") == 0
    finally:
        with app.connection_for_write(redis_url) as connection:
            for queue in ("billing", "provisioning"):
                connection.default_channel.queue_purge(queue)


def test_without_a_redis_broker_no_queue_family(db, settings):
    settings.CELERY_BROKER_URL = "memory://"  # as without REDIS_URL (CI sets one)
    assert "gpucloud_celery_queue_length" not in families(scrape()[1])
