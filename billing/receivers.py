"""Billing listens to instance state changes (connected in ``BillingConfig.ready``)."""

import logging

from billing.metering import record_transition

log = logging.getLogger(__name__)


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
