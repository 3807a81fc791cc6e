"""Signals other parts (billing, metrics) listen to.

`instance_state_changed(sender=Instance, instance, from_state, to_state, at)` is sent after
the commit of every transition (`from_state` is "" for a new instance), and from running
to running when a running instance took a new spec live (lifecycle.record_live_change).
`at` is when the transition happened as far as billing is concerned: for a host that went
silent it is the host's last heartbeat, not the moment we noticed.

`launch_requested(sender=Tenant, tenant)` is sent before a launch, start or resize that asks
for more is committed, inside its transaction: a receiver refuses it by raising a
DomainError (billing: a spent budget). So instances asks the layers above it without
importing them.

`host_lost(sender=Instance, instance, at)` is sent inside the transaction that fails an
instance over from a silent host: `at` is the host's last heartbeat, where billing ends its
GPU usage whatever was asked meanwhile."""

from django.dispatch import Signal

instance_state_changed = Signal()
launch_requested = Signal()
host_lost = Signal()
