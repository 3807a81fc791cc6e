"""REST API: /api/v1/instances/ — create, list, filter, paginate, actions, events, errors,
and who may do what."""

import re
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from accounts.models import Quota
from accounts.roles import Role
from console.catalog.models import Mode
from console.fleet.models import Host
from console.instances import outcomes, services
from console.instances.models import State
from tests.factories import ImageFactory, SpecFactory
from tests.instances.helpers import make_instance

pytestmark = pytest.mark.usefixtures("no_tasks", "prepared_queries")
URL = "/api/v1/instances/"


@pytest.fixture
def client(member, token_client):
    return token_client(member)


def body(**overrides):
    return {"name": "trainer", "spec": "a100-quarter", "image": "pytorch-2.5-cuda12.4", **overrides}


class TestCreate:
    def test_launch(self, client, catalog):
        catalog.host(gpus=1, mode=Mode.SHARED)
        response = client.post(URL, body(region="local-1"), format="json")
        assert response.status_code == 202, response.data
        data = response.json()
        assert {k: data[k] for k in ("name", "state", "spec", "image", "region")} == {
            "name": "trainer",
            "state": "provisioning",
            "spec": "a100-quarter",
            "image": "pytorch-2.5-cuda12.4",
            "region": "local-1",
        }
        for key in ("id", "created_at", "state_reason", "actions"):
            assert key in data
        assert data["gpu_equivalents"] == "0.25"
        assert data["placement"] is None  # tenants do not see hosts

    def test_queued(self, client, catalog):
        catalog.host(gpus=1, mode=Mode.SHARED, status=Host.Status.CORDONED)
        data = client.post(URL, body(), format="json").json()
        assert data["state"] == "pending"
        assert data["state_reason"].startswith("Waiting for capacity")

    @pytest.mark.parametrize(
        "overrides, field",
        [
            ({"name": "Bad Name"}, "name"),
            ({"disk_gib": 10}, "disk_gib"),  # less than the spec's 50 GiB
            ({"spec": "no-such-spec"}, "spec"),
            ({"image": "no-such-image"}, "image"),
            ({"region": "mars-1"}, "region"),
        ],
    )
    def test_field_errors(self, client, catalog, overrides, field):
        response = client.post(URL, body(**overrides), format="json")
        assert response.status_code == 400
        assert response.json()["code"] == "invalid"
        assert field in response.json()["errors"]

    def test_missing_fields(self, client, catalog):
        response = client.post(URL, {}, format="json")
        assert response.status_code == 400
        assert set(response.json()["errors"]) == {"spec"}  # a name and an image have defaults

    def test_only_a_spec_gets_a_generated_name_the_default_image_and_the_specs_disk(
        self, client, catalog
    ):
        catalog.host(gpus=1, mode=Mode.SHARED)
        ImageFactory(name="aaa-first", reference="docker.io/library/python:3.12")
        ImageFactory(name="000-retired", reference="docker.io/library/python:3.11", active=False)
        response = client.post(URL, {"spec": "a100-quarter"}, format="json")
        assert response.status_code == 202, response.data
        data = response.json()
        assert re.fullmatch(r"a100-quarter-[a-z]+-[a-z]+", data["name"]), data["name"]
        assert data["image"] == "aaa-first"  # the first active one, as the form preselects
        assert data["disk"]["size_gib"] == 50
        again = client.post(URL, {"spec": "a100-quarter", "name": ""}, format="json").json()
        assert again["name"].startswith("a100-quarter-") and again["name"] != data["name"]

    def test_a_bigger_disk_and_a_spec_code_with_a_dot(self, client, catalog):
        catalog.host(gpus=1, mode=Mode.MIG)
        SpecFactory(
            code="a100-1g.10gb", mode=Mode.MIG, milli=None, gpu_model=catalog.a100,
            mig_profile=catalog.mig1g.mig_profile, gpu_memory_mib=9984, disk_gib=50,
        )  # fmt: skip
        response = client.post(URL, {"spec": "a100-1g.10gb", "disk_gib": 120}, format="json")
        assert response.status_code == 202, response.data
        assert response.json()["disk"]["size_gib"] == 120
        assert re.fullmatch(r"a100-1g-10gb-[a-z]+-[a-z]+", response.json()["name"])

    def test_an_unknown_spec_lists_the_specs_there_are(self, client, catalog):
        response = client.post(URL, body(spec="nope"), format="json")
        assert response.status_code == 400
        assert response.json()["errors"]["spec"] == [
            "No spec nope. Specs: a100-1g10gb, a100-1x, a100-2x, a100-3g40gb, a100-half, "
            "a100-quarter (GET /api/v1/specs/ describes them)."
        ]

    def test_quota_exceeded(self, client, catalog, tenant):
        catalog.cordoned()
        Quota.objects.filter(tenant=tenant).update(gpu_quota=Decimal("0.25"))
        assert client.post(URL, body(name="a"), format="json").status_code == 202
        response = client.post(URL, body(name="b"), format="json")
        assert response.status_code == 409
        assert response.json()["code"] == "quota_exceeded"
        assert "0.25" in response.json()["detail"]


class TestReadAndFilter:
    def test_list_filter_paginate(self, client, catalog, tenant, other_tenant):
        for i in range(5):
            make_instance(catalog, tenant, state=State.RUNNING, name=f"run-{i}")
        make_instance(catalog, tenant, state=State.STOPPED, name="parked")
        make_instance(catalog, other_tenant, state=State.RUNNING, name="theirs")
        data = client.get(URL).json()
        assert data["count"] == 6
        assert "theirs" not in {i["name"] for i in data["results"]}
        stopped = client.get(URL, {"state": "stopped"}).json()
        assert [i["name"] for i in stopped["results"]] == ["parked"]
        both = client.get(URL, {"state": "stopped,running"}).json()
        assert both["count"] == 6
        page = client.get(URL, {"limit": 2, "offset": 2}).json()
        assert (
            page["count"] == 6 and len(page["results"]) == 2 and page["next"] and page["previous"]
        )
        bad = client.get(URL, {"state": "sleeping"})
        assert bad.status_code == 400 and "state" in bad.json()["errors"]

    def test_list_query_count_does_not_grow(self, client, catalog, tenant):
        make_instance(catalog, tenant, state=State.RUNNING, name="a")
        client.get(URL)  # the token's first use writes last_used_at
        with CaptureQueriesContext(connection) as few:
            client.get(URL)
        for i in range(10):
            make_instance(catalog, tenant, state=State.RUNNING, name=f"more-{i}")
        with CaptureQueriesContext(connection) as many:
            client.get(URL)
        assert len(many) == len(few)

    def test_detail_and_events(self, client, catalog, tenant):
        catalog.host(gpus=1, mode=Mode.SHARED)
        created = client.post(URL, body(), format="json").json()
        detail = client.get(f"{URL}{created['id']}/").json()
        assert detail["name"] == "trainer"
        events = client.get(f"{URL}{created['id']}/events/").json()
        assert [(e["from_state"], e["to_state"]) for e in events["results"]] == [
            ("", "pending"),
            ("pending", "provisioning"),
        ]
        assert events["results"][0]["actor"] == "mia"

    def test_another_tenants_instance_is_not_found(self, client, catalog, other_tenant):
        theirs = make_instance(catalog, other_tenant, state=State.RUNNING)
        assert client.get(f"{URL}{theirs.pk}/").status_code == 404
        assert client.get(f"{URL}{theirs.pk}/events/").status_code == 404
        response = client.post(f"{URL}{theirs.pk}/stop/")
        assert response.status_code == 404
        assert response.json()["code"] == "not_found"
        assert client.get(f"{URL}999999/").status_code == 404

    def test_operators_see_the_placement(self, catalog, tenant, make_member, token_client):
        staff = make_member(tenant, Role.MEMBER, username="ops")
        staff.user.is_staff = True
        staff.user.save()
        host = catalog.host(gpus=1, mode=Mode.MIG)
        client = token_client(staff)
        created = client.post(URL, body(spec="a100-1g10gb"), format="json").json()
        placement = client.get(f"{URL}{created['id']}/").json()["placement"]
        assert placement["host"] == host.name
        assert placement["gpus"] == [0]
        assert placement["slice"].startswith("MIG 1g.10gb at slot")

    def test_anonymous_is_401(self, catalog):
        assert APIClient().get(URL).status_code == 401


class TestActions:
    def running(self, catalog, tenant):
        catalog.host(gpus=1, mode=Mode.SHARED)
        instance = services.launch_instance(
            tenant, name="box", spec=catalog.quarter, image=catalog.image
        )
        outcomes.mark_running(instance.pk, instance.current_allocation().pk)
        return instance

    def test_stop_start_reboot_resize_terminate(self, client, catalog, tenant):
        instance = self.running(catalog, tenant)
        url = f"{URL}{instance.pk}/"
        response = client.post(url + "reboot/")
        assert response.status_code == 202 and response.json()["state"] == "rebooting"
        outcomes.mark_running(instance.pk, instance.current_allocation().pk)
        response = client.post(url + "resize/", {"spec": "a100-half"}, format="json")
        assert response.status_code == 400  # it restarts: the client must say it may
        assert "restarts it" in response.json()["errors"]["allow_restart"][0]
        assert client.get(url).json()["state"] == "running"
        body = {"spec": "a100-half", "allow_restart": True}
        response = client.post(url + "resize/", body, format="json")
        assert response.status_code == 202
        assert (response.json()["state"], response.json()["spec"]) == ("rebooting", "a100-half")
        outcomes.mark_running(instance.pk, instance.current_allocation().pk)
        response = client.post(url + "stop/")
        assert response.status_code == 202 and response.json()["state"] == "stopping"
        outcomes.finish_stop(instance.pk)
        response = client.post(url + "start/")
        assert response.status_code == 202 and response.json()["state"] == "starting"
        response = client.post(url + "terminate/")
        assert response.status_code == 202 and response.json()["state"] == "terminating"

    def test_invalid_state(self, client, catalog, tenant):
        instance = make_instance(catalog, tenant, state=State.STOPPED)
        response = client.post(f"{URL}{instance.pk}/reboot/")
        assert response.status_code == 409
        assert response.json() == {
            "code": "invalid_state",
            "detail": "Cannot reboot an instance that is stopped.",
        }

    def test_resize_field_errors(self, client, catalog, tenant):
        instance = make_instance(catalog, tenant, state=State.STOPPED)
        response = client.post(f"{URL}{instance.pk}/resize/", {"spec": "nope"}, format="json")
        assert response.status_code == 400
        assert response.json()["errors"]["spec"][0].startswith("No spec nope. Specs: a100-1g10gb")
        same = client.post(f"{URL}{instance.pk}/resize/", {"spec": "a100-quarter"}, format="json")
        assert same.status_code == 400 and "spec" in same.json()["errors"]

    def test_resize_quota(self, client, catalog, tenant):
        Quota.objects.filter(tenant=tenant).update(gpu_quota=Decimal("0.25"))
        instance = self.running(catalog, tenant)
        response = client.post(f"{URL}{instance.pk}/resize/", {"spec": "a100-half"}, format="json")
        assert response.status_code == 409 and response.json()["code"] == "quota_exceeded"


class TestResizeRules:
    def running(self, catalog, tenant):
        instance = services.launch_instance(
            tenant, name="box", spec=catalog.quarter, image=catalog.image
        )
        outcomes.mark_running(instance.pk, instance.current_allocation().pk)
        return instance

    def test_field_errors(self, client, catalog, tenant):
        catalog.host(gpus=1, mode=Mode.SHARED)
        instance = make_instance(catalog, tenant, state=State.STOPPED, disk_gib=100)
        url = f"{URL}{instance.pk}/resize/"
        response = client.post(url, {"spec": "a100-1g10gb"}, format="json")
        assert response.status_code == 400
        assert response.json()["errors"] == {
            "spec": [
                "No host in Local 1 has NVIDIA A100 80GB GPUs in mig slice mode that could "
                "hold A100 MIG 1g.10gb."
            ]
        }
        response = client.post(url, {"spec": "a100-half", "disk_gib": 50}, format="json")
        assert response.status_code == 400
        assert response.json()["errors"] == {
            "disk_gib": ["A disk never shrinks: it is 100 GiB; give 100 or more."]
        }
        for wrong in (0, 10**12):
            response = client.post(url, {"spec": "a100-half", "disk_gib": wrong}, format="json")
            assert response.status_code == 400 and "disk_gib" in response.json()["errors"]
        instance.refresh_from_db()
        assert (instance.spec, instance.disk_gib) == (catalog.quarter, 100)
        response = client.post(url, {"spec": "a100-half", "disk_gib": 150}, format="json")
        assert response.status_code == 202
        assert response.json()["disk"]["size_gib"] == 150

    def test_a_stopping_resize_needs_allow_stop(self, client, catalog, tenant):
        Quota.objects.filter(tenant=tenant).update(gpu_quota=Decimal("8"), max_instances=50)
        catalog.host(gpus=2, mode=Mode.SHARED)
        instance = self.running(catalog, tenant)
        for name, spec in (("f1", catalog.half), ("f2", catalog.quarter)):  # its GPU is full
            services.launch_instance(tenant, name=name, spec=spec, image=catalog.image)
        url = f"{URL}{instance.pk}/resize/"
        for flags in ({}, {"allow_stop": False}, {"allow_restart": True}):
            response = client.post(url, {"spec": "a100-half", **flags}, format="json")
            assert response.status_code == 400 and response.json()["code"] == "invalid"
            assert list(response.json()["errors"]) == ["allow_stop"]
            assert "the resize stops it" in response.json()["errors"]["allow_stop"][0]
        assert client.get(f"{URL}{instance.pk}/").json()["state"] == "running"
        response = client.post(url, {"spec": "a100-half", "allow_stop": True}, format="json")
        assert response.status_code == 202 and response.json()["state"] == "stopping"

    def test_a_restarting_resize_needs_allow_restart(self, client, catalog, tenant):
        catalog.host(gpus=1, mode=Mode.SHARED)
        instance = self.running(catalog, tenant)
        url = f"{URL}{instance.pk}/resize/"
        for flags in ({}, {"allow_restart": False}, {"allow_stop": True}):
            response = client.post(url, {"spec": "a100-half", **flags}, format="json")
            assert response.status_code == 400
            assert response.json()["errors"] == {
                "allow_restart": [
                    "Resizing box to A100 1/2 restarts it on its GPU: every process in it ends "
                    "and it starts again as the new spec; its disk stays."
                ]
            }
        shown = client.get(f"{URL}{instance.pk}/").json()
        assert (shown["state"], shown["spec"]) == ("running", "a100-quarter")

    def test_a_stopped_resize_is_a_note_in_the_events(self, client, catalog, tenant):
        catalog.host(gpus=1, mode=Mode.SHARED)
        instance = make_instance(catalog, tenant, state=State.STOPPED)
        client.post(f"{URL}{instance.pk}/resize/", {"spec": "a100-half"}, format="json")
        events = client.get(f"{URL}{instance.pk}/events/").json()["results"]
        assert [(e["kind"], e["from_state"], e["to_state"]) for e in events] == [
            ("created", "", "stopped"),
            ("note", "stopped", "stopped"),
        ]


ACTIONS = ["stop", "start", "reboot", "terminate", "resize"]
STATE_FOR = {"stop": "running", "start": "stopped", "reboot": "running", "terminate": "running",
             "resize": "stopped"}  # fmt: skip


@pytest.mark.parametrize("role", [Role.VIEWER, Role.MEMBER, Role.ADMIN, Role.OWNER])
@pytest.mark.parametrize("action", ["create", *ACTIONS])
def test_roles(catalog, tenant, make_member, token_client, role, action):
    catalog.host(gpus=1, mode=Mode.SHARED, status=Host.Status.CORDONED)  # a half can run
    client = token_client(make_member(tenant, role))
    if action == "create":
        response = client.post(URL, body(), format="json")
    else:
        instance = make_instance(catalog, tenant, state=STATE_FOR[action])
        data = {"spec": "a100-half"} if action == "resize" else {}
        response = client.post(f"{URL}{instance.pk}/{action}/", data, format="json")
    if role == Role.VIEWER:
        assert response.status_code == 403
        assert response.json()["code"] == "permission_denied"
    else:
        assert response.status_code == 202, response.json()
    assert client.get(URL).status_code == 200  # everyone reads


def test_over_budget_launch_and_start_are_refused(client, catalog, tenant, monkeypatch):
    catalog.cordoned()
    from billing import budgets

    Quota.objects.filter(tenant=tenant).update(
        monthly_budget=Decimal("10"), budget_action=Quota.BudgetAction.STOP
    )
    monkeypatch.setattr(budgets, "month_to_date", lambda tenant, now=None: Decimal("10.5"))
    response = client.post(URL, body(), format="json")
    assert response.status_code == 409
    assert response.json()["code"] == "budget_exceeded"
    stopped = make_instance(catalog, tenant, state=State.STOPPED)
    response = client.post(f"{URL}{stopped.pk}/start/")
    assert (response.status_code, response.json()["code"]) == (409, "budget_exceeded")
    monkeypatch.setattr(budgets, "month_to_date", lambda tenant, now=None: Decimal("1"))
    assert client.post(URL, body(), format="json").status_code == 202
