"""Signals of the fleet that the layers above listen to.

`host_back(sender=Host, host)` is sent after the commit that brings an unreachable host back
(its heartbeats resumed): instances re-drives the launches that waited for it
(console.instances.recovery.redrive_waiting_launches) without waiting for the next beat."""

from django.dispatch import Signal

host_back = Signal()
