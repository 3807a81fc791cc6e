"""Billing listens to instances (connected in ``BillingConfig.ready``)."""

import logging

from billing.metering import end_at_last_heartbeat, record_transition

log = logging.getLogger(__name__)


def on_host_lost(sender, instance, at, **kwargs) -> None:
    """Its host went silent at ``at``: the GPU's usage ends there. Raises, so that the
    failover's transaction does not commit without it."""
    end_at_last_heartbeat(instance, at)


def on_instance_state_changed(sender, instance, from_state, to_state, at, **kwargs) -> None:
    """Open/close the instance's usage segments. Never raises: the signal is sent after the
    transition committed, and a failure here is repaired by the meter from the events."""
    try:
        record_transition(instance, from_state, to_state, at)
    except Exception:
        log.exception(
            "billing could not record %s → %s of instance %s; the meter will repair it",
            from_state,
            to_state,
            getattr(instance, "pk", None),
        )
