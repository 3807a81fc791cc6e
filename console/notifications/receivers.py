"""The `console.notices.notice` receiver: every notice a producer sends is recorded for the
tenant's subscribed endpoints. It runs in the producer's process after the producer's commit;
a failure here is logged, never raised into the action that sent the notice."""

import logging

from console.notifications import services

log = logging.getLogger(__name__)


def on_notice(sender, tenant, kind, subject=None, text="", data=None, **kwargs) -> None:
    try:
        services.record_notice(tenant, kind, subject=subject, text=text, data=data)
    except Exception:
        log.exception("could not record the %s notice from %s", kind, sender)
