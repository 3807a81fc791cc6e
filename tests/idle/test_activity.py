"""What the idle watch hears of use: SSH sessions from the agent's events (each counted once,
however often the agent sends it), and port requests written at most once per throttle."""

import pytest

from console import activity
from tests.instances.fakes import FakeAgents
from tests.instances.test_agent_events import event, push, started


@pytest.fixture
def agents(monkeypatch):
    return FakeAgents().install(monkeypatch)


def test_ssh_sessions_are_counted_open_then_ended_once_each(catalog, tenant, agents):
    host, instance = started(catalog, tenant, agents)
    opened = event(instance, kind="session", message="ssh session from ::1", activity="ssh.opened")
    assert push(host, opened).status_code == 202
    assert push(host, opened).status_code == 202  # the agent's retry
    open_now, last = activity.seen(instance.pk)["ssh"]
    assert open_now == 1 and last is not None
    ended = event(
        instance, kind="session", message="ssh session from ::1 ended", activity="ssh.ended"
    )
    push(host, ended)
    push(host, ended)
    assert activity.seen(instance.pk)["ssh"][0] == 0
    assert activity.seen(instance.pk)["terminal"] == (0, None)


def test_an_unknown_activity_is_a_400(catalog, tenant, agents):
    host, instance = started(catalog, tenant, agents)
    bad = event(instance, kind="session", message="ssh session", activity="ssh.hijacked")
    answer = push(host, bad)
    assert answer.status_code == 400
    assert activity.seen(instance.pk)["ssh"] == (0, None)


def test_never_fewer_than_none_open():
    activity.ended(4242, "terminal")
    assert activity.seen(4242)["terminal"][0] == 0
    activity.opened(4242, "terminal")
    assert activity.seen(4242)["terminal"][0] == 1


def test_port_use_is_written_at_most_once_per_throttle(monkeypatch):
    # what this process wrote for the port tests' instances (whose pks include 77) is not ours
    monkeypatch.setattr(activity, "_written", {})
    assert activity.due(77, "ports", 1000.0)
    assert not activity.due(77, "ports", 1000.0 + activity.USE_THROTTLE_SECONDS - 1)
    assert activity.due(77, "ports", 1000.0 + activity.USE_THROTTLE_SECONDS)
    activity.used(77, "ports")
    assert activity.seen(77)["ports"][1] is not None
