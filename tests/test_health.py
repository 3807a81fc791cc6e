import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest

TOKEN = "monitoring-secret"


@pytest.fixture
def monitor(client, settings):
    """The client as monitoring calls /healthz: with HEALTHZ_TOKEN, it reads the details."""
    settings.HEALTHZ_TOKEN = TOKEN
    client.defaults["HTTP_AUTHORIZATION"] = f"Bearer {TOKEN}"
    return client


def _register_a_host(name="gpu-a"):
    from django.utils import timezone

    from console.fleet.models import Host
    from tests.factories import RegionFactory

    return Host.objects.create(
        name=name, region=RegionFactory(), address="http://x:1", last_heartbeat_at=timezone.now()
    )


@pytest.mark.django_db
def test_healthz_reports_each_component(monitor):
    _register_a_host()
    response = monitor.get("/healthz")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ok"
    assert set(body["components"]) == {"database", "broker", "channel_layer", "agents"}


@pytest.mark.django_db
def test_healthz_never_says_agents_are_ok_with_no_host_registered(monitor):
    response = monitor.get("/healthz")
    assert response.status_code == 200  # the console serves; there is just nothing to run on
    body = response.json()
    assert body["status"] == "degraded"
    assert body["components"]["agents"] == {
        "status": "degraded",
        "hosts": 0,
        "reachable": 0,
        "unreachable": [],
        "engine_down": [],
        "detail": "no hosts registered: no agent has registered a GPU host yet",
    }
    _register_a_host()
    body = monitor.get("/healthz").json()
    assert (body["status"], body["components"]["agents"]["detail"]) == (
        "ok",
        "1 of 1 hosts reachable",
    )


@pytest.mark.django_db
def test_healthz_answers_whatever_host_a_probe_asks_for(client, settings):
    settings.ALLOWED_HOSTS = ["console.example.com"]
    _register_a_host()
    for host in ("10.0.0.5:8000", "gpu-lb.internal", "console.example.com"):
        response = client.get("/healthz", HTTP_HOST=host)
        assert response.status_code == 200, host
        assert response.json()["status"] == "ok"
    # Everything else still answers only for the allowed names.
    assert client.get("/api/v1/specs/", HTTP_HOST="10.0.0.5:8000").status_code == 400
    assert client.post("/healthz", HTTP_HOST="10.0.0.5:8000").status_code == 405


@pytest.mark.django_db
def test_healthz_says_agents_are_degraded_with_counts_while_a_host_is_unreachable(monitor):
    from datetime import timedelta

    from django.utils import timezone

    from console.fleet.models import Host
    from tests.factories import RegionFactory

    region, now = RegionFactory(), timezone.now()
    for name, heard in (("gpu-a", now), ("gpu-b", now - timedelta(seconds=60)), ("gpu-c", None)):
        Host.objects.create(name=name, region=region, address="http://x:1", last_heartbeat_at=heard)
    Host.objects.create(
        name="gone", region=region, address="http://x:1", status=Host.Status.RETIRED
    )
    response = monitor.get("/healthz")
    assert response.status_code == 200  # the console serves: no probe takes it out for this
    body = response.json()
    assert body["status"] == "degraded"
    assert body["components"]["agents"] == {
        "status": "degraded",
        "hosts": 3,
        "reachable": 1,
        "unreachable": ["gpu-b", "gpu-c"],
        "engine_down": [],
        "detail": "1 of 3 hosts reachable",
    }
    Host.objects.filter(name__in=["gpu-b", "gpu-c"]).update(last_heartbeat_at=now)
    body = monitor.get("/healthz").json()
    assert (body["status"], body["components"]["agents"]["detail"]) == (
        "ok",
        "3 of 3 hosts reachable",
    )


@pytest.mark.django_db
def test_healthz_is_degraded_naming_a_host_whose_container_engine_does_not_answer(monitor):
    from django.utils import timezone

    from console.fleet.models import Host

    host = _register_a_host()
    Host.objects.filter(pk=host.pk).update(engine_down_since=timezone.now())
    body = monitor.get("/healthz").json()
    agents = body["components"]["agents"]
    assert (body["status"], agents["status"], agents["engine_down"]) == (
        "degraded",
        "degraded",
        ["gpu-a"],
    )
    assert agents["detail"] == "1 of 1 hosts reachable; container engine down on gpu-a"


@pytest.mark.django_db
def test_healthz_is_503_when_the_channel_layer_is_down(monitor, settings):
    from console.processes import free_port

    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
            "CONFIG": {"hosts": [f"redis://127.0.0.1:{free_port()}/0"]},
        }
    }
    response = monitor.get("/healthz")
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "down"
    assert body["components"]["channel_layer"]["status"] == "down"
    assert body["components"]["database"]["status"] == "ok"


@pytest.mark.slow
@pytest.mark.django_db
def test_healthz_is_503_when_the_broker_is_down(monitor, settings, monkeypatch):
    from console.celery import app
    from console.processes import free_port

    url = f"redis://127.0.0.1:{free_port()}/0"
    # app.conf reads the settings: patched first, so that what it restores is the real URL
    monkeypatch.setattr(app.conf, "broker_url", url)
    settings.CELERY_BROKER_URL = url
    response = monitor.get("/healthz")
    assert response.status_code == 503
    assert response.json()["components"]["broker"]["status"] == "down"


def test_a_pub_sub_channel_layer_is_up_on_every_check(settings, redis_url):
    """A pub/sub layer subscribes without waiting for the server; the check must not read
    that race (which the embedded server shows often) as the layer being down. Checks run
    as under the ASGI server: from a worker thread, on the one event loop and its
    connections."""
    from asgiref.sync import sync_to_async

    from console import health

    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
            "CONFIG": {"hosts": [redis_url]},
        }
    }

    async def checks():
        return [await sync_to_async(health._channel_layer)() for _ in range(20)]

    with ThreadPoolExecutor(1) as thread:  # a loop of its own, whatever runs in this thread
        results = thread.submit(asyncio.run, checks()).result(timeout=60)
    assert results == [{"status": "ok", "kind": "RedisPubSubChannelLayer"}] * 20


@pytest.mark.django_db
def test_anonymous_callers_get_the_status_alone(client, settings):
    """No host names, database vendor, broker kind or error text without the token or a
    staff session; the status and the HTTP code still tell a balancer all it needs."""
    settings.HEALTHZ_TOKEN = TOKEN
    _register_a_host("secret-gpu-host")
    assert client.get("/healthz").json() == {"status": "ok"}
    for header in ("Bearer wrong", f"Basic {TOKEN}", ""):
        response = client.get("/healthz", HTTP_AUTHORIZATION=header)
        assert (response.status_code, response.json()) == (200, {"status": "ok"}), header
    settings.HEALTHZ_TOKEN = ""  # no token set: an empty bearer opens nothing either
    assert client.get("/healthz", HTTP_AUTHORIZATION="Bearer ").json() == {"status": "ok"}


@pytest.mark.django_db
def test_an_anonymous_caller_sees_503_down_but_not_why(client, settings):
    from console.processes import free_port

    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
            "CONFIG": {"hosts": [f"redis://127.0.0.1:{free_port()}/0"]},
        }
    }
    response = client.get("/healthz")
    assert (response.status_code, response.json()) == (503, {"status": "down"})
    assert b"127.0.0.1" not in response.content


@pytest.mark.django_db
def test_a_staff_session_sees_the_details_and_a_tenant_session_does_not(client, settings):
    from tests.factories import UserFactory

    settings.ALLOWED_HOSTS = ["console.example.com"]
    _register_a_host("gpu-a")
    client.force_login(UserFactory(username="tenant-user"))
    assert client.get("/healthz").json() == {"status": "ok"}
    client.force_login(UserFactory(username="operator", is_staff=True))
    body = client.get("/healthz", HTTP_HOST="10.0.0.5").json()
    assert body["components"]["agents"]["detail"] == "1 of 1 hosts reachable"
    assert body["components"]["database"]["vendor"] in ("sqlite", "postgresql")
