"""A suspended tenant runs nothing (issue 12, finding 11): suspending stops its running and
queued instances (disks kept), none of them starts again until it is reactivated, and the
console says why."""

import pytest

from accounts import services as accounts
from accounts.models import Tenant
from accounts.roles import Role
from console.instances import services
from console.instances.models import Instance, State
from tests.instances.helpers import make_instance

pytestmark = pytest.mark.django_db(transaction=True)


def test_suspension_stops_running_and_queued_instances_and_keeps_the_rest(
    catalog, tenant, other_tenant, no_tasks
):
    running = make_instance(catalog, tenant, state=State.RUNNING)
    queued = make_instance(catalog, tenant, state=State.PENDING)
    stopped = make_instance(catalog, tenant, state=State.STOPPED)
    elsewhere = make_instance(catalog, other_tenant, state=State.RUNNING)
    accounts.set_tenant_status(tenant, Tenant.Status.SUSPENDED)
    states = dict(Instance.objects.values_list("pk", "state"))
    assert states[running.pk] == State.STOPPING
    assert states[queued.pk] == State.STOPPED
    assert states[stopped.pk] == State.STOPPED
    assert states[elsewhere.pk] == State.RUNNING
    assert ("stop", running.pk) in no_tasks  # the agent is asked to stop it; the disk stays


def test_a_suspended_tenants_instance_cannot_start_until_reactivated(catalog, tenant, no_tasks):
    catalog.host(gpus=1)
    instance = make_instance(catalog, tenant, state=State.STOPPED)
    accounts.set_tenant_status(tenant, Tenant.Status.SUSPENDED)
    with pytest.raises(services.InvalidState, match="suspended"):
        services.start_instance(instance)
    assert Instance.objects.get(pk=instance.pk).state == State.STOPPED
    accounts.set_tenant_status(tenant, Tenant.Status.ACTIVE)
    assert services.start_instance(instance).state == State.STARTING


def test_the_console_says_why(client, tenant, make_member):
    client.force_login(make_member(tenant, Role.MEMBER).user)
    accounts.set_tenant_status(tenant, Tenant.Status.SUSPENDED)
    page = client.get("/instances/")
    assert page.status_code == 403
    assert b"running instances were stopped" in page.content
