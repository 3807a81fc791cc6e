"""A person's action refused for permission, scope, quota or state is recorded once, with its
error code and what it asked (its secrets masked), in the acting tenant's log; reads, invalid
bodies and requests nobody is signed in for are not."""

from decimal import Decimal

import pytest
from rest_framework.test import APIClient

from accounts import services as accounts
from accounts.models import Quota
from console.audit.models import AuditEntry
from console.instances.models import State
from tests.audit.conftest import ADDRESS
from tests.instances.helpers import make_instance

pytestmark = pytest.mark.usefixtures("no_tasks")

SECRET = "hf_the-tenants-own-secret-value"


def the_refusal(**match) -> AuditEntry:
    entries = list(AuditEntry.objects.filter(**match))
    assert len(entries) == 1, [(e.action, e.error_code) for e in AuditEntry.objects.all()]
    return entries[0]


def test_a_viewers_refused_stop(api, viewer, catalog):
    box = make_instance(catalog, viewer.tenant, state=State.RUNNING, name="box")
    client = api(viewer)
    response = client.post(f"/api/v1/instances/{box.pk}/stop/")
    assert response.status_code == 403
    entry = the_refusal()
    assert (entry.action, entry.object_type) == ("instance.stop", "instance")
    assert entry.object_id == str(box.pk)
    assert (entry.error_code, entry.outcome) == ("permission_denied", "refused")
    assert "viewer" in entry.error_message
    assert (entry.tenant_id, entry.user_id, entry.token_id, entry.address) == (
        viewer.tenant_id, viewer.user_id, client.token.pk, ADDRESS,
    )  # fmt: skip
    box.refresh_from_db()
    assert box.state == State.RUNNING


def test_a_scoped_tokens_out_of_scope_call(member, catalog):
    box = make_instance(catalog, member.tenant, state=State.RUNNING)
    issued = accounts.issue_token(member.user, member.tenant, "ci", scopes=["instances:read"])
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {issued.raw}")
    response = client.post(f"/api/v1/instances/{box.pk}/terminate/", {}, format="json")
    assert response.status_code == 403
    entry = the_refusal()
    assert (entry.action, entry.error_code, entry.token_id) == (
        "instance.terminate", "scope_missing", issued.token.pk,
    )  # fmt: skip
    assert entry.actor == f"mia (token ci, gpc_{issued.token.prefix}_…)"


def test_an_over_quota_launch_keeps_no_secret(api, member, catalog, tenant):
    catalog.cordoned()
    Quota.objects.filter(tenant=tenant).update(gpu_quota=Decimal("0"))
    body = {
        "name": "trainer",
        "spec": "a100-quarter",
        "image": catalog.image.name,
        "env": {"SEED": "7", "WANDB_API_KEY": SECRET},
        "secret_env": {"HF_TOKEN": SECRET},
    }
    response = api(member).post("/api/v1/instances/", body, format="json")
    assert response.status_code == 409 and response.json()["code"] == "quota_exceeded"
    entry = the_refusal()
    assert (entry.action, entry.error_code, entry.object_id) == (
        "instance.launch", "quota_exceeded", "",
    )  # fmt: skip
    assert entry.after["name"] == "trainer"
    assert entry.after["env"] == {"SEED": "7", "WANDB_API_KEY": "••••••"}
    assert entry.after["secret_env"] == "••••••"
    assert SECRET not in str(AuditEntry.objects.values().get())


def test_a_stop_of_a_terminated_instance(api, member, catalog):
    box = make_instance(catalog, member.tenant, state=State.TERMINATED)
    response = api(member).post(f"/api/v1/instances/{box.pk}/stop/")
    assert response.status_code == 409
    entry = the_refusal()
    assert (entry.action, entry.error_code) == ("instance.stop", "invalid_state")
    assert entry.error_message == response.json()["detail"]


def test_a_refused_body_of_nul_and_lone_surrogates_is_kept_as_any_database_takes_it(
    api, member, catalog
):
    """PostgreSQL's jsonb refuses \\u0000, and no UTF-8 holds a lone surrogate: the refusal
    is recorded all the same (schemathesis found the 500)."""
    box = make_instance(catalog, member.tenant, state=State.TERMINATED)
    body = '{"a\\u0000\\udb44": ["x\\u0000", "\\ud8a6y"], "keep_disk": true}'
    response = api(member).post(
        f"/api/v1/instances/{box.pk}/terminate/", body, content_type="application/json"
    )
    assert response.status_code == 409
    kept = the_refusal().after
    assert kept == {"a\ufffd?": ["x\ufffd", "?y"], "keep_disk": True}


def test_another_tenants_instance_is_recorded_in_the_actors_tenant(
    api, member, catalog, other_tenant
):
    theirs = make_instance(catalog, other_tenant, state=State.RUNNING)
    assert api(member).post(f"/api/v1/instances/{theirs.pk}/stop/").status_code == 404
    entry = the_refusal()
    assert (entry.tenant_id, entry.error_code) == (member.tenant_id, "not_found")
    assert not AuditEntry.objects.filter(tenant=other_tenant).exists()


def test_a_refusal_outside_an_instance_names_its_route(api, viewer):
    response = api(viewer).post("/api/v1/ssh-keys/", {"name": "k", "public_key": "x"})
    assert response.status_code == 403
    entry = the_refusal()
    assert (entry.action, entry.object_type) == ("sshkey.create", "sshkey")
    assert entry.after == {"name": "k", "public_key": "••••••"}


def test_what_is_not_a_refusal_is_not_recorded(api, member, catalog, client):
    box = make_instance(catalog, member.tenant, state=State.RUNNING)
    member_api = api(member)
    assert member_api.get("/api/v1/instances/999999/").status_code == 404  # a read
    assert member_api.post("/api/v1/instances/", {"name": "No!"}).status_code == 400  # invalid
    assert client.post(f"/api/v1/instances/{box.pk}/stop/").status_code == 401  # nobody
    assert not AuditEntry.objects.exists()


def test_the_api_and_the_page_show_the_outcome(api, admin, viewer, catalog, signed_in):
    box = make_instance(catalog, viewer.tenant, state=State.RUNNING)
    assert api(viewer).post(f"/api/v1/instances/{box.pk}/stop/").status_code == 403
    admin_api = api(admin)
    [shown] = admin_api.get("/api/v1/audit/?outcome=refused").json()["results"]
    assert (shown["action"], shown["outcome"], shown["error_code"]) == (
        "instance.stop", "refused", "permission_denied",
    )  # fmt: skip
    assert admin_api.get("/api/v1/audit/?outcome=done").json()["results"] == []
    page = signed_in(admin).get("/audit/?outcome=refused").content.decode()
    assert "permission_denied" in page and "refused" in page
    csv = b"".join(signed_in(admin).get("/audit/export.csv").streaming_content).decode()
    assert "refused,permission_denied" in csv


# --- the console's pages: the same refusals, the same entries ------------------------------


def test_a_viewers_stop_through_the_page(signed_in, viewer, catalog):
    box = make_instance(catalog, viewer.tenant, state=State.RUNNING, name="box")
    response = signed_in(viewer).post(f"/instances/{box.pk}/stop/", {"confirm": "1"})
    assert response.status_code == 302
    entry = the_refusal()
    assert (entry.action, entry.object_type, entry.object_id) == (
        "instance.stop", "instance", str(box.pk),
    )  # fmt: skip
    assert (entry.error_code, entry.outcome) == ("permission_denied", "refused")
    assert "viewer" in entry.error_message
    assert entry.after == {"confirm": "1"}  # never the CSRF token
    assert (entry.tenant_id, entry.user_id, entry.token_id, entry.address) == (
        viewer.tenant_id, viewer.user_id, None, ADDRESS,
    )  # fmt: skip
    box.refresh_from_db()
    assert box.state == State.RUNNING


def test_a_stop_of_a_terminated_instance_through_the_page(signed_in, member, catalog):
    box = make_instance(catalog, member.tenant, state=State.TERMINATED)
    assert signed_in(member).post(f"/instances/{box.pk}/stop/").status_code == 302
    entry = the_refusal()
    assert (entry.action, entry.error_code, entry.object_id) == (
        "instance.stop", "invalid_state", str(box.pk),
    )  # fmt: skip
    assert "terminated" in entry.error_message


def test_an_over_quota_launch_through_the_page_keeps_no_secret(signed_in, member, catalog, tenant):
    catalog.cordoned()
    Quota.objects.filter(tenant=tenant).update(max_instances=1)
    make_instance(catalog, tenant, state=State.RUNNING)
    form = {
        "name": "trainer",
        "region": "local-1",
        "spec": "a100-quarter",
        "image": catalog.image.name,
        "env": f"SEED=7\nWANDB_API_KEY={SECRET}",
        "secret_env": f"HF_TOKEN={SECRET}",
    }
    page = signed_in(member).post("/instances/launch/", form)
    assert page.status_code == 200 and "quota" in page.content.decode()
    entry = the_refusal()
    assert (entry.action, entry.error_code, entry.object_id) == (
        "instance.launch", "quota_exceeded", "",
    )  # fmt: skip
    assert entry.after["name"] == "trainer"
    assert entry.after["env"] == "SEED=7\nWANDB_API_KEY=••••••"
    assert entry.after["secret_env"] == "••••••"
    assert "csrfmiddlewaretoken" not in entry.after
    assert SECRET not in str(AuditEntry.objects.values().get())


def test_a_post_on_another_tenants_instance_page(signed_in, member, catalog, other_tenant):
    theirs = make_instance(catalog, other_tenant, state=State.RUNNING)
    web = signed_in(member)
    assert web.post(f"/instances/{theirs.pk}/stop/").status_code == 404
    assert web.post(f"/instances/{theirs.pk}/terminate/", {"keep_disk": "1"}).status_code == 404
    assert web.get(f"/instances/{theirs.pk}/").status_code == 404  # a read: not recorded
    entries = AuditEntry.objects.order_by("pk")
    assert [(e.action, e.error_code, e.object_id) for e in entries] == [
        ("instance.stop", "not_found", str(theirs.pk)),
        ("instance.terminate", "not_found", str(theirs.pk)),
    ]
    assert {e.tenant_id for e in entries} == {member.tenant_id}
    theirs.refresh_from_db()
    assert theirs.state == State.RUNNING


def test_what_a_page_does_not_refuse_is_not_recorded(signed_in, member, viewer, catalog):
    box = make_instance(catalog, member.tenant, state=State.RUNNING)
    assert signed_in(viewer).get(f"/instances/{box.pk}/").status_code == 200  # a read
    web = signed_in(member)
    assert web.post("/instances/launch/", {"name": "No!"}).status_code == 200  # not valid
    assert web.post(f"/instances/{box.pk}/resize/", {"spec": "nope"}).status_code == 302
    assert not AuditEntry.objects.exists()
