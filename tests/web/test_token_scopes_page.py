"""The API tokens page creates scoped tokens: checkbox groups of scopes, a name prefix and an
expiry; a scope beyond the role is refused with a message, nothing created."""

import pytest

from accounts import scopes
from accounts.models import ApiToken
from accounts.roles import Role
from tests.web.test_console_pages import login

pytestmark = pytest.mark.django_db


def test_the_page_offers_every_scope_by_group(client, tenant, make_member):
    page = login(client, make_member(tenant, Role.OWNER)).get("/tokens/").content.decode()
    assert 'data-testid="scope-groups"' in page
    for group in scopes.GROUPS:
        assert f"<legend>{group}</legend>" in page
    for scope in scopes.SCOPES:
        assert f'value="{scope.name}"' in page
    assert 'name="instance_prefix"' in page


def test_create_a_scoped_confined_expiring_token(client, tenant, make_member):
    login(client, make_member(tenant, Role.MEMBER))
    created = client.post(
        "/tokens/",
        {
            "name": "ci",
            "expires_in_days": "7",
            "scopes": ["instances:read", "instances:launch", "instances:stop"],
            "instance_prefix": "ci-",
        },
        follow=True,
    )
    token = ApiToken.objects.get(name="ci")
    assert token.scopes == ["instances:read", "instances:launch", "instances:stop"]
    assert token.instance_prefix == "ci-" and token.expires_at is not None
    assert f"gpc_{token.prefix}_".encode() in created.content
    listed = client.get("/tokens/").content.decode()
    assert "instances:read instances:launch instances:stop" in listed
    assert "ci-*" in listed


def test_no_scope_ticked_is_an_unscoped_token(client, tenant, make_member):
    login(client, make_member(tenant, Role.MEMBER))
    client.post("/tokens/", {"name": "all"})
    token = ApiToken.objects.get(name="all")
    assert (token.scopes, token.instance_prefix) == (None, "")


def test_a_scope_beyond_the_role_is_refused(client, tenant, make_member):
    login(client, make_member(tenant, Role.MEMBER))
    page = client.post("/tokens/", {"name": "x", "scopes": ["audit:read"]}, follow=True)
    assert "Your role (member) cannot grant audit:read." in page.content.decode()
    assert not ApiToken.objects.filter(name="x").exists()
