"""Signals other parts (billing, metrics) listen to.

`instance_state_changed(sender=Instance, instance, from_state, to_state, at)` is sent after
the commit of every transition (`from_state` is "" for a new instance). `at` is when the
transition happened as far as billing is concerned: for a host that went silent it is the
host's last heartbeat, not the moment we noticed."""

from django.dispatch import Signal

instance_state_changed = Signal()
