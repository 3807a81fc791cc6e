"""Two deployments (production and staging) on one Redis server, on one database number or on
two: nothing one of them sends or keeps there (group messages, live metric samples, cache
entries, Celery tasks) reaches the other, because every name carries the deployment's
DEPLOYMENT_NAME. A database number alone would not do: Redis pub/sub ignores it.

Each deployment's settings are console/settings.py as its processes compute them from their
environment. The Redis is a real server: REDIS_URL's, else the one on 127.0.0.1:6379, else a
redis-server of the module's own; the tests touch only their deployments' keys."""

import asyncio
import os
import runpy
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis
from celery import Celery
from channels.layers import channel_layers
from channels_redis.pubsub import RedisPubSubChannelLayer
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string
from kombu import Exchange, Queue

from console import broadcast, processes
from console.metrics import ingest, live
from tests.harness import Proc
from tests.metrics.communicator import run

SETTINGS = Path(__file__).resolve().parent.parent / "console" / "settings.py"
REDIS_SETTINGS = (
    "REDIS_URL",
    "DEPLOYMENT_NAME",
    "CHANNEL_LAYERS",
    "CACHES",
    "CELERY_BROKER_URL",
    "CELERY_BROKER_TRANSPORT_OPTIONS",
)
# The queue of the Celery test and the worker of staging that consumes it
ISOLATION = Queue("isolation", Exchange("isolation"), routing_key="isolation")
WORKER = [
    processes.PYTHON, "-m", "celery", "-A", "console", "worker", "-Q", "isolation",
    "-n", "staging@%h", "--pool", "solo", "--without-gossip", "--without-mingle",
]  # fmt: skip


def settings_of(monkeypatch, var_dir: Path, **env: str) -> dict:
    """console/settings.py as a process with `env` (and nothing else of ours) computes it."""
    with monkeypatch.context() as patch:
        for name in ("DATABASE_URL", "REDIS_URL", "DEPLOYMENT_NAME", "GPUCLOUD_SQLITE_PATH"):
            patch.delenv(name, raising=False)
        patch.setenv("GPUCLOUD_VAR_DIR", str(var_dir))
        for name, value in env.items():
            patch.setenv(name, value)
        return runpy.run_path(str(SETTINGS))


@dataclass
class Deployment:
    name: str
    env: dict[str, str]
    conf: dict  # its settings

    def layer(self) -> RedisPubSubChannelLayer:
        return RedisPubSubChannelLayer(**self.conf["CHANNEL_LAYERS"]["default"]["CONFIG"])

    def cache(self):
        params = dict(self.conf["CACHES"]["default"])
        backend = import_string(params.pop("BACKEND"))
        return backend(params.pop("LOCATION"), params)

    def celery(self) -> Celery:
        return Celery(
            broker=self.conf["CELERY_BROKER_URL"],
            broker_transport_options=self.conf["CELERY_BROKER_TRANSPORT_OPTIONS"],
        )


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory):
    """redis://host:port of a real Redis server."""
    url = os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0"
    proc = None
    try:
        redis.Redis.from_url(url, socket_timeout=2).ping()
    except redis.ConnectionError:
        url, proc = processes.start_local_redis(tmp_path_factory.mktemp("redis") / "redis.log")
    yield urlunsplit(urlsplit(url)._replace(path=""))
    if proc is not None:
        proc.terminate()
        proc.wait(10)


@pytest.fixture(params=[(7, 7), (7, 11)], ids=["one-database", "two-databases"])
def deployments(request, redis_server, tmp_path, monkeypatch):
    """(production, staging), named apart from any other run's on the same server."""
    run_id = secrets.token_hex(3)
    pair = []
    for label, db in zip(("prod", "staging"), request.param, strict=True):
        env = {"REDIS_URL": f"{redis_server}/{db}", "DEPLOYMENT_NAME": f"{label}-{run_id}"}
        conf = settings_of(monkeypatch, tmp_path / label, **env)
        pair.append(Deployment(env["DEPLOYMENT_NAME"], env, conf))
    yield tuple(pair)
    for deployment in pair:
        client = redis.Redis.from_url(deployment.env["REDIS_URL"])
        keys = list(client.scan_iter(match=f"{deployment.name}:*"))
        if keys:
            client.delete(*keys)


@pytest.fixture
def become(settings):
    """Make this test process one of a deployment's processes (its Redis settings)."""

    def switch(deployment: Deployment) -> None:
        for name in REDIS_SETTINGS:
            setattr(settings, name, deployment.conf[name])
        channel_layers.backends.clear()
        live.reset_store()

    yield switch
    channel_layers.backends.clear()
    live.reset_store()


async def _collect(layer, channel: str, into: list) -> None:
    while True:
        into.append(await layer.receive(channel))


async def _until(arrived, send=None, timeout: float = 5.0) -> None:
    """Wait until `arrived()`, calling `send()` meanwhile if given: a SUBSCRIBE may still be on
    its way when it first runs."""
    deadline = time.monotonic() + timeout
    while not arrived():
        assert time.monotonic() < deadline, "nothing arrived"
        if send is not None:
            await send()
        await asyncio.sleep(0.1)


def test_a_group_message_of_one_deployment_never_reaches_the_other(deployments, become):
    prod, staging = deployments
    become(prod)  # the live metrics' pipeline publishes as prod's web process would
    groups = [ingest.instance_group(1), ingest.tenant_group(1)]
    frame = {"type": "metrics.frames", "frames": [[1.0, '{"type":"sample","gpu_util":42.0}']]}

    async def scenario():
        layers = {d.name: d.layer() for d in deployments}
        got = {d.name: [] for d in deployments}
        listeners = []
        for name, layer in layers.items():
            channel = await layer.new_channel()
            for group in groups:
                await layer.group_add(group, channel)
            listeners.append(asyncio.ensure_future(_collect(layer, channel, got[name])))
        for name, layer in layers.items():  # each hears itself: its subscriptions are live

            async def hello(layer=layer, name=name):
                await layer.group_send(groups[0], {"type": "hello", "from": name})

            await _until(lambda name=name: got[name], hello)

        for group in groups:  # instance states and notes
            await layers[prod.name].group_send(group, {"type": "state", "from": prod.name})
        # a metrics sample, as ingest publishes it: in the pipeline that writes the window
        live.store().add([], {}, time.time(), publish=broadcast.pubsub_wire([(groups[0], frame)]))
        # One subscriber connection gets messages in the order Redis took them: whatever of
        # prod's reached staging would come before staging's own last one.
        done = {"type": "done", "from": staging.name}
        await layers[staging.name].group_send(groups[0], done)
        await _until(lambda: done in got[staging.name])
        await _until(lambda: frame in got[prod.name])
        for listener in listeners:
            listener.cancel()
        await asyncio.gather(*listeners, return_exceptions=True)
        for layer in layers.values():
            await layer.flush()
        return got

    got = run(scenario)
    assert {m.get("from") for m in got[staging.name]} == {staging.name}
    assert [m["type"] for m in got[prod.name] if m["type"] != "hello"] == [
        "state",
        "state",
        "metrics.frames",
    ]


def test_a_sample_in_one_deployments_live_window_is_not_in_the_others(deployments, become):
    prod, staging = deployments
    series, now = ingest.instance_series(1), time.time()
    become(prod)
    point = live.Point(series, now, (42.0, 1000, 81920, 60.0, 200.0, 1410))
    live.store().add([point], {series: '{"kind":"allocation"}'}, now)

    become(staging)
    assert live.store().window(series) == []
    assert live.store().latest() == {}
    assert live.store().minutes() == []
    live.store().clear()  # staging's clear leaves prod's window alone

    become(prod)
    assert [row[1] for row in live.store().window(series)] == [42.0]
    assert list(live.store().latest()) == [series]
    assert live.store().minutes() == [live.minute_of(now)]


def test_a_cache_entry_of_one_deployment_is_not_the_others(deployments):
    prod, staging = (d.cache() for d in deployments)
    key = "ports:grant:1"  # a port grant is used once, in its own deployment
    assert prod.add(key, "prod", timeout=30)
    assert staging.get(key) is None
    assert staging.add(key, "staging", timeout=30)
    assert prod.get(key) == "prod"


@pytest.mark.integration
def test_a_task_queued_by_one_deployment_never_reaches_the_others_worker(deployments, tmp_path):
    prod, staging = deployments
    worker = Proc(
        "staging-worker",
        WORKER,
        processes.child_env(**staging.env, GPUCLOUD_VAR_DIR=str(tmp_path / "staging")),
        tmp_path,
    )
    try:
        worker.wait_for_log("ready.", timeout=60)
        # prod's queue exists, as its own workers would have declared it
        with prod.celery().connection_for_write() as conn:
            ISOLATION(conn.default_channel).declare()
        # Names no worker knows: the worker logs one it receives and drops it.
        prod.celery().send_task("probe.from_prod", queue="isolation")
        staging.celery().send_task("probe.from_staging", queue="isolation")
        # One queue is first in, first out: prod's task, had it reached the worker, went first.
        worker.wait_for_log("probe.from_staging")
        assert "probe.from_prod" not in worker.log()
    finally:
        worker.stop()
    with prod.celery().connection_for_read() as conn:  # it waits for prod's own workers
        queue = conn.SimpleQueue(ISOLATION)
        message = queue.get(timeout=5)
        message.ack()
        queue.close()
    assert message.headers["task"] == "probe.from_prod"


def test_the_name_is_the_database_name_unless_set(monkeypatch, tmp_path):
    staging = "postgres://gpucloud:pw@db.internal:5432/gpucloud_staging"
    assert settings_of(monkeypatch, tmp_path, DATABASE_URL=staging)["DEPLOYMENT_NAME"] == (
        "gpucloud_staging"
    )
    assert settings_of(monkeypatch, tmp_path)["DEPLOYMENT_NAME"] == "gpucloud"
    named = settings_of(monkeypatch, tmp_path, DATABASE_URL=staging, DEPLOYMENT_NAME="eu-prod")
    assert named["DEPLOYMENT_NAME"] == "eu-prod"


@pytest.mark.parametrize("name", ["prod:eu", "-prod", "staging area", "x" * 51])
def test_a_name_that_cannot_name_channels_and_keys_is_refused(monkeypatch, tmp_path, name):
    with pytest.raises(ImproperlyConfigured, match="DEPLOYMENT_NAME"):
        settings_of(monkeypatch, tmp_path, DEPLOYMENT_NAME=name)
