"""A heartbeat says whether the agent's container engine answers (issue 50 item 2): the host
keeps since when it does not, with a host event on each change and a `host.engine_down`
notice, the fleet and host pages and /metrics show it, and what an agent sends there is
checked like any other input (a 400 naming the field, nothing changed)."""

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from console.fleet.models import Host
from tests.fleet.conftest import agent_client_for, post_json
from tests.metrics.test_prometheus import families, scrape

pytestmark = pytest.mark.django_db


def beat(host, secret, engine):
    body = {"host_id": host.pk, "inventory_digest": host.inventory_digest}
    if engine is not None:
        body["engine"] = engine
    return post_json(agent_client_for(secret), "/agent/v1/heartbeat", body)


def engine_up_metric(name: str) -> float:
    [sample] = [
        s for s in families(scrape()[1])["gpucloud_host_engine_up"] if s.labels["host"] == name
    ]
    return sample.value


def test_an_engine_that_stops_answering_is_shown_until_it_answers_again(register, staff_client):
    host, secret = register()
    assert beat(host, secret, {"state": "up"}).status_code == 200
    assert engine_up_metric(host.name) == 1
    Host.objects.filter(pk=host.pk).update(last_heartbeat_at=timezone.now() - timedelta(seconds=9))
    since = time.time() - 1
    down = {"state": "down", "since": since, "detail": "connection refused\x1b[31m"}
    assert beat(host, secret, down).status_code == 200
    host.refresh_from_db()
    assert host.engine_down_since is not None
    assert abs(host.engine_down_since.timestamp() - since) < 0.01
    assert host.engine_detail == "connection refused [31m"  # no control characters kept
    assert host.status == Host.Status.ACTIVE and not host.schedulable
    for page in ("/fleet/", f"/fleet/hosts/{host.pk}/"):
        assert "engine down since" in staff_client.get(page).content.decode()
    page = staff_client.get(f"/fleet/hosts/{host.pk}/").content.decode()
    assert "connection refused [31m</span>" in page  # the engine's error, for its operators
    assert engine_up_metric(host.name) == 0
    # said again at every heartbeat: one event, the first time
    assert beat(host, secret, {**down, "since": time.time()}).status_code == 200
    assert host.events.filter(message__contains="does not answer since").count() == 1

    assert beat(host, secret, {"state": "up"}).status_code == 200
    host.refresh_from_db()
    assert host.engine_down_since is None and host.engine_detail == ""
    assert host.events.filter(message__contains="answers again").count() == 1
    assert "engine down since" not in staff_client.get("/fleet/").content.decode()
    assert engine_up_metric(host.name) == 1


def test_since_is_kept_between_the_last_heartbeat_and_now(register):
    """An agent's clock can neither date the outage before the heartbeat whose ping found the
    engine up, nor after now."""
    host, secret = register()
    heard = timezone.now() - timedelta(seconds=10)
    Host.objects.filter(pk=host.pk).update(last_heartbeat_at=heard)
    beat(host, secret, {"state": "down", "since": 1000.0, "detail": "x"})
    host.refresh_from_db()
    assert host.engine_down_since == heard
    beat(host, secret, {"state": "up"})
    before = timezone.now()
    beat(host, secret, {"state": "down", "since": time.time() + 3600, "detail": "x"})
    host.refresh_from_db()
    assert before <= host.engine_down_since <= timezone.now()


def test_a_heartbeat_without_engine_changes_nothing(register):
    host, secret = register()
    beat(host, secret, {"state": "down", "since": time.time(), "detail": "x"})
    assert beat(host, secret, None).status_code == 200
    host.refresh_from_db()
    assert host.engine_down_since is not None


@pytest.mark.parametrize(
    "engine",
    [
        "down",
        [],
        {},
        {"state": "sideways"},
        {"state": "down"},  # since when?
        {"state": "down", "since": "yesterday"},
        {"state": "down", "since": -1},
        {"state": "down", "since": 1e30},
        {"state": "down", "since": time.time(), "detail": "x" * 301},
    ],
)
def test_a_malformed_engine_is_400_naming_it_and_changes_nothing(register, engine):
    host, secret = register()
    response = beat(host, secret, engine)
    assert response.status_code == 400, response.content
    assert "engine" in response.json()["detail"]
    host.refresh_from_db()
    assert host.engine_down_since is None
    assert not host.events.filter(message__contains="container engine").exists()


def test_nan_and_infinity_are_refused(register):
    host, secret = register()
    for raw in ("NaN", "Infinity"):
        body = f'{{"host_id": {host.pk}, "engine": {{"state": "down", "since": {raw}}}}}'
        response = agent_client_for(secret).post(
            "/agent/v1/heartbeat", data=body, content_type="application/json"
        )
        assert response.status_code == 400
    host.refresh_from_db()
    assert host.engine_down_since is None


def test_tenants_with_instances_there_get_a_host_engine_down_notice(register, monkeypatch):
    from console.fleet import services

    told = []
    monkeypatch.setattr(
        services, "_tell_tenants", lambda host, kind, text, data: told.append((kind, data))
    )
    host, secret = register()
    beat(host, secret, {"state": "down", "since": time.time(), "detail": "refused"})
    [(kind, data)] = told
    assert kind == "host.engine_down" and data["host"] == host.name
    assert "detail" not in data  # the engine's error (paths, addresses) is the operators'
