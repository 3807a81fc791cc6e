"""Each change made by a person or a token is recorded once, with its actor, tenant, object,
fields changed and client address, in the change's own transaction."""

from decimal import Decimal

import pytest
from django.db import connection, transaction
from django.forms.models import model_to_dict
from django.test.utils import CaptureQueriesContext

from accounts import services as accounts
from accounts.models import ApiToken, Invitation, Membership, SshKey
from accounts.roles import Role
from billing import services as billing
from billing.models import Invoice
from console.audit.context import acting_as
from console.audit.models import AuditEntry
from console.catalog.models import Region, SpecPrice
from console.instances import services as instances
from console.instances.models import State
from console.instances.reasons import Code, Reason
from tests.audit.conftest import ADDRESS
from tests.billing.conftest import World, at, move
from tests.factories import UserFactory
from tests.instances.helpers import make_instance

pytestmark = pytest.mark.usefixtures("no_tasks")

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl x@y"


def the_entry(**match) -> AuditEntry:
    """The one entry there is (matching `match`)."""
    entries = list(AuditEntry.objects.filter(**match))
    assert len(entries) == 1, [str(e) for e in AuditEntry.objects.all()]
    return entries[0]


# --- instance actions through the API, by a token ------------------------------------------


INSTANCE_ACTIONS = [
    # action, the instance's state before, the request's body, (before, after)
    ("stop", State.RUNNING, None, ({"state": "running"}, {"state": "stopping"})),
    ("start", State.STOPPED, None, ({"state": "stopped"}, {"state": "starting"})),
    ("reboot", State.RUNNING, None, ({"state": "running"}, {"state": "rebooting"})),
    ("terminate", State.STOPPED, None, ({"state": "stopped"}, {"state": "terminating"})),
    (
        "resize",
        State.STOPPED,
        {"spec": "a100-half"},
        ({"spec": "a100-quarter"}, {"spec": "a100-half"}),
    ),
]


@pytest.mark.parametrize(("action", "state", "body", "changes"), INSTANCE_ACTIONS)
def test_instance_action_by_a_token(api, member, catalog, action, state, body, changes):
    catalog.host(gpus=1)
    box = make_instance(catalog, member.tenant, state=state, name="box")
    client = api(member)
    response = client.post(f"/api/v1/instances/{box.pk}/{action}/", body, format="json")
    assert response.status_code == 202, response.content
    entry = the_entry(action=f"instance.{action}")
    assert (entry.tenant_id, entry.user_id, entry.token_id) == (
        member.tenant_id, member.user_id, client.token.pk,
    )  # fmt: skip
    assert entry.actor == f"mia (token test, gpc_{client.token.prefix}_…)"
    assert (entry.object_type, entry.object_id, entry.address) == ("instance", str(box.pk), ADDRESS)
    assert entry.object_repr.startswith("box")
    assert (entry.before, entry.after) == changes


def test_launch_by_a_token(api, member, catalog):
    catalog.host(gpus=1)
    client = api(member)
    body = {"name": "trainer", "spec": "a100-quarter", "image": catalog.image.name}
    response = client.post("/api/v1/instances/", body, format="json")
    assert response.status_code == 202, response.content
    entry = the_entry(action="instance.launch")
    assert entry.token_id == client.token.pk and entry.object_id == str(response.json()["id"])
    assert entry.before == {}
    assert entry.after == {
        "name": "trainer",
        "spec": "a100-quarter",
        "image": catalog.image.name,
        "region": "local-1",
        "disk_gib": 50,
        "state": "provisioning",
    }


def test_a_refused_action_records_its_refusal_only(api, member, catalog):
    box = make_instance(catalog, member.tenant, state=State.STOPPED)
    response = api(member).post(f"/api/v1/instances/{box.pk}/stop/")
    assert response.status_code == 409
    assert the_entry().error_code == "invalid_state"  # its refusal's only (test_refusals.py)


def test_one_insert_per_action(api, member, catalog):
    box = make_instance(catalog, member.tenant, state=State.RUNNING)
    client = api(member)
    with CaptureQueriesContext(connection) as queries:
        assert client.post(f"/api/v1/instances/{box.pk}/stop/").status_code == 202
    inserts = [q["sql"] for q in queries if q["sql"].startswith('INSERT INTO "audit_')]
    assert len(inserts) == 1


# --- through the console, signed in --------------------------------------------------------


def test_instance_action_in_the_console(signed_in, member, catalog):
    box = make_instance(catalog, member.tenant, state=State.RUNNING)
    response = signed_in(member).post(f"/instances/{box.pk}/reboot/", {"confirm": "1"})
    assert response.status_code == 302
    entry = the_entry(action="instance.reboot")
    assert (entry.user_id, entry.token_id, entry.actor) == (member.user_id, None, "mia")
    assert entry.address == ADDRESS and entry.tenant_id == member.tenant_id


def test_members_roles_and_invitations(signed_in, admin, member):
    client = signed_in(admin)
    client.post("/members/", {"email": "new@example.com", "role": "member"})
    invitation = Invitation.objects.get()
    entry = the_entry(action="invitation.create")
    assert entry.after["email"] == "new@example.com" and "token_hash" not in entry.after
    client.post(f"/members/invitations/{invitation.pk}/revoke/")
    assert the_entry(action="invitation.revoke").after.keys() == {"revoked_at"}
    client.post(f"/members/{member.pk}/role/", {"role": "viewer"})
    entry = the_entry(action="membership.update")
    assert (entry.before, entry.after) == ({"role": "member"}, {"role": "viewer"})
    assert (entry.actor, entry.tenant_id, entry.object_id) == (
        "ada",
        admin.tenant_id,
        str(member.pk),
    )
    client.post(f"/members/{member.pk}/remove/")
    entry = the_entry(action="membership.delete")
    assert entry.before["role"] == "viewer" and entry.after == {}
    assert not Membership.objects.filter(pk=member.pk).exists()
    assert entry.address == ADDRESS


def test_tokens_issued_and_revoked(signed_in, member):
    client = signed_in(member)
    client.post("/tokens/", {"name": "ci", "expires_in_days": "30"})
    token = ApiToken.objects.get(name="ci")
    entry = the_entry(action="apitoken.create")
    assert entry.after["name"] == "ci" and "token_hash" not in entry.after
    assert (entry.object_id, entry.tenant_id) == (str(token.pk), member.tenant_id)
    client.post(f"/tokens/{token.pk}/revoke/")
    entry = the_entry(action="apitoken.revoke")
    assert entry.actor == "mia" and entry.after["revoked_at"]


def test_ssh_keys_by_a_token(api, member):
    client = api(member)
    response = client.post("/api/v1/ssh-keys/", {"name": "laptop", "public_key": KEY})
    assert response.status_code == 201, response.content
    entry = the_entry(action="sshkey.create")
    assert entry.token_id == client.token.pk and entry.tenant_id == member.tenant_id
    assert entry.after["name"] == "laptop" and "public_key" not in entry.after
    assert client.delete("/api/v1/ssh-keys/laptop/").status_code == 204
    entry = the_entry(action="sshkey.delete")
    assert entry.before["fingerprint"].startswith("SHA256:") and not SshKey.objects.exists()


def test_budget_set_by_the_owner(signed_in, owner):
    client = signed_in(owner)
    response = client.post(
        "/billing/usage/", {"budget-monthly_budget": "250.00", "budget-budget_action": "stop"}
    )
    assert response.status_code == 302
    entry = the_entry(action="quota.update")
    assert entry.before == {"monthly_budget": None, "budget_action": "alert"}
    assert entry.after == {"monthly_budget": "250.00", "budget_action": "stop"}
    assert (entry.actor, entry.tenant_id) == ("olga", owner.tenant_id)


# --- operators: the admin, the fleet pages ---------------------------------------------------


@pytest.fixture
def operator(db):
    return UserFactory(username="root", is_staff=True, is_superuser=True)


@pytest.fixture
def operator_client(operator):
    from django.test import Client

    client = Client(REMOTE_ADDR=ADDRESS)
    client.force_login(operator)
    return client


def test_catalog_in_the_admin(operator_client):
    client = operator_client
    form = model_to_dict(Region(code="eu-1", name="Europe 1"), exclude=["id"])
    response = client.post("/admin/catalog/region/add/", form)
    assert response.status_code == 302, response.content
    region = Region.objects.get(code="eu-1")
    entry = the_entry(action="region.create")
    assert (entry.after["code"], entry.after["name"], entry.before) == ("eu-1", "Europe 1", {})
    assert (entry.actor, entry.tenant_id, entry.address) == ("root", None, ADDRESS)
    client.post(f"/admin/catalog/region/{region.pk}/change/", {**form, "name": "Paris"})
    entry = the_entry(action="region.update")
    assert (entry.before, entry.after) == ({"name": "Europe 1"}, {"name": "Paris"})
    client.post(f"/admin/catalog/region/{region.pk}/delete/", {"post": "yes"})
    assert the_entry(action="region.delete").before["name"] == "Paris"


def test_prices_and_specs(operator, catalog):
    with transaction.atomic(), acting_as(operator, address=ADDRESS):
        price = SpecPrice.objects.create(spec=catalog.quarter, price_per_hour=Decimal("1.1000"))
        catalog.quarter.active = False
        catalog.quarter.save()
    entry = the_entry(action="specprice.create")
    assert entry.after["price_per_hour"] == "1.1000" and entry.object_id == str(price.pk)
    entry = the_entry(action="spec.update")
    assert (entry.before, entry.after) == ({"active": True}, {"active": False})
    assert (entry.actor, entry.address) == ("root", ADDRESS)


def test_host_maintenance(operator_client, catalog):
    host = catalog.host(gpus=1)
    response = operator_client.post(
        f"/fleet/hosts/{host.pk}/status/", {"status": "maintenance", "note": "new PSU"}
    )
    assert response.status_code == 302
    entry = the_entry(action="host.set_status")
    assert entry.before == {"admin_status": "active", "status": "active", "operator_note": ""}
    assert entry.after == {
        "admin_status": "maintenance",
        "status": "maintenance",
        "operator_note": "new PSU",
    }
    assert (entry.actor, entry.tenant_id, entry.address) == ("root", None, ADDRESS)


def test_tenant_suspended_in_the_admin(operator_client, tenant):
    operator_client.post(
        "/admin/accounts/tenant/", {"action": "suspend", "_selected_action": [tenant.pk]}
    )
    entry = the_entry(action="tenant.update")
    assert entry.before["status"] == "active" and entry.after["status"] == "suspended"
    assert entry.tenant_id == tenant.pk


def test_credit_granted_in_the_admin(operator_client, tenant):
    response = operator_client.post(
        "/admin/billing/creditgrant/add/",
        {"tenant": tenant.pk, "kind": "promotional", "amount": "25.00", "description": "launch"},
    )
    assert response.status_code == 302
    entry = the_entry(action="creditgrant.grant")
    assert entry.after["amount"] == "25.00" and entry.tenant_id == tenant.pk
    assert entry.actor == "root"


@pytest.fixture
def issued(tenant):
    """An issued invoice of the tenant for March 2026."""
    world = World()
    box = world.running(tenant, at(2026, 3, 3, 8))
    move(box, State.TERMINATING, at(2026, 3, 3, 9))
    billing.run_meter(at(2026, 3, 4))
    billing.finalize_month(at(2026, 3, 1).date(), now=at(2026, 4, 1, 2))
    return Invoice.objects.get(tenant=tenant)


@pytest.mark.parametrize(
    ("action", "before", "after"),
    [
        ("mark_paid", {"status": "finalized"}, {"status": "paid"}),
        ("void", {"status": "finalized"}, {"status": "void", "credit_note": "CN-2026-000001"}),
    ],
)
def test_invoices_in_the_admin(operator_client, issued, action, before, after):
    operator_client.post(
        "/admin/billing/invoice/", {"action": action, "_selected_action": [issued.pk]}
    )
    entry = the_entry(action=f"invoice.{action}")
    assert entry.before == before
    assert {k: entry.after[k] for k in after} == after
    assert (entry.object_id, entry.tenant_id, entry.actor) == (
        str(issued.pk),
        issued.tenant_id,
        "root",
    )


def test_issuing_is_recorded_once_as_the_system(issued):
    billing.finalize_month(at(2026, 3, 1).date(), now=at(2026, 4, 1, 3))  # again: nothing new
    entry = the_entry(action="invoice.issue")
    assert (entry.actor, entry.object_id, entry.tenant_id) == (
        "system",
        str(issued.pk),
        issued.tenant_id,
    )
    assert entry.before == {"status": "draft"}
    assert entry.after == {
        "status": "finalized",
        "number": issued.number,
        "total": str(issued.total),
    }


# --- what is not recorded, and what is recorded as the system --------------------------------


def test_the_system_is_the_actor_of_a_task(member, catalog):
    box = make_instance(catalog, member.tenant, state=State.RUNNING)
    instances.stop_instance(box, reason=Reason(Code.BUDGET_STOPPED))
    entry = the_entry(action="instance.stop")
    assert (entry.actor, entry.user_id, entry.token_id, entry.address) == (
        "system", None, None, None,
    )  # fmt: skip


def test_rows_the_system_saves_are_not_recorded(catalog):
    Region.objects.create(code="eu-2", name="Europe 2")
    catalog.quarter.active = False
    catalog.quarter.save()
    assert not AuditEntry.objects.exists()


def test_saved_unchanged_records_nothing(operator, catalog):
    with transaction.atomic(), acting_as(operator):
        catalog.region.save()
    assert not AuditEntry.objects.exists()


# --- a change rolled back leaves no entry -----------------------------------------------------


class Boom(Exception):
    pass


def test_rolled_back_action_leaves_no_entry(member, catalog):
    box = make_instance(catalog, member.tenant, state=State.RUNNING)
    with pytest.raises(Boom), transaction.atomic(), acting_as(member.user):
        instances.stop_instance(box)
        assert AuditEntry.objects.count() == 1  # written in the change's transaction
        raise Boom
    box.refresh_from_db()
    assert box.state == State.RUNNING and not AuditEntry.objects.exists()


def test_rolled_back_captured_change_leaves_no_entry(admin, member):
    with pytest.raises(Boom), transaction.atomic(), acting_as(admin.user):
        accounts.change_role(member, Role.VIEWER)
        assert AuditEntry.objects.count() == 1
        raise Boom
    member.refresh_from_db()
    assert member.role == Role.MEMBER and not AuditEntry.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_recording_outside_a_transaction_is_refused(member, catalog):
    from console.audit import recorder

    box = make_instance(catalog, member.tenant)
    with pytest.raises(recorder.OutsideTransaction):
        recorder.record("instance.stop", box)


def test_idle_policy_and_notification_endpoint_by_a_token(api, admin, settings):
    settings.NOTIFICATIONS_ALLOW_PRIVATE_ADDRESSES = True
    client = api(admin)
    answer = client.put(
        "/api/v1/idle-policy/", {"window_minutes": "20", "threshold_percent": 15}, format="json"
    )
    assert answer.status_code == 200, answer.content
    entry = the_entry(action="tenantpolicy.create")
    assert entry.after["threshold_percent"] == 15 and entry.tenant_id == admin.tenant_id
    assert entry.token_id == client.token.pk
    hook = "https://hooks.slack.test/services/T000/B000/secret-part"
    answer = client.post(
        "/api/v1/notifications/endpoints/",
        {"name": "slack", "channel": "slack", "target": hook, "kinds": ["invoice.issued"]},
        format="json",
    )
    assert answer.status_code == 201, answer.content
    entry = the_entry(action="endpoint.create")
    assert entry.after["name"] == "slack" and entry.tenant_id == admin.tenant_id
    assert "secret-part" not in str(entry.after) and "secret_sealed" not in entry.after
