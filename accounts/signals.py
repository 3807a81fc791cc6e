"""Signals other parts listen to (accounts imports neither console nor billing).

`tenant_suspended(sender=Tenant, tenant)` is sent after the commit of a suspension: the
instances app stops the tenant's running instances (console.instances.suspension)."""

from django.dispatch import Signal

tenant_suspended = Signal()
