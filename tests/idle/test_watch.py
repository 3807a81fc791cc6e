"""The idle watch's round against the database and the live window (no process): it warns,
acts at the time it said, records why with the figures, and a second round changes nothing."""

import time
from decimal import Decimal

import pytest

from console import activity
from console.idle import services
from console.idle.models import OperatorPolicy, Watch
from console.instances.models import Allocation, InstanceEvent
from console.metrics import live
from console.metrics.ingest import instance_series
from console.notices import notice
from tests.instances.helpers import make_instance

pytestmark = pytest.mark.usefixtures("no_tasks")


@pytest.fixture(autouse=True)
def fresh_window():
    live.reset_store()
    yield
    live.reset_store()


@pytest.fixture
def notices():
    heard = []

    def hear(sender, **kwargs):
        heard.append(kwargs)

    notice.connect(hear, dispatch_uid="idle-test")
    yield heard
    notice.disconnect(dispatch_uid="idle-test")


@pytest.fixture
def running(catalog, tenant):
    instance = make_instance(catalog, tenant, state="running")
    Allocation.objects.create(id="alloc-1", instance=instance, host=catalog.host(), mode="shared")
    InstanceEvent.objects.filter(instance=instance).update(at=_moment(time.time() - 3600))
    return instance


def _moment(epoch):
    from datetime import UTC, datetime

    return datetime.fromtimestamp(epoch, UTC)


def samples(instance, util: float, since: float, until: float) -> None:
    points = [
        live.Point(instance_series(instance.pk), ts, (util, 100, 1000, 40.0, 100.0, 1400))
        for ts in range(int(since), int(until))
    ]
    live.store().add(points, {}, until)


def policy(tenant, **changes):
    values = {"window_minutes": Decimal(1), "warning_minutes": Decimal("0.5"), **changes}
    return OperatorPolicy.objects.create(tenant=tenant, **values)


def test_an_idle_instance_is_warned_then_stopped_with_the_figures(
    running, tenant, no_tasks, notices, django_capture_on_commit_callbacks
):
    policy(tenant)
    now = time.time()
    samples(running, 0.4, now - 200, now)
    with django_capture_on_commit_callbacks(execute=True):
        assert services.evaluate(running.pk, now) == "warn"
        assert services.evaluate(running.pk, now + 1) == "wait"  # a second round: nothing new
    watch = Watch.objects.get(instance=running)
    assert watch.kind == "idle" and watch.acts_at.timestamp() == pytest.approx(now + 30)
    assert [n["kind"] for n in notices] == ["instance.idle_warning"]
    assert notices[0]["data"]["threshold_percent"] == 5
    samples(running, 0.3, now, now + 31)
    with django_capture_on_commit_callbacks(execute=True):
        assert services.evaluate(running.pk, now + 31) == "act"
    running.refresh_from_db()
    assert running.state == "stopping"
    assert no_tasks == ["stop"]
    assert running.state_reason.startswith("idle_stopped: idle since")
    assert "GPU at most 0.4 % (under 5 %)" in running.state_reason
    assert [n["kind"] for n in notices] == ["instance.idle_warning", "instance.idle_stopped"]
    assert notices[1]["data"]["action"] == "stop"
    # a round that runs again finds it no longer running
    assert services.evaluate(running.pk, now + 32) == "wait"
    assert no_tasks == ["stop"]


def test_a_busy_gpu_or_an_open_session_keeps_it_from_being_idle(running, tenant):
    policy(tenant)
    now = time.time()
    samples(running, 60.0, now - 200, now)
    assert services.evaluate(running.pk, now) == "wait"
    samples(running, 0.0, now, now + 120)
    activity.opened(running.pk, "ssh")
    assert services.evaluate(running.pk, now + 120) == "wait"
    activity.ended(running.pk, "ssh")
    ended = time.time()
    # the session's end is its last use: the window (then the warning) runs from then
    assert services.status(running, ended)["acts_at"].timestamp() == pytest.approx(ended + 90, 1)
    assert services.evaluate(running.pk, ended + 59) == "wait"
    assert services.evaluate(running.pk, ended + 61) == "warn"


def test_keep_running_once_then_refused(running, tenant, member_client):
    policy(tenant)
    now = time.time()
    samples(running, 0.0, now - 200, now)
    assert services.evaluate(running.pk, now) == "warn"
    url = f"/api/v1/instances/{running.pk}/keep-running/"
    kept = member_client.post(url)
    assert kept.status_code == 200, kept.content
    assert kept.json()["warned"] is False
    assert services.evaluate(running.pk, now + 1) == "wait"
    samples(running, 0.0, now, time.time() + 100)
    assert services.evaluate(running.pk, time.time() + 100) == "warn"
    again = member_client.post(url)
    assert again.status_code == 409
    assert again.json()["code"] == "kept_running_already"


def test_keep_running_is_refused_where_the_operator_forbids_it(running, tenant, member_client):
    policy(tenant, allow_keep_running=False)
    now = time.time()
    samples(running, 0.0, now - 200, now)
    services.evaluate(running.pk, now)
    refused = member_client.post(f"/api/v1/instances/{running.pk}/keep-running/")
    assert refused.status_code == 409
    assert refused.json()["code"] == "keep_running_forbidden"


def test_no_warning_no_keep_running(running, tenant, member_client):
    policy(tenant)
    refused = member_client.post(f"/api/v1/instances/{running.pk}/keep-running/")
    assert (refused.status_code, refused.json()["code"]) == (409, "keep_running_refused")


def test_the_maximum_runtime_stops_it(running, tenant, no_tasks):
    policy(tenant, window_minutes=None, max_runtime_minutes=Decimal(30))
    now = time.time()
    samples(running, 90.0, now - 100, now)
    assert services.evaluate(running.pk, now) == "warn"
    assert services.evaluate(running.pk, now + 31) == "act"
    running.refresh_from_db()
    assert running.state_reason.startswith("runtime_limit: it reached its maximum runtime of 30")


def test_shelve_stops_it_then_shelves_it_once_stopped(running, tenant, no_tasks):
    from console.snapshots.models import Shelf

    policy(tenant, action="shelve")
    now = time.time()
    samples(running, 0.0, now - 200, now + 31)
    assert services.evaluate(running.pk, now) == "warn"
    assert services.evaluate(running.pk, now + 31) == "act"
    running.refresh_from_db()
    assert running.state == "stopping" and running.state_reason.startswith("idle_stopped")
    assert services.shelve_stopped() == 0  # still stopping
    type(running).objects.filter(pk=running.pk).update(
        state="stopped", disk_host=Allocation.objects.get().host
    )
    assert services.shelve_stopped() == 1
    assert Shelf.objects.filter(instance=running).exists()
    assert services.shelve_stopped() == 0  # once
