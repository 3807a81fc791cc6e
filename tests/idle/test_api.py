"""The idle policies' API: who may set which level, field errors for bad input and for what
would weaken the operator's policy, another tenant's instances are not there."""

from decimal import Decimal

import pytest

from console.idle.models import InstancePolicy, OperatorPolicy, TenantPolicy
from tests.instances.helpers import make_instance

TENANT_URL = "/api/v1/idle-policy/"


@pytest.fixture
def strict(tenant):
    return OperatorPolicy.objects.create(
        tenant=tenant, window_minutes=Decimal(30), threshold_percent=10, action="stop",
        allow_keep_running=False, max_runtime_minutes=Decimal(480),
    )  # fmt: skip


def test_an_admin_sets_the_tenants_default_and_sees_the_operators(admin_client, strict):
    answer = admin_client.put(
        TENANT_URL, {"window_minutes": "20", "threshold_percent": 15}, format="json"
    )
    assert answer.status_code == 200, answer.content
    data = answer.json()
    assert data["policy"]["window_minutes"] == "20.00"
    assert data["policy"]["action"] == "stop"  # left out: the default
    assert data["operator_policy"]["window_minutes"] == "30.00"
    assert TenantPolicy.objects.get().threshold_percent == 15


def test_the_operators_policy_cannot_be_weakened(admin_client, member_client, catalog, tenant,
                                                 strict):  # fmt: skip
    weaker = {
        "window_minutes": "120", "threshold_percent": 5, "action": "notify",
        "allow_keep_running": True, "max_runtime_minutes": "600",
    }  # fmt: skip
    answer = admin_client.put(TENANT_URL, weaker, format="json")
    assert answer.status_code == 400
    errors = answer.json()["errors"]
    assert set(errors) == set(weaker)
    assert "at most 30" in errors["window_minutes"][0]
    assert not TenantPolicy.objects.exists()
    instance = make_instance(catalog, tenant, state="running")
    url = f"/api/v1/instances/{instance.pk}/idle-policy/"
    refused = member_client.put(url, {"window_minutes": "45"}, format="json")
    assert refused.status_code == 400
    assert set(refused.json()["errors"]) == {"window_minutes"}
    # what is left out falls back to the defaults, and the operator's stricter values stay in force
    allowed = member_client.put(url, {"window_minutes": "15"}, format="json")
    assert allowed.status_code == 200, allowed.content
    in_force = allowed.json()["in_force"]
    assert (in_force["window_minutes"], in_force["threshold_percent"]) == ("15.00", 10)
    assert in_force["allow_keep_running"] is False
    assert in_force["max_runtime_minutes"] == "480.00"
    assert "stop when under 10 % GPU" in allowed.json()["summary"]


@pytest.mark.parametrize(
    "body, field",
    [
        ({"window_minutes": "0.01"}, "window_minutes"),
        ({"window_minutes": "abc"}, "window_minutes"),
        ({"threshold_percent": 0}, "threshold_percent"),
        ({"threshold_percent": 101}, "threshold_percent"),
        ({"action": "shelve-it"}, "action"),
        ({"warning_minutes": "-1"}, "warning_minutes"),
        ({"max_runtime_minutes": "99999"}, "max_runtime_minutes"),
        ({"count_ssh": "maybe"}, "count_ssh"),
    ],
)
def test_bad_input_is_a_field_error(admin_client, body, field):
    answer = admin_client.put(TENANT_URL, body, format="json")
    assert answer.status_code == 400
    assert field in answer.json()["errors"]


def test_roles(member_client, viewer_client, catalog, tenant):
    assert viewer_client.get(TENANT_URL).status_code == 200
    assert member_client.put(TENANT_URL, {"window_minutes": "5"}, format="json").status_code == 403
    instance = make_instance(catalog, tenant, state="running")
    url = f"/api/v1/instances/{instance.pk}/idle-policy/"
    assert viewer_client.get(url).status_code == 200
    assert viewer_client.put(url, {"window_minutes": "5"}, format="json").status_code == 403
    assert viewer_client.post(f"/api/v1/instances/{instance.pk}/keep-running/").status_code == 403
    assert member_client.put(url, {"window_minutes": "5"}, format="json").status_code == 200
    assert member_client.delete(url).status_code == 200
    assert not InstancePolicy.objects.exists()


def test_another_tenants_instance_is_not_there(member_client, catalog, other_tenant):
    foreign = make_instance(catalog, other_tenant, state="running")
    for method, path in [
        ("get", "idle-policy/"), ("put", "idle-policy/"), ("delete", "idle-policy/"),
        ("post", "keep-running/"),
    ]:  # fmt: skip
        answer = getattr(member_client, method)(
            f"/api/v1/instances/{foreign.pk}/{path}", {"window_minutes": "5"}, format="json"
        )
        assert answer.status_code == 404, (method, path)
    assert not InstancePolicy.objects.exists()


def test_an_instance_without_a_policy_shows_none(member_client, catalog, tenant):
    instance = make_instance(catalog, tenant, state="running")
    data = member_client.get(f"/api/v1/instances/{instance.pk}/idle-policy/").json()
    assert data["in_force"] is None and data["acts_at"] is None and data["policy"] is None
