"""An instance's life: the legal transitions, in one table, and the one function that moves
an instance from a state to the next (with its event row, its signal and its websocket
message, the last two after commit).

    pending ──► provisioning ──► running ──► stopping ──► stopped ──► starting ──► running
       ▲  └──► stopped             │ ▲                       │  └──► pending (nothing fits)
       │                           ▼ │                       │
       └── (start, nothing fits)  rebooting (reboot, resize in place)
    running ◄──► unreachable (its host silent; adopted back when heard) ──► failed (host lost)
    any live state ──► terminating ──► terminated;   host-touching states ──► failed
    provisioning, starting, rebooting ──► stopping (its tenant suspended)
"""

import logging
from datetime import datetime

from django.db import connection, transaction
from django.utils import timezone

from console import broadcast
from console.errors import DomainError, ErrorCode
from console.instances import reasons
from console.instances.models import Instance, InstanceEvent, State
from console.instances.signals import instance_state_changed
from console.notices import notice

log = logging.getLogger(__name__)

S = State
# Who an event says made it when no person did (the platform: its tasks, agents, policies).
SYSTEM = "system"

TRANSITIONS: dict[str, frozenset[str]] = {
    S.PENDING: frozenset({S.PROVISIONING, S.STOPPED, S.TERMINATING, S.FAILED}),
    S.PROVISIONING: frozenset({S.RUNNING, S.STOPPING, S.TERMINATING, S.FAILED}),
    S.RUNNING: frozenset({S.STOPPING, S.REBOOTING, S.UNREACHABLE, S.TERMINATING, S.FAILED}),
    S.UNREACHABLE: frozenset({S.RUNNING, S.STOPPING, S.TERMINATING, S.FAILED}),
    S.STOPPING: frozenset({S.STOPPED, S.TERMINATING, S.FAILED}),
    S.STOPPED: frozenset({S.STARTING, S.PENDING, S.TERMINATING}),
    S.STARTING: frozenset({S.RUNNING, S.STOPPING, S.TERMINATING, S.FAILED}),
    S.REBOOTING: frozenset({S.RUNNING, S.STOPPING, S.TERMINATING, S.FAILED}),
    S.TERMINATING: frozenset({S.TERMINATED, S.FAILED}),
    S.TERMINATED: frozenset(),
    S.FAILED: frozenset({S.STARTING, S.PENDING, S.TERMINATING}),
}

# What a tenant may ask for, and from which states. The services check these before they
# transition, so that the API can answer 409 invalid_state with a clear message.
ACTIONS: dict[str, frozenset[str]] = {
    "stop": frozenset({S.RUNNING, S.PENDING}),
    "start": frozenset({S.STOPPED, S.FAILED}),
    "reboot": frozenset({S.RUNNING}),
    "resize": frozenset({S.RUNNING, S.STOPPED}),
    "terminate": frozenset(set(State.values) - {S.TERMINATING, S.TERMINATED}),
}

# States in which an instance may wait for a restart (its exit's stop completes first).
RESTART_WAITING = frozenset({S.STOPPING, S.STOPPED, S.FAILED})

# States in which the instance holds (or is getting) a slice on a host.
ON_HOST = frozenset(
    {S.PROVISIONING, S.RUNNING, S.UNREACHABLE, S.STOPPING, S.STARTING, S.REBOOTING, S.TERMINATING}
)


class InvalidTransition(DomainError):
    code = ErrorCode.INVALID_STATE

    def __init__(self, *, from_state: str, to_state: str):
        super().__init__(f"An instance cannot go from {from_state} to {to_state}.")
        self.from_state = from_state
        self.to_state = to_state


def can(from_state: str, to_state: str) -> bool:
    return to_state in TRANSITIONS.get(from_state, frozenset())


def waits_for_restart(state: str, restart_at: datetime | None) -> bool:
    """Whether an instance waits for a restart after its workload ended (restarts.schedule);
    a start, stop or terminate ends the wait."""
    return restart_at is not None and state in RESTART_WAITING


def allowed_actions(state: str, restart_at: datetime | None = None) -> list[str]:
    """What may be asked of an instance in `state`; one that waits for a restart may also be
    stopped (it is then not restarted)."""
    actions = [action for action, states in ACTIONS.items() if state in states]
    if waits_for_restart(state, restart_at) and "stop" not in actions:
        actions.insert(0, "stop")
    return actions


def actor_label(actor) -> str:
    return getattr(actor, "username", None) or SYSTEM


def transition(
    instance: Instance,
    to_state: str,
    *,
    actor=None,
    message: str = "",
    reason: reasons.Reason | None = None,
    at: datetime | None = None,
    continues_run: bool = False,
) -> InstanceEvent:
    """Move `instance` (locked by the caller, inside its transaction) to `to_state`.

    `reason` becomes the instance's reason (cleared when None); `continues_run`: a start
    the platform made (billing's run goes on, InstanceEvent.continues_run). The write is a
    compare-and-swap on the old state, so a caller that works from a stale row fails loudly
    instead of overwriting someone else's transition."""
    if not connection.in_atomic_block:
        raise RuntimeError("transition() runs inside the caller's transaction")
    from_state = instance.state
    if not can(from_state, to_state):
        raise InvalidTransition(from_state=from_state, to_state=to_state)
    now = timezone.now()
    at = at or now
    fields = {"state": to_state, **Instance.reason_fields(reason), "updated_at": now}
    if to_state == S.TERMINATED:
        fields["terminated_at"] = at
    changed = Instance.objects.filter(pk=instance.pk, state=from_state).update(**fields)
    if changed != 1:
        raise InvalidTransition(from_state=from_state, to_state=to_state)
    for name, value in fields.items():
        setattr(instance, name, value)
    event = InstanceEvent.objects.create(
        instance=instance,
        at=at,
        actor=actor if getattr(actor, "pk", None) else None,
        actor_label=actor_label(actor),
        from_state=from_state,
        to_state=to_state,
        message=reasons.shorten(message, 300),
        spec_id=instance.spec_id,
        disk_gib=instance.disk_gib,
        continues_run=continues_run,
    )
    payload = state_payload(instance, from_state, at)
    transaction.on_commit(
        lambda: _announce(instance, from_state, to_state, at, payload), robust=True
    )
    if to_state == S.FAILED:
        failed = failure_notice(instance, payload["instance"]["reason_text"])
        transaction.on_commit(lambda: notice.send(sender=__name__, **failed), robust=True)
    return event


def failure_notice(instance: Instance, reason_text: str) -> dict:
    """The `instance.failed` notice's arguments (console.notices), the reason in words."""
    return {
        "tenant": instance.tenant_id,
        "kind": "instance.failed",
        "subject": instance,
        "text": f"{instance.name} failed: {reason_text or 'no reason was given'}",
        "data": {
            "instance_id": instance.pk,
            "instance_name": instance.name,
            "reason": instance.state_reason,
            "reason_text": reason_text,
        },
    }


def record_created(instance: Instance, *, actor=None, message: str = "") -> InstanceEvent:
    """The first event of an instance: from nothing to its first state."""
    event = InstanceEvent.objects.create(
        instance=instance,
        at=instance.created_at,
        actor=actor if getattr(actor, "pk", None) else None,
        actor_label=actor_label(actor),
        from_state="",
        to_state=instance.state,
        message=reasons.shorten(message, 300),
        spec_id=instance.spec_id,
        disk_gib=instance.disk_gib,
    )
    payload = state_payload(instance, "", instance.created_at)
    transaction.on_commit(
        lambda: _announce(instance, "", instance.state, instance.created_at, payload),
        robust=True,
    )
    return event


def note(
    instance: Instance,
    message: str,
    *,
    actor=None,
    at: datetime | None = None,
    shelved: bool = False,
) -> InstanceEvent:
    """An event that changes no state (a resize of a stopped instance, an ssh session);
    `shelved`: its shelve is done (InstanceEvent.shelved)."""
    return InstanceEvent.objects.create(
        instance=instance,
        at=at or timezone.now(),
        actor=actor if getattr(actor, "pk", None) else None,
        actor_label=actor_label(actor),
        from_state=instance.state,
        to_state=instance.state,
        message=reasons.shorten(message, 300),
        spec_id=instance.spec_id,
        disk_gib=instance.disk_gib,
        shelved=shelved,
    )


def announce_note(
    instance: Instance, message: str, *, actor=None, at: datetime | None = None
) -> InstanceEvent:
    """A note (see `note`) that the tenant's browsers also see live, once it is committed."""
    event = note(instance, message, actor=actor, at=at)
    announce_unchanged(instance, event.at)
    return event


def announce_unchanged(instance: Instance, at: datetime) -> None:
    """Once committed, tell the tenant's browsers of the instance as it is (its state did not
    change; its reason or events did)."""
    payload = state_payload(instance, instance.state, at)
    group = events_group(instance.tenant_id)
    transaction.on_commit(
        lambda: broadcast.group_send(group, {"type": "instance.state", "payload": payload}),
        robust=True,
    )


def record_live_change(instance: Instance, message: str, actor=None) -> InstanceEvent:
    """A new spec the running instance took without a restart (a live resize): a note the
    tenant's browsers see live, and, after commit, the state signal from running to running,
    at which billing rates the rest of the run at the new spec."""
    event = announce_note(instance, message, actor=actor)
    _signal_unchanged(instance, event.at)
    return event


def record_shelved(instance: Instance, message: str) -> InstanceEvent:
    """Its shelve is done (its disk in snapshots, on no host): a note the tenant's browsers
    see live, and, after commit, the state signal from its state to the same, at which
    billing stops billing its disk until it is placed again."""
    event = note(instance, message, shelved=True)
    announce_unchanged(instance, event.at)
    _signal_unchanged(instance, event.at)
    return event


def _signal_unchanged(instance: Instance, at: datetime) -> None:
    """After commit, the state signal from the instance's state to the same at `at`."""
    state = instance.state
    transaction.on_commit(
        lambda: instance_state_changed.send(
            sender=Instance, instance=instance, from_state=state, to_state=state, at=at
        ),
        robust=True,
    )


def events_group(tenant_id: int) -> str:
    """The Channels group of a tenant's /ws/events/ sockets."""
    return f"events.tenant.{tenant_id}"


def state_payload(instance: Instance, from_state: str, at: datetime) -> dict:
    spec = instance.spec
    return {
        "type": "instance.state",
        "instance": {
            "id": instance.pk,
            "name": instance.name,
            "state": instance.state,
            "from_state": from_state,
            "state_reason": instance.state_reason,
            "reason_text": reasons.of_instance(instance),
            "pull_progress": instance.pull_progress or None,
            "spec": spec.code,
            "spec_name": spec.name,
            "region": instance.region.code,
            "at": at.isoformat(),
            "actions": allowed_actions(instance.state, instance.restart_at),
        },
    }


def _announce(instance, from_state, to_state, at, payload) -> None:
    """After commit: tell the tenant's browsers (the group), then billing (the signal). The
    browsers first: billing's receiver writes (a usage segment opens on `running`), and on
    SQLite that write can wait for the lock behind a burst of launches; billing takes its
    time from `at`, so its figures do not depend on when it runs."""
    try:
        broadcast.group_send(
            events_group(instance.tenant_id), {"type": "instance.state", "payload": payload}
        )
    except Exception:  # the database is the truth; a lost live update is not worth a failure
        log.warning("could not broadcast the state of instance %s", instance.pk, exc_info=True)
    instance_state_changed.send(
        sender=Instance, instance=instance, from_state=from_state, to_state=to_state, at=at
    )
