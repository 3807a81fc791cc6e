"""An image pull's figures as the console keeps and shows them (console/instances/
pull_progress.py): from the agent's progress event to the instance, its API view, its live
update and the bar on its page; any new reason clears them."""

import pytest

from console.instances import pull_progress
from console.instances.agent_api import EventSerializer
from console.instances.models import Instance
from console.instances.reasons import Reason

REF = "registry.example/team/pytorch:2.4"
FIGURES = {
    "reference": REF, "layers_done": 2, "layers_total": 5, "bytes_done": 1_200_000_000,
    "bytes_total": 3_400_000_000, "eta_seconds": 95, "done": False,
}  # fmt: skip


SIZES = "2 of 5 layers · 1.2 GB of 3.4 GB"


@pytest.mark.parametrize(
    ("changes", "percent", "summary"),
    [
        ({}, 35, f"{SIZES} · about 2 min left"),
        ({"eta_seconds": 40}, 35, f"{SIZES} · about 40 s left"),
        ({"eta_seconds": 7200}, 35, f"{SIZES} · about 2.0 h left"),
        ({"eta_seconds": None}, 35, SIZES),
        ({"bytes_done": 0, "bytes_total": 0, "eta_seconds": None}, 40, "2 of 5 layers"),
        (
            {"layers_done": 5, "bytes_done": 3_400_000_000, "done": True},
            100,
            "5 of 5 layers · 3.4 GB of 3.4 GB",
        ),
    ],
)
def test_the_bar_says_how_far_by_bytes_else_layers_with_the_time_left(changes, percent, summary):
    assert pull_progress.describe({**FIGURES, **changes}) == {
        "reference": REF,
        "percent": percent,
        "summary": summary,
    }


def test_no_pull_no_bar():
    assert pull_progress.describe({}) is None


def test_an_agents_figures_are_checked_and_kept_within_their_totals():
    event = {"allocation": "a1", "instance": 3, "kind": "progress", "at": "2026-01-01T00:00:00Z",
             "message": f"pulling {REF}: …",
             "pull": {**FIGURES, "bytes_done": 9_000_000_000, "layers_done": 7}}  # fmt: skip
    serializer = EventSerializer(data=event)
    assert serializer.is_valid(), serializer.errors
    pull = serializer.validated_data["pull"]
    assert (pull["layers_done"], pull["bytes_done"]) == (5, 3_400_000_000)
    bad = EventSerializer(data={**event, "pull": {**FIGURES, "bytes_done": -1}})
    assert not bad.is_valid() and "pull" in bad.errors
    assert EventSerializer(data={k: v for k, v in event.items() if k != "pull"}).is_valid()


def test_any_new_reason_clears_the_figures():
    assert Instance.reason_fields(Reason(detail="pulling"), FIGURES)["pull_progress"] == FIGURES
    assert Instance.reason_fields(Reason(detail="Starting the workload"))["pull_progress"] == {}
