"""What happened that a tenant may want to hear of: one signal the apps that act send, and the
notifications app (console.notifications) delivers to the tenant's subscribed channels.

``notice.send(sender=<the sending module's name>, tenant=…, kind=…, subject=…, text=…,
data=…)`` after the commit of the change it tells of (``transaction.on_commit``):

- ``kind``: one of ``KINDS`` below.
- ``subject``: the object it is about (an Instance, Invoice, Host, Snapshot …) or None.
- ``text``: one sentence a person reads ("gpu-a stopped: idle for 30 minutes at 0 % GPU").
- ``data``: a JSON-able dict of the figures (ids, reason code, utilisation …).
"""

from django.dispatch import Signal

KINDS = {
    "instance.failed": "An instance failed",
    "instance.idle_warning": "An instance is about to be acted on for being idle",
    "instance.idle_stopped": "An instance was stopped, shelved or terminated for being idle",
    "instance.budget_stopped": "An instance was stopped by the budget",
    "budget.threshold": "Spending crossed a budget threshold",
    "host.maintenance": "A host running your instances went into maintenance",
    "host.engine_down": "The container engine of a host running your instances does not answer",
    "snapshot.done": "A snapshot finished",
    "snapshot.failed": "A snapshot failed",
    "invoice.issued": "An invoice was issued",
}

notice = Signal()
