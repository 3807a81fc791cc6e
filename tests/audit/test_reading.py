"""Who reads the audit log, how they narrow it, its CSV, and that nothing can change it."""

import csv
import io
from datetime import UTC, datetime

import pytest
from django.core.exceptions import PermissionDenied
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from accounts.roles import Role
from console.audit.models import AuditEntry
from tests.factories import UserFactory

URL = "/api/v1/audit/"


def entry(tenant, action="instance.stop", actor="mia", when=None, **fields) -> AuditEntry:
    return AuditEntry.objects.create(
        tenant=tenant,
        actor=actor,
        action=action,
        object_type=action.split(".")[0],
        object_id="7",
        object_repr=fields.pop("object_repr", "box"),
        before=fields.pop("before", {"state": "running"}),
        after=fields.pop("after", {"state": "stopping"}),
        address="198.51.100.4",
        at=when or datetime(2026, 5, 10, 12, tzinfo=UTC),
        **fields,
    )


@pytest.fixture
def log(tenant, other_tenant):
    """Three entries of the tenant, one of another tenant."""
    return {
        "stop": entry(tenant),
        "launch": entry(tenant, "instance.launch", when=datetime(2026, 5, 1, tzinfo=UTC)),
        "role": entry(tenant, "membership.update", actor="system"),
        "foreign": entry(other_tenant, "instance.stop", actor="gus"),
    }


def ids(response) -> set[int]:
    assert response.status_code == 200, response.content
    return {row["id"] for row in response.json()["results"]}


# --- who reads what ----------------------------------------------------------------------------


@pytest.mark.parametrize("role", [Role.ADMIN, Role.OWNER])
def test_admins_read_their_tenant(api, make_member, tenant, log, role):
    client = api(make_member(tenant, role))
    assert ids(client.get(URL)) == {log["stop"].pk, log["launch"].pk, log["role"].pk}
    row = client.get(f"{URL}{log['stop'].pk}/").json()
    assert row["tenant"] == "acme" and row["before"] == {"state": "running"}
    assert row["address"] == "198.51.100.4" and row["action"] == "instance.stop"


def test_a_foreign_entry_is_not_there(api, admin, log):
    client = api(admin)
    assert client.get(f"{URL}{log['foreign'].pk}/").status_code == 404
    assert log["foreign"].pk not in ids(client.get(URL, {"tenant": "globex"}))


@pytest.mark.parametrize("role", [Role.VIEWER, Role.MEMBER])
def test_below_admin_is_refused(api, signed_in, make_member, tenant, log, role):
    membership = make_member(tenant, role)
    response = api(membership).get(URL)
    assert response.status_code == 403 and response.json()["code"] == "permission_denied"
    page = signed_in(membership).get("/audit/")
    assert page.status_code == 302  # back, with "your role cannot do this", as other pages
    assert signed_in(membership).get("/audit/export.csv").status_code == 302


def test_operators_read_everyone(log):
    client = Client()
    client.force_login(UserFactory(is_staff=True))
    assert ids(client.get(URL)) == {e.pk for e in log.values()}
    assert ids(client.get(URL, {"tenant": "globex"})) == {log["foreign"].pk}
    admin = Client()
    admin.force_login(UserFactory(is_staff=True, is_superuser=True))
    page = admin.get("/admin/audit/auditentry/")
    assert page.status_code == 200 and "membership.update" in page.content.decode()


# --- filters, pages, CSV ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ({"actor": "system"}, {"role"}),
        ({"actor": "mia"}, {"stop", "launch"}),
        ({"action": "instance.stop"}, {"stop"}),
        ({"action": "instance."}, {"stop", "launch"}),
        ({"object_type": "membership"}, {"role"}),
        ({"since": "2026-05-02"}, {"stop", "role"}),
        ({"until": "2026-05-01"}, {"launch"}),
        ({"since": "2026-05-10", "until": "2026-05-10"}, {"stop", "role"}),
    ],
)
def test_filters(api, signed_in, admin, log, query, expected):
    assert ids(api(admin).get(URL, query)) == {log[name].pk for name in expected}
    page = signed_in(admin).get("/audit/", query)
    assert {e.pk for e in page.context["page"]} == {log[name].pk for name in expected}


def test_a_token_actor_is_found_by_its_user(api, admin, tenant):
    mine = entry(tenant, actor="mia (token ci, gpc_0123abcd_…)")
    entry(tenant, actor="miami")
    assert ids(api(admin).get(URL, {"actor": "mia"})) == {mine.pk}


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"since": "May 1st"}, "since"),
        ({"until": "2026-13-01"}, "until"),
        ({"since": "2026-05-02", "until": "2026-05-01"}, "until"),
        ({"action": "x" * 65}, "action"),
    ],
)
def test_bad_filters_are_field_errors(api, signed_in, admin, log, query, field):
    response = api(admin).get(URL, query)
    assert response.status_code == 400 and field in response.json()["errors"]
    page = signed_in(admin).get("/audit/", query)
    assert page.status_code == 200 and field in page.context["errors"]
    assert list(page.context["page"]) == []


def test_csv(signed_in, admin, tenant, log):
    entry(tenant, "sshkey.create", object_repr="=HYPERLINK(1)", before={}, after={"name": "k"})
    response = signed_in(admin).get("/audit/export.csv", {"action": "sshkey.create"})
    assert response["Content-Type"] == "text/csv"
    assert response["Content-Disposition"].startswith('attachment; filename="audit-acme-')
    rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert len(rows) == 1
    assert rows[0]["object"] == "'=HYPERLINK(1)"  # never a formula in a spreadsheet
    assert (rows[0]["action"], rows[0]["after"], rows[0]["before"]) == (
        "sshkey.create", '{"name": "k"}', "",
    )  # fmt: skip
    everything = b"".join(signed_in(admin).get("/audit/export.csv").streaming_content).decode()
    assert everything.count("\n") == 1 + 4 and "gus" not in everything  # no foreign entry


def test_page_shows_the_changes(signed_in, admin, log):
    html = signed_in(admin).get("/audit/").content.decode()
    assert "state: running → stopping" in html and "gus" not in html


def test_api_is_in_the_schema(client):
    schema = client.get("/api/v1/schema/", HTTP_ACCEPT="application/json").json()
    operation = schema["paths"]["/api/v1/audit/"]["get"]
    names = {parameter["name"] for parameter in operation["parameters"]}
    assert {"actor", "action", "object_type", "since", "until", "limit", "offset"} <= names
    assert set(schema["paths"]["/api/v1/audit/"]) == {"get"}


# --- no extra query per row --------------------------------------------------------------------


def test_queries_do_not_grow_with_rows(api, signed_in, admin, tenant):
    client, browser = api(admin), signed_in(admin)

    def count(get) -> int:
        with CaptureQueriesContext(connection) as queries:
            assert get().status_code == 200
        return len(queries)

    entry(tenant)
    client.get(URL)  # the token's first use is written down once
    few = count(lambda: client.get(URL)), count(lambda: browser.get("/audit/"))
    for _ in range(30):
        entry(tenant, actor="mia (token ci, gpc_0123abcd_…)")
    many = count(lambda: client.get(URL)), count(lambda: browser.get("/audit/"))
    assert many == few


# --- nothing changes it --------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["post", "put", "patch", "delete"])
def test_api_is_read_only(api, admin, log, method):
    client = api(admin)
    url = URL if method == "post" else f"{URL}{log['stop'].pk}/"
    assert getattr(client, method)(url, {"action": "x"}, format="json").status_code == 405
    assert AuditEntry.objects.get(pk=log["stop"].pk).action == "instance.stop"


def test_admin_cannot_add_change_or_delete(log):
    client = Client()
    client.force_login(UserFactory(is_staff=True, is_superuser=True))
    pk = log["stop"].pk
    assert client.get("/admin/audit/auditentry/add/").status_code == 403
    response = client.post(f"/admin/audit/auditentry/{pk}/change/", {"action": "x"})
    assert response.status_code == 403
    assert client.post(f"/admin/audit/auditentry/{pk}/delete/", {"post": "yes"}).status_code == 403
    response = client.post(
        "/admin/audit/auditentry/", {"action": "delete_selected", "_selected_action": [pk]}
    )
    assert AuditEntry.objects.filter(pk=pk).exists()
    assert client.get(f"/admin/audit/auditentry/{pk}/change/").status_code == 200  # read


def test_an_entry_is_never_saved_again_or_deleted(log):
    stop = log["stop"]
    stop.action = "instance.start"
    with pytest.raises(PermissionDenied):
        stop.save()
    with pytest.raises(PermissionDenied):
        stop.delete()
    assert AuditEntry.objects.get(pk=stop.pk).action == "instance.stop"


# --- the client address ----------------------------------------------------------------------


@pytest.mark.parametrize(("proxies", "address"), [(0, "10.0.0.9"), (1, "192.0.2.1")])
def test_forwarded_for_only_behind_a_trusted_proxy(
    api, settings, member, catalog, no_tasks, proxies, address
):
    from tests.instances.helpers import make_instance

    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "NUM_PROXIES": proxies}
    box = make_instance(catalog, member.tenant, state="running")
    client = api(member)
    client.defaults["REMOTE_ADDR"] = "10.0.0.9"
    response = client.post(f"/api/v1/instances/{box.pk}/stop/", HTTP_X_FORWARDED_FOR="192.0.2.1")
    assert response.status_code == 202
    assert AuditEntry.objects.get().address == address
