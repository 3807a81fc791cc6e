"""Signals other parts (billing, metrics) listen to. Who may refuse a launch or hold a
provisioning is not among them: those register in console/instances/hooks.py.

`instance_state_changed(sender=Instance, instance, from_state, to_state, at)` is sent after
the commit of every transition (`from_state` is "" for a new instance), and from running
to running when a running instance took a new spec live (lifecycle.record_live_change).
`at` is when the transition happened as far as billing is concerned: for a host that went
silent it is the host's last heartbeat, not the moment we noticed.

`host_lost(sender=Instance, instance, at)` is sent inside the transaction that fails an
instance over from a silent host: `at` is the host's last heartbeat, where billing ends its
GPU usage whatever was asked meanwhile.

`launching(sender=Instance, instance, volumes)` is sent inside a launch's transaction once the
instance exists, before it is placed: `volumes` is what the launch asked to attach (volumes:
attached now, or refused with a ValidationError on `volumes`).

`terminating(sender=Instance, instance, keep_disk, actor)` is sent inside a terminate's
transaction: its volumes are detached, and with `keep_disk` its own disk becomes a volume
(refused with a ValidationError on `keep_disk`)."""

from django.dispatch import Signal

instance_state_changed = Signal()
host_lost = Signal()
launching = Signal()
terminating = Signal()
