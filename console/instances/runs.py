"""An instance's runs. A run begins with a start its tenant asks for: its launch, or a start
of the stopped (or failed, or shelved) instance. It stays the same run through whatever the
platform does to it meanwhile: an adoption after its host was silent, a reboot, a resize (live,
restarting on its GPU, or stopping to be placed again), a restart by its restart policy, a
fail-over to a fresh disk. A stop and a start by the tenant begin a new one.

The run's start is the first time it ran after that start (time queued or provisioning is no
part of it): what the idle watch counts a maximum runtime from."""

from datetime import datetime

from django.db.models import F

from console.instances.lifecycle import SYSTEM
from console.instances.models import Instance, State

# The states a start leaves, and those it goes to (placed, or queued while nothing fits).
STARTS_FROM = frozenset({State.STOPPED, State.FAILED})
STARTS_TO = frozenset({State.STARTING, State.PENDING})


def begins_run(from_state: str, to_state: str, actor_label: str) -> bool:
    """Whether an event (its states and who made it) is a start its tenant asked for: the
    instance's first event (its launch), or a start made by a person; the platform's own
    starts (restart policy, resize, fail-over) are made by the system and continue the run."""
    if not from_state:
        return True
    return from_state in STARTS_FROM and to_state in STARTS_TO and actor_label != SYSTEM


def run_started(instance: Instance) -> datetime | None:
    """When the instance's current run began: the first time it ran at or after its tenant's
    last start (None: it has not run since, or its history has no start)."""
    began = None
    events = (
        instance.events.exclude(from_state=F("to_state"))  # notes change nothing here
        .order_by("-at", "-pk")
        .values_list("from_state", "to_state", "actor_label", "at")
    )
    for from_state, to_state, actor_label, at in events.iterator(chunk_size=200):
        if to_state == State.RUNNING:
            began = at
        if begins_run(from_state, to_state, actor_label):
            return began
    return None
