"""/api/v1/tokens/: create (scoped, prefix-confined, expiring), list, revoke; a token creates
no token beyond itself, and revoking it revokes what it created."""

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from accounts import services
from accounts.models import ApiToken
from accounts.roles import Role

pytestmark = pytest.mark.django_db


def bearer(raw: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


def test_create_a_scoped_token_and_use_it(tenant, make_member, token_client):
    member = make_member(tenant, Role.MEMBER)
    expires = timezone.now() + timedelta(days=7)
    response = token_client(member).post(
        "/api/v1/tokens/",
        {
            "name": "ci",
            "scopes": ["instances:read", "instances:launch"],
            "instance_prefix": "ci-",
            "expires_at": expires.isoformat(),
        },
        format="json",
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["scopes"] == ["instances:read", "instances:launch"]
    assert body["instance_prefix"] == "ci-"
    assert body["state"] == "active" and body["user"] == member.user.username
    assert body["token"].startswith("gpc_") and body["prefix"].startswith("gpc_")
    created = bearer(body["token"])
    assert created.get("/api/v1/instances/").status_code == 200
    refused = created.get("/api/v1/tokens/")
    assert refused.status_code == 403 and refused.json()["required_scope"] == "tokens:read"
    assert "token" not in token_client(member).get(f"/api/v1/tokens/{body['id']}/").json()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"scopes": ["instances:fly"]}, "scopes"),
        ({"scopes": []}, "scopes"),
        ({"scopes": "instances:read"}, "scopes"),
        ({"scopes": ["audit:read"]}, "scopes"),  # beyond a member's role
        ({"scopes": ["billing:read"], "instance_prefix": "ci-"}, "scopes"),
        ({"instance_prefix": "c i"}, "instance_prefix"),
        ({"instance_prefix": "x" * 41}, "instance_prefix"),
        ({"expires_at": "yesterday"}, "expires_at"),
        ({"expires_at": "2001-01-01T00:00:00Z"}, "expires_at"),
        ({"name": ""}, "name"),
    ],
)
def test_bad_input_is_a_400_on_its_field(tenant, make_member, token_client, body, field):
    client = token_client(make_member(tenant, Role.MEMBER))
    response = client.post("/api/v1/tokens/", {"name": "t", **body}, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()["errors"]


def test_a_viewer_creates_read_only_tokens_with_read_scopes_only(tenant, make_member, token_client):
    client = token_client(make_member(tenant, Role.VIEWER))
    ok = client.post("/api/v1/tokens/", {"name": "r", "scopes": ["metrics:read"]}, format="json")
    assert ok.status_code == 201 and ok.json()["read_only"] is True
    refused = client.post(
        "/api/v1/tokens/", {"name": "w", "scopes": ["instances:stop"]}, format="json"
    )
    assert refused.status_code == 400
    assert refused.json()["errors"]["scopes"] == ["A read-only token cannot hold instances:stop."]


def test_a_token_creates_no_token_beyond_itself(tenant, make_member):
    member = make_member(tenant, Role.MEMBER)
    parent = services.issue_token(
        member.user,
        tenant,
        "parent",
        timezone.now() + timedelta(days=1),
        scopes=["tokens:write", "instances:read"],
        instance_prefix="ci-",
    )
    client = bearer(parent.raw)
    wider = client.post(
        "/api/v1/tokens/", {"name": "c", "scopes": ["instances:stop"], "instance_prefix": "ci-"},
        format="json",
    )  # fmt: skip
    assert wider.json()["errors"]["scopes"] == [
        "This token cannot grant what it lacks: instances:stop."
    ]
    outside = client.post(
        "/api/v1/tokens/", {"name": "c", "scopes": ["instances:read"], "instance_prefix": "c"},
        format="json",
    )  # fmt: skip
    assert "instance_prefix" in outside.json()["errors"]
    later = client.post(
        "/api/v1/tokens/",
        {
            "name": "c",
            "scopes": ["instances:read"],
            "instance_prefix": "ci-a-",
            "expires_at": (timezone.now() + timedelta(days=30)).isoformat(),
        },
        format="json",
    )
    assert "expires_at" in later.json()["errors"]
    child = client.post(
        "/api/v1/tokens/", {"name": "c", "instance_prefix": "ci-a-"}, format="json"
    ).json()
    assert child["scopes"] == ["tokens:write", "instances:read"]  # unnamed: the parent's
    assert child["expires_at"] is not None
    assert ApiToken.objects.get(pk=child["id"]).issued_by_id == parent.token.pk
    services.revoke_token(parent.token)
    assert ApiToken.objects.get(pk=child["id"]).is_revoked
    response = bearer(child["token"]).get("/api/v1/instances/")
    assert response.status_code == 401 and response.json()["code"] == "token_revoked"


def test_list_and_revoke_by_role(tenant, other_tenant, make_member, token_client):
    admin, member = make_member(tenant, Role.ADMIN), make_member(tenant, Role.MEMBER)
    mine = services.issue_token(member.user, tenant, "mine").token
    theirs = services.issue_token(admin.user, tenant, "theirs").token
    foreign = services.issue_token(make_member(other_tenant).user, other_tenant, "x").token
    member_client = token_client(member)
    names = {row["name"] for row in member_client.get("/api/v1/tokens/").json()["results"]}
    assert names == {"mine", "test"}
    assert member_client.post(f"/api/v1/tokens/{theirs.pk}/revoke/").status_code == 404
    assert member_client.post(f"/api/v1/tokens/{foreign.pk}/revoke/").status_code == 404
    admin_client = token_client(admin)
    names = {row["name"] for row in admin_client.get("/api/v1/tokens/").json()["results"]}
    assert names == {"mine", "theirs", "test"}
    revoked = admin_client.post(f"/api/v1/tokens/{mine.pk}/revoke/")
    assert revoked.status_code == 200 and revoked.json()["state"] == "revoked"
    again = admin_client.post(f"/api/v1/tokens/{mine.pk}/revoke/")
    assert again.json()["revoked_at"] == revoked.json()["revoked_at"]
    foreign.refresh_from_db()
    assert not foreign.is_revoked
