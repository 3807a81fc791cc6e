"""An agent's pull figures are data, never markup, and never more than a bar can hold: a
negative or overlong number or a reference of markup is refused whole (the event batch is a
400, nothing recorded); a host reporting for another host's instance changes nothing; what is
kept is escaped on the page."""

import pytest

from tests.instances.fakes import FakeAgents
from tests.instances.test_agent_events import event, fresh, push, started

REF = "registry.example/team/pytorch:2.4"
FIGURES = {"reference": REF, "layers_done": 1, "layers_total": 2, "bytes_done": 10,
           "bytes_total": 20, "eta_seconds": 5, "done": False}  # fmt: skip


@pytest.fixture
def agents(monkeypatch):
    return FakeAgents().install(monkeypatch)


@pytest.mark.parametrize(
    "figures",
    [
        {**FIGURES, "bytes_done": -1},
        {**FIGURES, "layers_total": "1e9"},
        {**FIGURES, "eta_seconds": 2**64},
        {**FIGURES, "reference": "x" * 256},
        {k: v for k, v in FIGURES.items() if k != "bytes_total"},
        "50%",
    ],
)
def test_malformed_figures_are_refused_whole(catalog, tenant, agents, figures):
    host, instance = started(catalog, tenant, agents, start_state="starting")
    answer = push(host, event(instance, kind="progress", message="pulling", pull=figures))
    assert answer.status_code == 400
    assert fresh(instance).pull_progress == {}


def test_a_reference_of_markup_is_shown_as_text(catalog, tenant, agents, web):
    host, instance = started(catalog, tenant, agents, start_state="starting")
    planted = {**FIGURES, "reference": '<img src=x onerror="alert(1)">'}
    assert (
        push(host, event(instance, kind="progress", message="pulling", pull=planted)).status_code
        == 202
    )
    page = web.get(f"/instances/{instance.pk}/").content.decode()
    assert "<img src=x" not in page
    assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in page


def test_another_hosts_report_changes_nothing(catalog, tenant, agents):
    _, instance = started(catalog, tenant, agents, start_state="starting")
    other = catalog.host(gpus=1)
    other.set_secret(f"secret-{other.name}")
    other.save()
    answer = push(other, event(instance, kind="progress", message="pulling", pull=FIGURES))
    assert answer.status_code == 202 and answer.json()["applied"] == 0
    assert fresh(instance).pull_progress == {}
