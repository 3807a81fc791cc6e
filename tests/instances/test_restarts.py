"""Restarts after a workload ended by itself: the policy rule, the crash-loop backoff, and
what record_outcome and the `restart` task do with them (a suspended tenant, a stop during
the backoff)."""

from datetime import timedelta

import pytest
from django.utils import timezone
from hypothesis import given
from hypothesis import strategies as st

from accounts.models import Tenant
from console.instances import outcomes, restarts, services
from console.instances.models import Instance, State
from tests.instances.fakes import FakeAgents
from tests.instances.test_agent_events import fresh, started


@pytest.fixture
def agents(monkeypatch):
    return FakeAgents().install(monkeypatch)


# policy × how the workload ended → restarted?
@pytest.mark.parametrize(
    ("policy", "failed", "never_ran", "expected"),
    [
        ("never", False, False, False),
        ("never", True, False, False),
        ("on-failure", False, False, False),  # exit 0
        ("on-failure", True, False, True),  # exit 1, oom_killed, container_lost, gpu_memory_cap
        ("on-failure", True, True, False),  # command_not_found, image_pull_failed, …
        ("always", False, False, True),
        ("always", True, False, True),
        ("always", True, True, False),
    ],
)
def test_the_policy_rule(policy, failed, never_ran, expected):
    assert restarts.wanted(policy, failed=failed, never_ran=never_ran) is expected


@given(st.integers(min_value=1, max_value=10_000))
def test_the_backoff_doubles_from_10_s_up_to_5_minutes(n):
    delay = restarts.backoff(n)
    assert 10 <= delay <= 300
    assert delay == min(10 * 2 ** (n - 1), 300) if n < 64 else delay == 300
    assert restarts.backoff(n + 1) >= delay


def test_the_count_starts_again_after_a_10_minute_run():
    assert restarts.next_count(4, timedelta(minutes=9, seconds=59)) == 5
    assert restarts.next_count(4, timedelta(minutes=10)) == 1


def test_what_a_waiting_restart_says():
    now = timezone.now()
    later = now + timedelta(seconds=39.2)
    assert restarts.describe("failed", 3, later, now) == "restarting in 40 s (restart 3, backoff)"
    assert restarts.describe("failed", 3, None, now) == ""
    assert restarts.describe("starting", 3, later, now) == ""


def _ended(host, instance, state, reason="", code=None):
    allocation = instance.current_allocation().pk
    outcome = outcomes.Outcome(allocation, state, reason=reason, exit_code=code)
    assert outcomes.record_outcome(host, instance.pk, outcome)
    return fresh(instance)


def _restart_due(instance) -> str:
    return fresh(instance).restart_at.isoformat()


@pytest.mark.parametrize(
    ("policy", "state", "reason", "code", "restarts_it"),
    [
        ("on-failure", "failed", "exit code 1", 1, True),
        ("on-failure", "failed", "oom_killed", 137, True),
        ("on-failure", "failed", "gpu_memory_cap", None, True),
        ("on-failure", "failed", "command_not_found: no such file", None, False),
        ("on-failure", "exited", "exited", 0, False),
        ("always", "exited", "exited", 0, True),
        ("never", "failed", "exit code 1", 1, False),
    ],
)
def test_an_exit_schedules_a_restart_by_the_policy(
    catalog, tenant, agents, no_tasks, policy, state, reason, code, restarts_it
):
    host, instance = started(catalog, tenant, agents)
    Instance.objects.filter(pk=instance.pk).update(restart_policy=policy)
    instance = _ended(host, fresh(instance), state, reason, code)
    assert instance.state == (State.FAILED if state == "failed" else State.STOPPING)
    assert (instance.restart_count, instance.restart_at is not None) == (
        (1, True) if restarts_it else (0, False)
    )
    queued = [task for task in no_tasks if task[0] == "restart"]
    assert queued == (
        [("restart", instance.pk, instance.restart_at.isoformat())] if restarts_it else []
    )
    if restarts_it:
        note = instance.events.order_by("-at", "-pk").first()
        assert note.message.startswith(f"Restart 1 in 10 s (restart policy {policy}) after: ")
        assert reason in note.message or f"code {code}" in note.message


def test_the_restart_starts_it_and_the_next_failure_waits_twice_as_long(
    catalog, tenant, agents, no_tasks
):
    host, instance = started(catalog, tenant, agents)
    instance = _ended(host, instance, "failed", "exit code 1", 1)
    assert restarts.restart(instance.pk, "not-this-one") is False
    assert restarts.restart(instance.pk, _restart_due(instance)) is True
    instance = fresh(instance)
    assert instance.state == State.STARTING and instance.restart_at is None
    assert instance.events.order_by("-at", "-pk").first().message.startswith("Restart 1; ")
    assert outcomes.mark_running(instance.pk, instance.current_allocation().pk)
    instance = _ended(host, fresh(instance), "failed", "exit code 1", 1)
    assert (instance.restart_count, fresh(instance).state) == (2, State.FAILED)
    assert (instance.restart_at - timezone.now()).total_seconds() == pytest.approx(20, abs=2)


def test_an_exit_0_restarts_once_its_stop_is_done(catalog, tenant, agents, no_tasks):
    host, instance = started(catalog, tenant, agents)
    Instance.objects.filter(pk=instance.pk).update(restart_policy="always")
    instance = _ended(host, fresh(instance), "exited", code=0)
    due = _restart_due(instance)
    assert restarts.restart(instance.pk, due) is False  # still stopping: it looks again
    assert no_tasks[-1] == ("restart", instance.pk, due)
    assert outcomes.finish_stop(instance.pk)
    assert restarts.restart(instance.pk, due) is True
    assert fresh(instance).state == State.STARTING


def test_a_stop_during_the_backoff_wins(catalog, tenant, agents, no_tasks, member):
    host, instance = started(catalog, tenant, agents)
    instance = _ended(host, instance, "failed", "exit code 1", 1)
    due = _restart_due(instance)
    assert "stop" in services.lifecycle.allowed_actions(instance.state, instance.restart_at)
    services.stop_instance(instance, actor=member.user)
    instance = fresh(instance)
    assert (instance.state, instance.restart_at) == (State.FAILED, None)
    assert restarts.restart(instance.pk, due) is False
    assert fresh(instance).state == State.FAILED
    assert instance.events.order_by("-at", "-pk").first().message == "Stop requested: not restarted"


def test_a_terminate_during_the_backoff_wins(catalog, tenant, agents, no_tasks):
    host, instance = started(catalog, tenant, agents)
    instance = _ended(host, instance, "failed", "exit code 1", 1)
    due = _restart_due(instance)
    services.terminate_instance(instance)
    assert restarts.restart(instance.pk, due) is False
    assert fresh(instance).state == State.TERMINATING


def test_a_suspended_tenant_is_never_restarted(catalog, tenant, agents, no_tasks):
    host, instance = started(catalog, tenant, agents)
    Tenant.objects.filter(pk=tenant.pk).update(status=Tenant.Status.SUSPENDED)
    instance = _ended(host, instance, "failed", "exit code 1", 1)
    assert (instance.state, instance.restart_at) == (State.FAILED, None)


def test_a_tenant_suspended_during_the_backoff_is_not_restarted(catalog, tenant, agents, no_tasks):
    host, instance = started(catalog, tenant, agents)
    instance = _ended(host, instance, "failed", "exit code 1", 1)
    Tenant.objects.filter(pk=tenant.pk).update(status=Tenant.Status.SUSPENDED)
    assert restarts.restart(instance.pk, _restart_due(instance)) is False
    instance = fresh(instance)
    assert (instance.state, instance.restart_at) == (State.FAILED, None)
    assert instance.events.order_by("-at", "-pk").first().message.startswith("Not restarted: ")
