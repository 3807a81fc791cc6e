"""Launch latency and launch failures, counted as the transitions commit (a receiver of
instance_state_changed, connected by MetricsConfig.ready) into the shared counters
(console.metrics.counters), whichever process makes the transition.

- `gpucloud_instance_launch_seconds`: a histogram of launch requested (the instance's creation)
  → its first `running`.
- `gpucloud_instance_launch_failures_total{reason}`: instances that failed before they ever
  ran, by the code of their state reason (`image_pull_failed`, `no_capacity` …; `other` for a
  reason that is a sentence)."""

import logging

from console.instances.models import InstanceEvent, State
from console.metrics import counters

# States a launch passes through before its first run.
_LAUNCHING = frozenset({State.PENDING, State.PROVISIONING})

log = logging.getLogger(__name__)


def _ran_before(instance, to_state: str) -> bool:
    """Whether the instance was running before this transition (this transition's own event,
    already committed, aside)."""
    ran = InstanceEvent.objects.filter(instance=instance, to_state=State.RUNNING).exclude(
        from_state=State.RUNNING
    )
    return ran.count() > (1 if to_state == State.RUNNING else 0)


def on_state_changed(sender, instance, from_state, to_state, at, **kwargs) -> None:
    # Billing's receiver of the same signal must run whatever happens to a count.
    try:
        _count(instance, from_state, to_state, at)
    except Exception:
        log.warning("could not count the launch of instance %s", instance.pk, exc_info=True)


def _count(instance, from_state: str, to_state: str, at) -> None:
    launched = from_state == State.PROVISIONING and to_state == State.RUNNING
    failed = from_state in _LAUNCHING and to_state == State.FAILED
    if not (launched or failed) or _ran_before(instance, to_state):
        return
    if launched:
        seconds = max((at - instance.created_at).total_seconds(), 0.0)
        counters.observe("gpucloud_instance_launch_seconds", {}, seconds)
    else:
        code = instance.state_reason_code or "other"
        counters.count("gpucloud_instance_launch_failures_total", {"reason": code})
