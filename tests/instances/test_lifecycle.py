"""The transition table: every legal transition works and writes its event; every other one
is refused and changes nothing."""

import pytest
from django.db import transaction

from console.instances import lifecycle
from console.instances.lifecycle import TRANSITIONS, InvalidTransition
from console.instances.models import Instance, State
from console.instances.reasons import Reason
from tests.instances.helpers import make_instance

ALL = State.values


def test_the_table_names_every_state_and_only_states():
    assert set(TRANSITIONS) == set(ALL)
    for targets in TRANSITIONS.values():
        assert targets <= set(ALL)
    assert TRANSITIONS[State.TERMINATED] == frozenset()
    # every state can be reached (pending again when a start finds no room)
    assert set().union(*TRANSITIONS.values()) == set(ALL)


@pytest.mark.parametrize("from_state", ALL)
def test_every_pair(catalog, tenant, from_state):
    instance = make_instance(catalog, tenant, state=from_state)
    for to_state in ALL:
        Instance.objects.filter(pk=instance.pk).update(state=from_state)
        instance.refresh_from_db()
        events = instance.events.count()
        if to_state in TRANSITIONS[from_state]:
            with transaction.atomic():
                event = lifecycle.transition(
                    instance, to_state, message="t", reason=Reason(detail="why")
                )
            instance.refresh_from_db()
            assert instance.state == to_state
            assert instance.state_reason == "why"
            assert (event.from_state, event.to_state) == (from_state, to_state)
            assert instance.events.count() == events + 1
        else:
            with pytest.raises(InvalidTransition), transaction.atomic():
                lifecycle.transition(instance, to_state)
            instance.refresh_from_db()
            assert instance.state == from_state
            assert instance.events.count() == events


def test_stale_rows_lose_the_compare_and_swap(catalog, tenant):
    instance = make_instance(catalog, tenant, state=State.RUNNING)
    stale = Instance.objects.get(pk=instance.pk)
    with transaction.atomic():
        lifecycle.transition(instance, State.STOPPING)
    with pytest.raises(InvalidTransition), transaction.atomic():
        lifecycle.transition(stale, State.REBOOTING)  # legal from running, but it is stopping now
    assert Instance.objects.get(pk=instance.pk).state == State.STOPPING


def test_signal_and_broadcast_after_commit(catalog, tenant, django_capture_on_commit_callbacks):
    from console.instances.signals import instance_state_changed

    seen = []

    def receiver(sender, instance, from_state, to_state, at, **kwargs):
        seen.append((from_state, to_state, at))

    instance_state_changed.connect(receiver)
    try:
        instance = make_instance(catalog, tenant, state=State.RUNNING)
        with (
            django_capture_on_commit_callbacks(execute=False) as callbacks,
            transaction.atomic(),
        ):
            event = lifecycle.transition(instance, State.STOPPING)
        assert seen == []  # nothing before commit
        for callback in callbacks:
            callback()
        assert seen == [(State.RUNNING, State.STOPPING, event.at)]
    finally:
        instance_state_changed.disconnect(receiver)


def test_terminated_sets_terminated_at(catalog, tenant):
    instance = make_instance(catalog, tenant, state=State.TERMINATING)
    with transaction.atomic():
        event = lifecycle.transition(instance, State.TERMINATED)
    instance.refresh_from_db()
    assert instance.terminated_at == event.at
