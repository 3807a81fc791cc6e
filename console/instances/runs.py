"""An instance's runs. A run begins with a start its tenant asks for: its launch, or a start
of the stopped (or failed, or shelved) instance. It stays the same run through whatever the
platform does to it meanwhile: an adoption after its host was silent, a reboot, a resize (live,
restarting on its GPU, or stopping to be placed again), a restart by its restart policy, a
fail-over to a fresh disk. A stop and a start by the tenant begin a new one.

The run's start is the first time it ran after that start (time queued or provisioning is no
part of it): what the idle watch counts a maximum runtime from."""

from datetime import datetime

from django.db.models import F, Q

from console.instances.models import Instance, State

# A run begins at the launch (an instance's first event) and at each start its tenant asks
# for, out of these states; a start the platform makes (``InstanceEvent.continues_run``: a
# restart by the restart policy, a resize placed again, a fail-over), a reboot, an adoption
# and a live resize go on with the run. Billing's one minimum per run is this run's too.
RESTING_STATES = (State.STOPPED, State.FAILED)
STARTS = (State.STARTING, State.PENDING)
RUN_OPENERS = Q(from_state="") | Q(
    from_state__in=RESTING_STATES, to_state__in=STARTS, continues_run=False
)


def opens_run(from_state: str, to_state: str, continues_run: bool) -> bool:
    """Whether an event begins a run (``RUN_OPENERS``)."""
    if not from_state:
        return True
    return from_state in RESTING_STATES and to_state in STARTS and not continues_run


def run_started(instance: Instance) -> datetime | None:
    """When the instance's current run began: the first time it ran at or after its tenant's
    last start (None: it has not run since, or its history has no start)."""
    began = None
    events = (
        instance.events.exclude(from_state=F("to_state"))  # notes change nothing here
        .order_by("-at", "-pk")
        .values_list("from_state", "to_state", "continues_run", "at")
    )
    for from_state, to_state, continues_run, at in events.iterator(chunk_size=200):
        if to_state == State.RUNNING:
            began = at
        if opens_run(from_state, to_state, continues_run):
            return began
    return None
