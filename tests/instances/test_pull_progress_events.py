"""A pull's progress reports, as the console records them: each one the instance's reason and
a live update to its tenant's browsers, all of one pull in one event that says how far it got."""

import pytest

from console import broadcast
from console.instances.models import State
from tests.instances.fakes import FakeAgents
from tests.instances.test_agent_events import event, fresh, push, started

REF = "registry.example/team/pytorch:2.4"


@pytest.fixture
def agents(monkeypatch):
    return FakeAgents().install(monkeypatch)


@pytest.fixture
def sent(monkeypatch):
    messages = []
    monkeypatch.setattr(broadcast, "group_send", lambda group, message: messages.append(message))
    return messages


def test_a_pulls_reports_update_one_event_and_reach_the_browsers_each_time(
    catalog, tenant, agents, sent, django_capture_on_commit_callbacks
):
    host, instance = started(catalog, tenant, agents, start_state="starting")
    reports = [
        f"pulling {REF}",
        f"pulling {REF}: 1 of 3 layers · 1.2 GB of 3.4 GB",
        f"pulling {REF}: 2 of 3 layers · 3.0 GB of 3.4 GB",
        f"pulled {REF} in 43 s: 3 of 3 layers · 3.4 GB of 3.4 GB",
    ]
    seen = []
    for report in reports:
        with django_capture_on_commit_callbacks(execute=True):
            assert push(host, event(instance, kind="progress", message=report)).status_code == 202
        seen.append(sent[-1]["payload"]["instance"]["reason_text"])
    assert seen == reports  # each report reached the browsers as the instance's reason
    assert fresh(instance).state_reason == reports[-1]
    notes = [e.message for e in instance.events.all() if e.message.startswith("pull")]
    assert notes == reports[2:]  # the pull's last report, then its end


def test_another_images_pull_and_other_notes_keep_their_own_events(catalog, tenant, agents):
    host, instance = started(catalog, tenant, agents, start_state="starting")
    for report in [
        f"pulling {REF}: 1 of 3 layers",
        "the container's writable layer is unbounded (--unbounded-layers)",
        f"pulling {REF}: 2 of 3 layers",
        f"pulling {REF}-cuda: 1 of 9 layers",
    ]:
        push(host, event(instance, kind="progress", message=report))
    notes = [e.message for e in instance.events.all() if e.kind == "note"][1:]  # after "Starting…"
    assert notes == [
        f"pulling {REF}: 1 of 3 layers",
        "the container's writable layer is unbounded (--unbounded-layers)",
        f"pulling {REF}: 2 of 3 layers",
        f"pulling {REF}-cuda: 1 of 9 layers",
    ]
    assert fresh(instance).state == State.PROVISIONING


def test_a_reports_figures_reach_the_instance_its_api_its_page_and_its_live_update(
    catalog, tenant, agents, sent, member, token_client, web, django_capture_on_commit_callbacks
):
    host, instance = started(catalog, tenant, agents, start_state="starting")
    figures = {"reference": REF, "layers_done": 1, "layers_total": 4, "bytes_done": 850_000_000,
               "bytes_total": 3_400_000_000, "eta_seconds": 30, "done": False}  # fmt: skip
    report = f"pulling {REF}: 1 of 4 layers · 850.0 MB of 3.4 GB"
    with django_capture_on_commit_callbacks(execute=True):
        push(host, event(instance, kind="progress", message=report, pull=figures))
    assert fresh(instance).pull_progress == figures
    assert sent[-1]["payload"]["instance"]["pull_progress"] == figures
    api = token_client(member).get(f"/api/v1/instances/{instance.pk}/").json()
    assert api["pull_progress"] == figures and api["state_reason"] == report
    page = web.get(f"/instances/{instance.pk}/").content.decode()
    assert 'data-testid="pull-progress" data-percent="25"' in page
    assert "1 of 4 layers · 850.0 MB of 3.4 GB · about 30 s left" in page
    # the next note (no figures) ends the bar; the text stays an event
    push(host, event(instance, kind="progress", message="the container starts"))
    assert fresh(instance).pull_progress == {}
    assert "pull-progress" not in web.get(f"/instances/{instance.pk}/").content.decode()
    assert (
        token_client(member).get(f"/api/v1/instances/{instance.pk}/").json()["pull_progress"]
        is None
    )
